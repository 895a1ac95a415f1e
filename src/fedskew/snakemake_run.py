"""Snakemake as a child process of a fedskew command (`run`, `verify`, `reproduce`): its progress, its stop.

`run_snakemake` starts Snakemake in its own process group with its output going to a log file, and follows
it through its job events, which a logger plugin of this project writes as JSON lines into a pipe
(src/snakemake_logger_plugin_fedskew), never through its console text: `Progress` prints one line per progress
step and per finished run (its final accuracy). SIGINT or SIGTERM to the fedskew process stops Snakemake and its
jobs first; whatever ends the fedskew process, `kill -9` included, a watchdog stops them after it
(fedskew.buildstop).

One build at a time in a project (`ProjectBuild`): a second build command refuses, or waits, before it touches
anything, and the Snakemake lock that a killed build left is removed by the next build, never while one runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from fedskew import metrics, paths
from fedskew.buildstop import StopForwarding, Watchdog
from fedskew.config_errors import ConfigError


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


def run_snakemake(args: list[str], *, cwd: Path, runs: list, log_path: Path, env: dict | None = None) -> int:
    """`snakemake <args>` in `cwd`; returns its exit code. Snakemake's output (job blocks quieted) goes to
    `log_path` (and, when it fails, its last lines to stderr); its job events to `Progress`.

    `--rerun-incomplete`: a run whose job was stopped (a forwarded stop, a kill, a pre-empted node) is
    trained again by the next build, resuming from its checkpoint, instead of stopping that build.
    SIGINT or SIGTERM stops Snakemake and its jobs first (`StopForwarding`), then this process; whatever
    ends this process, they stop after it (`Watchdog`). Under a build lock (`ProjectBuild`), its record says
    where Snakemake runs until it has ended and released its lock."""
    events_in, events_out = os.pipe()  # Snakemake's job events, through the logger plugin
    command = [sys.executable, "-m", "snakemake", "--quiet", "rules", "host", "reason", "--rerun-incomplete",
               "--logger", EVENTS_LOGGER, f"--logger-{EVENTS_LOGGER}-events-file", f"/dev/fd/{events_out}", *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(runs, cwd)
    build = _held
    if build is not None:
        build.snakemake_started(cwd, _workflow_options(args))
    with open(log_path, "a") as log, open(events_in, encoding="utf-8") as events, StopForwarding() as stop, \
            Watchdog(held_lock_fds()) as watchdog:
        log.write(f"$ {' '.join(command)}   (in {cwd})\n")
        log.flush()
        output_start = log.tell()
        try:
            child = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     pass_fds=(events_out,), start_new_session=True)
        finally:
            os.close(events_out)  # Snakemake holds the only writing end now: the events end when it does
        watchdog.watch(child.pid)
        with child:
            stop.attach(child)
            for line in events:
                progress.feed(line)
            code = child.wait()
    if build is not None:
        build.snakemake_ended(cwd)
    if stop.signal is not None:
        print(f"fedskew: stopped by {signal.Signals(stop.signal).name}: Snakemake and its jobs have ended (exit "
              f"{code}); its output is in {log_path}. A stopped training job keeps its checkpoint: building again "
              "resumes it", file=sys.stderr, flush=True)
        stop.reraise()
    if code != 0:
        _report_failure(code, cwd, log_path, output_start)
    return code


def _report_failure(code: int, cwd: Path, log_path: Path, output_start: int) -> None:
    """The end of Snakemake's output, or where it refused to start because another Snakemake holds its lock in
    `cwd`, one line saying so: one started outside fedskew (fedskew's builds take turns, `ProjectBuild`), and
    Snakemake's own hint, `--unlock`, would let both write the same files."""
    with open(log_path, errors="replace") as log:
        log.seek(output_start)
        output = log.read()
    if "LockException" in output:
        print(f"fedskew: another Snakemake, not started by fedskew, is building in {cwd} (its lock is in "
              f"{cwd / '.snakemake' / 'locks'}): wait for it to end, then build again", file=sys.stderr)
    else:
        print("\n".join(output.splitlines()[-40:]), file=sys.stderr)
    print(f"fedskew: snakemake failed (exit {code}); its whole output is in {log_path}", file=sys.stderr)


def _workflow_options(args: list[str]) -> list[str]:
    """The options of `args` that say which workflow runs where (`--snakefile`, `--directory`, with their values):
    what `snakemake --unlock` needs to find the lock of that build."""
    return [word for i, word in enumerate(args)
            if word in ("--snakefile", "--directory") or (i and args[i - 1] in ("--snakefile", "--directory"))]


def snakemake_env() -> dict:
    """This process's environment, with fedskew's src/ on PYTHONPATH: the jobs, and Snakemake's logger plugin."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


# ---- One build at a time in a project, and the lock that a killed build left -----------------------------------

# The project's build lock, `fcntl.flock`ed by the fedskew process of a build and by its watchdogs, which outlive
# Snakemake and its jobs: the kernel frees it once every process of the build has ended, however it ended (the
# fedskew process killed, the machine rebooted). The file holds the build's record (`ProjectBuild.record`).
BUILD_LOCK = Path(".snakemake") / "fedskew-build.lock"

_held: ProjectBuild | None = None  # the build lock this process holds (one build a process); `run_snakemake` reads it


def held_lock_fds() -> tuple[int, ...]:
    """The build lock this process holds, as descriptors for a child of the build to hold too: the lock is free
    only once it has ended as well."""
    return () if _held is None else (_held.fd,)


class BuildRunningError(Exception):
    """Another build is running in this project; the refused command changed nothing (exit 75, fedskew.cli)."""


class ProjectBuild:
    """The project's build lock, held by a build command (`fedskew run`, `verify`, `reproduce`) from before it
    touches anything (its log, its scratch project) to its end.

    Held by another build, the command refuses in one line saying which (pid, command, since when) and how to
    stop it; with `wait`, it says for which build it waits, and waits. It never suggests `snakemake --unlock`:
    while a build runs, that would let two Snakemakes write the same files, one of which would fail.

    Its record says where the build's Snakemake runs, from its start until it has ended and released its lock.
    A record that says so when the lock is taken is a build whose Snakemake was killed (nothing of that build
    lives, or the lock would be held): its lock, if it left one, is removed by `snakemake --unlock`."""

    def __init__(self, root: Path = Path("."), wait: bool = False) -> None:
        self.root = root.resolve()
        self.wait = wait
        self.fd = -1
        self.record: dict = {}

    def __enter__(self) -> ProjectBuild:
        global _held
        path = self.root / BUILD_LOCK
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._take(fd)
            self._unlock_what_was_left(_read_record(fd))
        except BaseException:
            os.close(fd)  # the lock with it, if it was taken
            raise
        self.fd, _held = fd, self
        self.record = {"pid": os.getpid(), "command": shlex.join(["fedskew", *sys.argv[1:]]),
                       "since": datetime.now().isoformat(" ", "seconds"), "snakemake": None}
        self._write()
        return self

    def __exit__(self, *exc: object) -> None:
        global _held
        _held = None
        os.close(self.fd)  # the lock is free once the watchdogs, which hold it too, have ended

    def _take(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            record = _read_record(fd)
        holder = _describe(record)
        if not self.wait:
            pid = record.get("pid") if record else None
            stop = f"stop it with `kill {pid}` (its Snakemake and jobs stop, keeping their checkpoints)" if pid \
                else "stop it (Ctrl-C or kill of its fedskew process)"
            raise BuildRunningError(f"another build is running in this project ({holder}): wait for it to end, or "
                                    f"give --wait to wait for it, or {stop}; this command changed nothing")
        print(f"fedskew: waiting for the build running in this project to end ({holder})", flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock_what_was_left(self, previous: dict | None) -> None:
        """`snakemake --unlock` where the last build's Snakemake ran, if it left its lock there (it was killed)."""
        left = (previous or {}).get("snakemake")
        if not isinstance(left, dict) or not isinstance(left.get("cwd"), str):
            return
        where = Path(left["cwd"])
        workflow = [str(word) for word in left.get("workflow") or []]
        if not (where == self.root or self.root in where.parents) or not _holds_a_lock(where):
            return  # Snakemake released it as it stopped; a record naming a folder outside the project is no build
        print(f"fedskew: Snakemake was killed in the build of pid {previous.get('pid')} ({previous.get('command')}, "
              f"since {previous.get('since')}) and left its lock in {where}; no build is running: removing it",
              flush=True)
        done = subprocess.run([sys.executable, "-m", "snakemake", "--unlock", *workflow], cwd=where,
                              env=snakemake_env(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # the record stays: the next build tries again
            said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            raise ConfigError(f"Snakemake's lock in {where}, left by a killed build, could not be removed: "
                              f"`snakemake --unlock` failed (exit {done.returncode}: {said[-1] if said else 'silent'})"
                              f"; fix what it says and build again")

    def snakemake_started(self, cwd: Path, workflow: list[str]) -> None:
        self.record["snakemake"] = {"cwd": str(cwd.resolve()), "workflow": workflow}
        self._write()

    def snakemake_ended(self, cwd: Path) -> None:
        """Snakemake and what was left of its group have ended; a lock it left (it was killed) stays on record."""
        if not _holds_a_lock(cwd.resolve()):
            self.record["snakemake"] = None
            self._write()

    def _write(self) -> None:
        # Over the old record, then cut to length: a kill between the two leaves the new record first, whole,
        # which is what `_read_record` reads (a write this small to a file is not cut short by a signal).
        data = json.dumps(self.record, allow_nan=False).encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))


def _read_record(fd: int) -> dict | None:
    """The first JSON object in the lock file, or None (none written yet, or not fedskew's)."""
    try:
        record, _ = json.JSONDecoder().raw_decode(os.pread(fd, 1 << 16, 0).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _describe(record: dict | None) -> str:
    """Which build holds the lock, in words: pid, command, since when."""
    if not record:
        return "one that has not said which"
    text = f"pid {record.get('pid')}: {record.get('command')}, since {record.get('since')}"
    try:
        os.kill(int(record.get("pid")), 0)
    except ProcessLookupError:
        text += "; that process has ended, and what it started is stopping"
    except (OSError, TypeError, ValueError):
        pass
    return text


def _holds_a_lock(cwd: Path) -> bool:
    """Whether Snakemake's lock in `cwd` is taken (by a Snakemake running there, or by one that was killed)."""
    locks = cwd / ".snakemake" / "locks"
    try:
        return any(locks.iterdir())
    except OSError:
        return False
