"""scripts/env.sh's lock on the shared environment: a clone that waits for another's build says what it waits for.

Clones of one lock file share one environment, built by one of them while the others wait on its lock. A waiting
clone says once which environment it waits for and who holds the lock (the holder writes its process, its clone
and since when into the lock file), then goes on when the lock is released, instead of minutes of silence. Each
test runs env.sh in a scratch clone (the script and a lock file) with its own FEDSKEW_ENV_HOME, its processes
ended with the test.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers import REPO, end_group, wait_until, watchdog

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="env.sh takes its lock with flock(1)")

WAITING = "fedskew: waiting for the shared environment "


def _clone(tmp_path: Path, name: str) -> Path:
    """A scratch clone as env.sh sees one: the script and a lock file (which nothing ever installs here)."""
    root = tmp_path / name
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "env.sh", root / "scripts" / "env.sh")
    (root / "requirements.lock").write_text("# no package: these tests never install one\n")
    return root


def _shared(root: Path, env_home: Path) -> Path:
    """The shared environment env.sh picks for the clone (the hash of its lock file and this Python)."""
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}"
    digest = hashlib.sha256((root / "requirements.lock").read_bytes() + f"{pyver}\n".encode()).hexdigest()
    return env_home / digest[:16]


def _env_sh(root: Path, env_home: Path, stderr: Path) -> subprocess.Popen:
    """env.sh of the clone `root`, in a session of its own (ended with the test), its stderr into a file."""
    env = {**os.environ, "FEDSKEW_ENV_HOME": str(env_home), "FEDSKEW_PYTHON": sys.executable}
    with open(stderr, "w") as err:
        process = subprocess.Popen(["bash", str(root / "scripts" / "env.sh")], cwd=root, env=env, stdout=err,
                                   stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    watchdog(process.pid, 120)
    return process


def _waiting_lines(stderr: Path) -> list[str]:
    return [line for line in stderr.read_text().splitlines() if line.startswith(WAITING)]


def test_a_clone_waiting_on_another_clones_build_names_the_environment_and_the_builder(tmp_path) -> None:
    env_home = tmp_path / "envs"
    first, second = _clone(tmp_path, "first"), _clone(tmp_path, "second")
    shared = _shared(first, env_home)
    lock = Path(f"{shared}.lock")
    builder = _env_sh(first, env_home, tmp_path / "first.err")
    try:
        # the first clone builds (its lock file says so), and is frozen there, holding the lock
        wait_until(lambda: lock.is_file() and lock.read_text().strip(), 60, "the builder's line in the lock file",
                   every_s=0.05, alive=builder)
        os.killpg(builder.pid, signal.SIGSTOP)
        waiter = _env_sh(second, env_home, tmp_path / "second.err")
        try:
            (line,) = wait_until(lambda: _waiting_lines(tmp_path / "second.err"), 60, "the waiting line",
                                 alive=waiter)
            assert re.fullmatch(re.escape(f"{WAITING}{shared}: process {builder.pid} of the clone {first} (since ")
                                + r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
                                + re.escape(f") holds its lock ({lock}); going on once it is released"), line), line
            assert waiter.poll() is None  # it waits, and said so once
        finally:
            end_group(waiter, signal.SIGKILL, grace_s=10)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ended before it was frozen
            os.killpg(builder.pid, signal.SIGCONT)
        end_group(builder, signal.SIGKILL, grace_s=10)


def test_a_waiting_clone_says_so_once_and_goes_on_when_the_lock_is_released(tmp_path) -> None:
    import fcntl

    env_home = tmp_path / "envs"
    root = _clone(tmp_path, "clone")
    shared = _shared(root, env_home)
    venv.create(shared, with_pip=False)  # built already: once it has the lock, the clone only links to it
    (shared / ".complete").touch()
    lock = Path(f"{shared}.lock")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a process that wrote nothing into the lock file holds it
        clone = _env_sh(root, env_home, tmp_path / "clone.err")
        try:
            wait_until(lambda: _waiting_lines(tmp_path / "clone.err"), 60, "the waiting line", alive=clone)
            assert clone.poll() is None
        except BaseException:
            end_group(clone, signal.SIGKILL, grace_s=10)
            raise
    assert clone.wait(timeout=120) == 0, (tmp_path / "clone.err").read_text()
    said = (tmp_path / "clone.err").read_text().splitlines()
    assert _waiting_lines(tmp_path / "clone.err") == [f"{WAITING}{shared}: another process holds its lock ({lock}); "
                                                      "going on once it is released"]
    assert said[-1] == f"fedskew: environment ready (.venv -> {shared})"
    assert (root / ".venv" / "fedskew-env").read_text() == f"{shared} {root}\n"
    assert lock.read_text() == ""  # its holder's line is gone with its hold
