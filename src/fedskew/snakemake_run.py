"""Snakemake as a child process of a fedskew command (`run`, `verify`, `reproduce`): its progress, its stop.

`run_snakemake` starts Snakemake in its own process group with its output going to a log file, and follows
it through its job events, which a logger plugin of this project writes as JSON lines into a pipe
(src/snakemake_logger_plugin_fedskew), never through its console text: `Progress` prints one line per progress
step and per finished run (its final accuracy). SIGINT or SIGTERM to the fedskew process stops Snakemake and its
jobs first (`_StopForwarding`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fedskew import metrics, paths


class Progress:
    """Follows a build through Snakemake's job events (`EVENTS_LOGGER`, one JSON object a line) and prints a
    short line for each progress step, for each of `runs` whose training job has finished (method, setting,
    seed, final accuracy), and for each failed job and workflow error.

    A run is reported when a job that has it among its outputs finishes, so runs already up to date are not."""

    def __init__(self, runs: list, root: Path, out=sys.stdout):
        self.runs = {cfg.path(paths.RUN_METRICS).as_posix(): cfg for cfg in runs}
        self.root = root
        self.outputs: dict[int, list[str]] = {}  # each started job's output files, by job id
        self.out = out
        self.started = time.time()

    def feed(self, line: str) -> None:
        """One line of the events file. A line that is not an event is skipped: the build must go on."""
        try:
            event = json.loads(line)
        except ValueError:
            return
        if isinstance(event, dict):
            self.handle(event)

    def handle(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "job_info":
            self.outputs[event.get("jobid")] = event.get("output") or []
        elif kind == "job_finished":
            self.report_trained(self.outputs.pop(event.get("job_id"), []))
        elif kind == "progress":
            done, total = event["done"], event["total"]
            self._print(f"[{time.time() - self.started:5.0f} s] {done} of {total} steps "
                        f"({100 * done // max(total, 1)}%) done")
        elif kind == "job_error":
            logs = ", ".join(event.get("log") or [])
            self._print(f"Error in rule {event.get('rule_name')}, jobid {event.get('jobid')}"
                        + (f"; its log: {logs}" if logs else ""))
        elif kind == "error":  # its opening: the rest is in the end of Snakemake's output, shown on failure
            lines = [text.strip() for text in str(event.get("message") or event.get("exception")).splitlines()]
            lines = [text for text in lines if text] or ["(no message)"]
            self._print(" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])  # "WorkflowError:" says little

    def report_trained(self, outputs: list[str]) -> None:
        """A line for each run a finished job wrote, with its final value of the reported metric (accuracy, by
        design: fedskew.metrics.REPORTED)."""
        reported = metrics.reported()
        for cfg in [self.runs.pop(path) for path in outputs if path in self.runs]:
            try:
                record = json.loads((self.root / cfg.path(paths.RUN_METRICS)).read_text())
                value = reported.scale.shown(record[metrics.reported_key()])
                shown = f"{value:.2f} {reported.scale.unit}".rstrip()
            except (OSError, ValueError, KeyError, TypeError):
                shown = "(metrics unreadable)"
            self._print(f"  trained {cfg.method} on {cfg.dataset}/{cfg.partition} seed {cfg.seed}: "
                        f"final accuracy {shown}")

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)


# The logger plugin that writes Snakemake's job events as JSON lines (src/snakemake_logger_plugin_fedskew;
# Snakemake finds it on the Python path, which _snakemake_env gives src/).
EVENTS_LOGGER = "fedskew"


# How long Snakemake may take to stop its jobs after a stop was forwarded, before its process group is killed.
STOP_GRACE_S = 120.0


class _StopForwarding:
    """While Snakemake runs as a child in its own process group, SIGINT and SIGTERM to this process stop it.

    Either signal is forwarded to the child's process group as SIGINT: Snakemake's Ctrl-C, on which it
    cancels its running jobs (local ones, which are in its group and stop on SIGINT too, keeping their
    checkpoints; cluster jobs, which it cancels through their executor), marks their outputs incomplete
    and releases its lock. (Snakemake takes SIGTERM as "finish the running jobs first", which can take
    hours.) A second signal, or STOP_GRACE_S without an exit, kills the group. Once the child has ended,
    the caller re-raises the signal in this process (`reraise`), so that it stops as it would have.

    The handlers are installed before the child starts: a signal this process inherited as ignored (a
    background job of a script ignores SIGINT) would otherwise stay ignored in Snakemake and its jobs, while
    a signal with a handler here starts with its default action there.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.signal: int | None = None
        self._killer: threading.Timer | None = None

    def __enter__(self) -> _StopForwarding:
        self._previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def attach(self, child: subprocess.Popen) -> None:
        self.child = child
        if self.signal is not None:  # it came while the child was starting
            self._stop()

    def _forward(self, signum: int, frame: object) -> None:
        if self.signal is None:
            self.signal = signum
            if self.child is not None:
                self._stop()
        else:
            self._send(signal.SIGKILL)

    def _stop(self) -> None:
        self._send(signal.SIGINT)
        self._killer = threading.Timer(STOP_GRACE_S, self._send, (signal.SIGKILL,))
        self._killer.daemon = True
        self._killer.start()

    def _send(self, signum: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    def __exit__(self, *exc: object) -> None:
        if self._killer is not None:
            self._killer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def reraise(self) -> None:
        """Raise the signal that stopped the build in this process, as its handler here takes it (an exception
        under fedskew's CLI); where that signal is ignored, a KeyboardInterrupt, since the build did stop."""
        if self.signal is None:
            return
        if self._previous[self.signal] == signal.SIG_IGN:
            raise KeyboardInterrupt
        signal.raise_signal(self.signal)


def run_snakemake(args: list[str], *, cwd: Path, runs: list, log_path: Path, env: dict | None = None) -> int:
    """`snakemake <args>` in `cwd`; returns its exit code. Snakemake's output (job blocks quieted) goes to
    `log_path` (and, when it fails, its last lines to stderr); its job events to `Progress`.

    `--rerun-incomplete`: a run whose job was stopped (a forwarded stop, a kill, a pre-empted node) is
    trained again by the next build, resuming from its checkpoint, instead of stopping that build.
    SIGINT or SIGTERM stops Snakemake and its jobs first (`_StopForwarding`), then this process."""
    events_in, events_out = os.pipe()  # Snakemake's job events, through the logger plugin
    command = [sys.executable, "-m", "snakemake", "--quiet", "rules", "host", "reason", "--rerun-incomplete",
               "--logger", EVENTS_LOGGER, f"--logger-{EVENTS_LOGGER}-events-file", f"/dev/fd/{events_out}", *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(runs, cwd)
    with open(log_path, "a") as log, open(events_in, encoding="utf-8") as events, _StopForwarding() as stop:
        log.write(f"$ {' '.join(command)}   (in {cwd})\n")
        log.flush()
        output_start = log.tell()
        try:
            child = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     pass_fds=(events_out,), start_new_session=True)
        finally:
            os.close(events_out)  # Snakemake holds the only writing end now: the events end when it does
        with child:
            stop.attach(child)
            for line in events:
                progress.feed(line)
            code = child.wait()
    if stop.signal is not None:
        print(f"fedskew: stopped by {signal.Signals(stop.signal).name}: Snakemake and its jobs have ended (exit "
              f"{code}); its output is in {log_path}. A stopped training job keeps its checkpoint: building again "
              "resumes it", file=sys.stderr, flush=True)
        stop.reraise()
    if code != 0:
        with open(log_path, errors="replace") as log:
            log.seek(output_start)
            print("\n".join(log.read().splitlines()[-40:]), file=sys.stderr)
        print(f"fedskew: snakemake failed (exit {code}); its whole output is in {log_path}", file=sys.stderr)
    return code


def snakemake_env() -> dict:
    """This process's environment, with fedskew's src/ on PYTHONPATH: the jobs, and Snakemake's logger plugin."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env
