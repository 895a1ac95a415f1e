"""Live MLflow tracking in a worker process beside the training job (a sidecar).

Importing MLflow and its SQLAlchemy store costs about 2 CPU-seconds per process, and every
batch of metrics costs SQL work; in the job itself that is wall time added to training.
`SidecarRun` has the interface of `fedskew.tracking.LiveRun` that `fedskew train` uses, but runs a
`LiveRun(strict=False)` in ``python -m fedskew.tracking.worker``, started before the job
imports torch: MLflow's import, the store's creation and the batches run on another core
while the job imports torch and trains, and the job waits for the tracker twice at most:

* before its first checkpoint (`await_first_round`, called by `fedskew train`), until MLflow
  shows the run with its first round (at most FIRST_ROUND_WAIT_S): a job killed once it has
  something to resume always leaves a visible run, which its retry continues, as with the
  in-process LiveRun. A job whose first checkpoint comes later than the worker's start (a
  second or so after torch's import) does not wait at all;
* at the end, for the last batch, the artifacts and the final status (at most END_WAIT_S).

Protocol: the job writes one JSON command per line to the worker's stdin: ``start`` (the
LiveRun arguments), ``rows`` (history rows; NaN and infinity pass, as Python's json allows
them) and ``end`` (status, artifacts, tags), then ``start`` again for the job's next run, if
any (`fedskew train --seed 0 1 2`: one worker, one MLflow import, for all of a job's runs);
closing stdin after an ``end`` ends the worker. The worker replies one JSON line,
``{"after": "rows" | "end", "run_id": ..., "error": ...}``, on stdout after a run's first
rows and after its ``end``. It
sends a batch after the first rows, then when `flush_every_s` has passed or a full
batch of MAX_METRICS_PER_BATCH values is waiting (a batch the end would send anyway:
sent early, it costs the store no extra transaction and shortens the job's wait at the end).

Signals and failures: the worker ignores SIGINT and SIGTERM (Ctrl-C or a preemption reaches
the whole process group; the job decides the final status and sends ``end KILLED``). When
its stdin closes in the middle of a run (the job was killed with -9) it exits at once, leaving
the run RUNNING, exactly as a killed in-process job did: the retry continues the same run. A
worker that cannot start, fails to track, dies, or has not finished END_WAIT_S after the end
sets `SidecarRun.error` (and, if the worker is gone, that of the job's later runs too); the
job still succeeds and its run files stay the truth (`fedskew track` logs them later). Before a run, the
worker asks whether the tracking server answers (fedskew.tracking.reach: the build's verdict, or a probe of a
few seconds): a silent one is not asked again, and its runs end at once with that error, in seconds instead of
MLflow's minutes of retries.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fedskew
from fedskew.tracking import reach, redaction, runs

log = logging.getLogger(__name__)

FIRST_ROUND_WAIT_S = 60.0  # a tracker slower than this to show round 1 no longer holds training back
END_WAIT_S = 300.0  # a tracker that has not finished by then is stopped: the run stays RUNNING, `track` repairs it


def _plain(value: Any) -> Any:
    """JSON for what json cannot write itself: numpy/torch scalars become floats (LiveRun logs
    every real number), anything else text (LiveRun skips it, as it would have)."""
    return float(value) if isinstance(value, numbers.Real) else str(value)


class SidecarWorker:
    """The tracking worker of one training job: one process that records the job's runs one
    after another (`fedskew train --seed 0 1 2` trains several runs in one process, and MLflow
    is imported once for all of them).

    The worker's stdin is non-blocking: a row that does not fit in the pipe (the worker is
    busy with a batch, stopped, or stuck on the store) waits in memory and goes with the
    next one, so training never blocks on the tracker, whatever state the worker is in.
    A worker that cannot start, dies, or hangs sets `error`: every run after that reports
    tracking as failed at once (its files stay the truth; `fedskew track` logs it later).
    """

    def __init__(self) -> None:
        self.error: str | None = None
        self._process: subprocess.Popen | None = None
        self._outbox = bytearray()  # commands the pipe had no room for yet

    def start(self) -> SidecarWorker:
        # The worker runs the same fedskew as this job, also when this job found it other than via PYTHONPATH.
        path = [str(Path(fedskew.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        try:
            self._process = subprocess.Popen([sys.executable, "-m", "fedskew.tracking.worker"], env=env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        except OSError as error:
            self.error = f"starting the tracking worker ({sys.executable} -m fedskew.tracking.worker) failed: {error}"
            return self
        os.set_blocking(self._process.stdin.fileno(), False)
        return self

    def send(self, command: dict) -> None:
        """Queue a command; write what the pipe takes now."""
        if self.error is not None:
            return
        self._outbox += (json.dumps(command, default=_plain) + "\n").encode()
        try:
            written = os.write(self._process.stdin.fileno(), self._outbox)
        except BlockingIOError:
            return  # the pipe is full: the outbox goes with the next command
        except BrokenPipeError:
            self.error = self._gone()
            return
        del self._outbox[:written]

    def _drain(self, deadline: float) -> bool:
        """Write the whole outbox (the worker is reading it); False if the worker went or the time ran out."""
        while self._outbox and self.error is None:
            _, writable, _ = select.select([], [self._process.stdin], [], max(0.0, deadline - time.monotonic()))
            if not writable:
                return False
            try:
                written = os.write(self._process.stdin.fileno(), self._outbox)
            except BlockingIOError:
                continue
            except BrokenPipeError:
                self.error = self._gone()
                return False
            del self._outbox[:written]
        return self.error is None

    def reply(self, timeout: float, after: str) -> dict | None:
        """The worker's next reply of kind `after` ("rows" or "end"); replies of other kinds are
        skipped. None when none came within `timeout` (the worker may still be working)."""
        deadline = time.monotonic() + timeout
        if after == "end" and not self._drain(deadline):
            if self.error is None:
                self._stop(f"the tracking worker did not take the end within {timeout:.0f} s and was stopped; "
                           "the MLflow run stays RUNNING")
            return None
        while self.error is None:
            ready, _, _ = select.select([self._process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                if after == "end":
                    self._stop(f"the tracking worker did not finish within {timeout:.0f} s and was stopped; "
                               "the MLflow run stays RUNNING")
                return None
            line = self._process.stdout.readline()  # unbuffered: reads this line and nothing after it
            if not line:
                self.error = self._gone(" before it recorded the end" if after == "end" else "")
                return None
            answer = json.loads(line)
            if answer["after"] == after:
                return answer
        return None

    def _stop(self, error: str) -> None:
        self.error = error
        self._process.kill()
        self._process.wait()

    def _gone(self, when: str = "") -> str:
        """Why the worker is not there any more (it has exited or is exiting: its pipes are closed)."""
        code = self._process.wait()
        status = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"the tracking worker (pid {self._process.pid}) {status}{when}; its messages are in this job's log"

    def close(self) -> None:
        """No more runs: close the worker's stdin; it exits at once (everything it was sent is recorded)."""
        if self._process is None or self._process.returncode is not None:
            return
        self._process.stdin.close()
        try:
            self._process.wait(timeout=END_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class SidecarRun:
    """`LiveRun`'s interface for one run of a training job, recorded by a `SidecarWorker`.

    Without `worker`, the run starts its own worker and closes it at its end (a job of one run).
    """

    def __init__(self, *, project_root: Path, experiment: str, run_name: str, params: dict,
                 tags: dict[str, str], uri: str | None = None, flush_every_s: float = 10.0,
                 worker: SidecarWorker | None = None, dataset: dict[str, str] | None = None) -> None:
        self.start_command = {"command": "start", "project_root": str(Path(project_root).resolve()),
                              "experiment": experiment, "run_name": run_name, "params": params, "tags": tags,
                              "uri": uri, "flush_every_s": flush_every_s, "dataset": dataset}
        self.run_id: str | None = None
        self.error: str | None = None
        self._owns_worker = worker is None
        self._worker = worker
        self._first_round_shown = False
        self._ended = False

    def start(self) -> SidecarRun:
        if self._worker is None:
            self._worker = SidecarWorker().start()
        self._worker.send(self.start_command)
        self._check_worker()
        return self

    def _check_worker(self) -> bool:
        if self.error is None and self._worker.error is not None:
            self._fail(self._worker.error)
        return self.error is None

    def _fail(self, error: str) -> None:
        self.error = error
        log.error("TRACKING FAILED for %s (%s); tracking stops for this run, training goes on",
                  self.start_command["run_name"], error)

    def log_round(self, row: dict) -> None:
        if self.error is not None:
            return
        self._worker.send({"command": "rows", "rows": [row]})
        self._check_worker()

    def await_first_round(self) -> None:
        """Wait, once, until the worker has the first round in MLflow (its first reply)."""
        if self.error is not None or self._first_round_shown:
            return
        self._first_round_shown = True
        answer = self._worker.reply(FIRST_ROUND_WAIT_S, after="rows")
        if answer is None:
            if self._check_worker():
                log.warning("MLflow does not show %s after %.0f s; training goes on, and the tracker catches up "
                            "in the background", self.start_command["run_name"], FIRST_ROUND_WAIT_S)
            return
        self._take(answer)

    def _take(self, answer: dict) -> None:
        self.run_id = answer["run_id"] or self.run_id
        if answer["error"] is not None and self.error is None:
            self.error = answer["error"]  # the worker has logged it

    def end(self, status: str, artifacts: list[Path] = (), tags: dict[str, str] | None = None) -> None:
        """Send the final status, artifacts and tags; wait until the worker has recorded them."""
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"status must be FINISHED, FAILED or KILLED, not {status!r}")
        if self._worker is None or self._ended:
            return
        self._ended = True
        try:
            if self._worker.error is None:
                # Sent after an error too: the worker's run ignores it, and the worker is ready for the next run.
                self._worker.send({"command": "end", "status": status, "tags": tags or {},
                                   "artifacts": [str(Path(a).resolve()) for a in artifacts]})
                answer = self._worker.reply(END_WAIT_S, after="end")
                if answer is not None:
                    self._take(answer)
            self._check_worker()
        finally:
            if self._owns_worker:
                self._worker.close()


class _Worker:
    """The worker's side: one LiveRun, fed by the commands on stdin."""

    def __init__(self, replies: Any) -> None:
        self.replies = replies
        self.live: runs.LiveRun | None = None
        self.waiting = 0  # metric values received since the last batch
        self.last_batch: float | None = None
        self.silent_server: str | None = None  # why the tracking server does not answer, once found

    def reply(self, after: str) -> None:
        try:
            self.replies.write(json.dumps({"after": after, "run_id": self.live.run_id, "error": self.live.error})
                               + "\n")
            self.replies.flush()
        except BrokenPipeError:  # the job was killed: leave the run as a killed job leaves it
            os._exit(0)

    def start(self, command: dict) -> None:
        self.live = runs.LiveRun(project_root=Path(command["project_root"]), experiment=command["experiment"],
                                 run_name=command["run_name"], params=command["params"], tags=command["tags"],
                                 uri=command["uri"], strict=False, flush_every_s=command["flush_every_s"],
                                 dataset=command.get("dataset"))
        self.waiting, self.last_batch = 0, None
        # A silent server is found in seconds (fedskew.tracking.reach), and then not asked again by this job: the
        # run is left to `fedskew track`, as after any tracking failure; the job says so when the run ends.
        if self.silent_server is None and (reason := reach.unreachable(self.live.uri)) is not None:
            self.silent_server = reach.unreachable_message(self.live.uri, reason)
        if self.silent_server is not None:
            self.live.error = f"{self.silent_server}; the run was not recorded live"
            return
        self.live.start()

    def rows(self, command: dict) -> None:
        self.live.add_rows(command["rows"])
        self.waiting += sum(len(row) - 1 for row in command["rows"])  # all but "round": an upper bound
        first = self.last_batch is None
        if (first or self.waiting >= runs.MAX_METRICS_PER_BATCH
                or time.monotonic() - self.last_batch >= self.live.flush_every_s):
            self.live.flush()
            self.waiting, self.last_batch = 0, time.monotonic()
        if first:
            self.reply("rows")

    def end(self, command: dict) -> None:
        self.live.end(command["status"], [Path(a) for a in command["artifacts"]], command["tags"])
        self.reply("end")


def main() -> None:
    # Ctrl-C and a preemption's SIGTERM reach the whole process group; the job decides the ending.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Replies get a private copy of stdout; what a library prints (MLflow prints a run's URL
    # when it ends on a tracking server) goes to stderr, the job's log.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    redaction.install()  # MLflow's and urllib3's lines name the tracking URI, query and fragment included
    worker = _Worker(replies)
    handlers = {"start": worker.start, "rows": worker.rows, "end": worker.end}
    # Runs come one after another: start, rows..., end, start, ... The job closes stdin after its
    # last run; EOF in the middle of a run means the job was killed: leave that run RUNNING.
    for line in sys.stdin.buffer:
        if not line.endswith(b"\n"):
            break  # the job was killed while writing this command
        command = json.loads(line)
        handlers[command["command"]](command)
    # Everything is committed and flushed; tearing down an interpreter with MLflow loaded
    # takes 0.5-1 s that the job would wait for.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
