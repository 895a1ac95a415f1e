"""How a build's Snakemake stops with the fedskew command that started it (`run`, `verify`, `reproduce`).

Snakemake runs in its own process group (fedskew.snakemake_run), its local jobs in that group too. SIGINT or
SIGTERM to the fedskew process is forwarded to the group (`StopForwarding`); and whatever ends the fedskew
process, `kill -9` included, a watchdog stops the group after it (`Watchdog`), holding the project's build lock
(fedskew.snakemake_run.ProjectBuild) until the group has gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

# How long Snakemake may take to stop its jobs after a stop was forwarded, before its process group is killed.
STOP_GRACE_S = 120.0


class StopForwarding:
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

    def __enter__(self) -> StopForwarding:
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


# The watchdog of a build's Snakemake, `python -I -S -c _WATCHDOG <grace_s>` in a session of its own. Its stdin
# is a pipe that only the fedskew process writes to: Snakemake's process group, then the pipe's end, which comes
# when the fedskew process ends, however it ends (`kill -9` included: the kernel closes its descriptors). It then
# stops what is left of the group as a forwarded stop does: SIGINT (Snakemake cancels its jobs, cluster ones
# included, and releases its lock), SIGKILL after the grace. Chosen over prctl(PR_SET_PDEATHSIG) on Snakemake,
# which is Linux's alone, fires when the starting *thread* ends, reaches Snakemake but not its jobs, and ends
# nothing that a build lock could wait for; the watchdog holds the build lock until the group has gone.
# A zombie (reparented to a PID 1 that does not reap it) has ended: it is not counted.
_WATCHDOG = r"""
import os, signal, sys, time
grace = float(sys.argv[1])
told = sys.stdin.buffer.read().split()  # until the fedskew process has ended
if not told:
    sys.exit()  # it ended before it started Snakemake
group = int(told[0])

def alive():
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:  # no /proc: the kernel says whether the group has a process
        try:
            os.killpg(group, 0)
            return True
        except ProcessLookupError:
            return False
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, _, pgrp = stat.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state != "Z":
            return True
    return False

def stop(signum, seconds):
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)

if alive():
    stop(signal.SIGINT, grace)
    if alive():
        stop(signal.SIGKILL, 30)
"""


class Watchdog:
    """Starts `_WATCHDOG` before Snakemake, tells it Snakemake's process group (`watch`), and on leaving closes
    its pipe and waits for it: what is left of the group (jobs of a Snakemake that crashed) has then stopped too.

    The fedskew process is killed between Snakemake's start and `watch` only in the microseconds between two
    system calls. The watchdog inherits `lock_fds` (the build lock's), so that the next build waits for it."""

    def __init__(self, lock_fds: tuple[int, ...] = ()) -> None:
        self.lock_fds = lock_fds

    def __enter__(self) -> Watchdog:
        reading, self._writing = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(STOP_GRACE_S)], stdin=reading,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/", start_new_session=True,
                pass_fds=self.lock_fds)
        except BaseException:
            os.close(self._writing)
            raise
        finally:
            os.close(reading)
        return self

    def watch(self, group: int) -> None:
        with contextlib.suppress(BrokenPipeError):  # it was killed: the build goes on, unwatched
            os.write(self._writing, f"{group}\n".encode())

    def __exit__(self, *exc: object) -> None:
        os.close(self._writing)
        self.process.wait()
