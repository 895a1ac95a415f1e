"""A build dies with its runner, and builds take turns.

Whatever ends `python -m fedskew run` (`kill -9` included), Snakemake and every job it started stop within
seconds (a watchdog holding a pipe from the fedskew process stops their process group when the pipe ends), and
the next `fedskew run` resumes, with no `--unlock`, to results identical to a build never stopped: a Snakemake
lock that a killed build left is removed by the next build itself. A second build while one runs refuses in
one line saying which build runs and how to stop it (or, with `--wait`, says for which build it waits), never
suggests `--unlock`, and touches neither the running build's log nor its files.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedskew.snakemake_run import BuildRunningError, ProjectBuild
from tests.helpers import REPO, TINY_PARAMS, isolated_env, make_copy, processes_in, wait_until

COMPARED = ("results", "data/partitions")
NOT_COMPARED = ("results/checkpoints",)  # the means of resuming, not a result


def _params() -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=["fedavg"], seeds=[0])
    # Long enough that what is done to the build lands while its one job trains (a checkpoint every 5 rounds).
    params["training"]["tiny"].update(rounds=400, checkpoint_every=5, eval_every=50, threads=1)
    return params


def _start(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedskew", *args], cwd=root, env=isolated_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _fedskew(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=root, env=isolated_env(root),
                          capture_output=True, text=True, timeout=timeout)


def _wait_for_training(root: Path, build: subprocess.Popen) -> None:
    """Until the job has written its first checkpoint: Snakemake and a training job are running."""
    wait_until(lambda: list(root.glob("results/checkpoints/tiny/**/last.pt")), 300, "the first checkpoint", 0.05,
               alive=build)


def _snakemake_of(fedskew_pid: int) -> int:
    """The pid of the Snakemake that the fedskew process `fedskew_pid` started (its child)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == fedskew_pid:
                if b"snakemake" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no Snakemake under pid {fedskew_pid}")


def _digests(root: Path) -> dict[str, str]:
    found = {}
    for top in COMPARED:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not relative.startswith(NOT_COMPARED):
                found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _none_left_in(root: Path, within_s: float) -> list[str]:
    """The processes still working in `root` after `within_s` seconds at most (none, once they have all ended)."""
    deadline = time.monotonic() + within_s
    while (left := processes_in(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# ---- the pieces, in seconds ----------------------------------------------------------------------------------

# A runner as the fedskew process is one: a process group of its own (`sleep`) under a watchdog.
RUNNER = """
import subprocess, sys, time
from fedskew.buildstop import Watchdog
with Watchdog() as watchdog:
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    watchdog.watch(child.pid)
    print(child.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_the_watchdog_stops_the_group_of_a_runner_killed_with_sigkill() -> None:
    runner = subprocess.Popen([sys.executable, "-c", RUNNER], env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    group = 0
    try:
        group = int(runner.stdout.readline())
        assert _alive(group)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
        wait_until(lambda: not _alive(group), 10, "the runner's process group to stop", 0.05)
    finally:
        for pid in (runner.pid, group):  # what a failed assertion left running
            if pid and _alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_a_held_build_lock_refuses_a_second_build_naming_the_first_and_changes_nothing(tmp_path) -> None:
    with ProjectBuild(tmp_path):
        lock = tmp_path / ".snakemake" / "fedskew-build.lock"
        record = lock.read_bytes()
        with pytest.raises(BuildRunningError) as refused:
            with ProjectBuild(tmp_path):
                pass
        assert lock.read_bytes() == record
    text = str(refused.value)
    command = shlex.join(["fedskew", *sys.argv[1:]])  # this process's own command line: pytest's, or a worker's
    assert text.startswith(f"another build is running in this project (pid {os.getpid()}: {command}, since "), text
    assert f"stop it with `kill {os.getpid()}`" in text and "unlock" not in text.lower(), text
    with ProjectBuild(tmp_path):  # free again once the first has ended
        pass


# ---- whole builds, in minutes -----------------------------------------------------------------------------------

@dataclass
class BusyBuild:
    """One build, and what was tried while it trained: the other build commands, refused; one with --wait."""

    root: Path
    pid: int
    first: subprocess.CompletedProcess
    refused: dict[str, subprocess.CompletedProcess]
    log_before: tuple[int, bytes]  # the running build's log, its inode and bytes, before the refused commands
    log_after: tuple[int, bytes]
    verify_scratch_made: bool
    waiting: subprocess.CompletedProcess
    digests: dict[str, str]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The project every test here copies: the code copied once, so that every build runs the same bytes."""
    pytest.importorskip("mlflow")  # the builds track their runs in the project's own MLflow store
    return make_copy(tmp_path_factory.mktemp("template"), _params()).resolve()


def _project(template: Path, folder: Path) -> Path:
    root = folder.resolve() / "project"
    shutil.copytree(template, root, symlinks=True)
    return root


@pytest.fixture(scope="module")
def busy_build(template, tmp_path_factory) -> BusyBuild:
    root = _project(template, tmp_path_factory.mktemp("busy"))
    log = root / "logs/rebuild/tiny.log"
    build, waiting = _start(root, "run", "--cores", "2"), None
    try:
        _wait_for_training(root, build)
        before = (log.stat().st_ino, log.read_bytes())
        refused = {" ".join(args): _fedskew(root, *args, timeout=120)
                   for args in (("run", "--cores", "2"), ("verify", "--suite", "tiny"), ("reproduce",))}
        after = (log.stat().st_ino, log.read_bytes())
        waiting = _start(root, "run", "--cores", "2", "--wait")
        out, err = build.communicate(timeout=600)
        first = subprocess.CompletedProcess(build.args, build.returncode, out, err)
        out, err = waiting.communicate(timeout=600)
    finally:
        for process in (build, waiting):  # what an assertion above left running
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return BusyBuild(root, build.pid, first, refused, before, after, (root / ".verify").exists(),
                     subprocess.CompletedProcess(waiting.args, waiting.returncode, out, err), _digests(root))


@pytest.mark.slow
def test_a_second_build_while_one_runs_is_refused_in_one_line_that_names_it_and_never_suggests_unlock(
        busy_build) -> None:
    for command, refused in busy_build.refused.items():
        assert refused.returncode == 75, (command, refused.stdout, refused.stderr)
        assert refused.stdout == "", (command, refused.stdout)
        line = refused.stderr.strip()
        assert "\n" not in line, (command, line)
        assert line.startswith(f"fedskew {command.split()[0]}: another build is running in this project "
                               f"(pid {busy_build.pid}: fedskew run --cores 2, since "), line
        assert f"stop it with `kill {busy_build.pid}`" in line and "--wait" in line, line
        assert "unlock" not in line.lower(), line


@pytest.mark.slow
def test_a_refused_build_leaves_the_running_builds_log_and_files_as_they_were(busy_build) -> None:
    inode_before, bytes_before = busy_build.log_before
    inode_after, bytes_after = busy_build.log_after
    assert inode_after == inode_before  # neither removed nor replaced
    assert bytes_after.startswith(bytes_before)  # not truncated: only the running Snakemake wrote on
    assert bytes_after.count(b"\n$ ") + bytes_after.startswith(b"$ ") == 1, bytes_after[-3000:]  # its one command
    assert not busy_build.verify_scratch_made  # verify refused before making its scratch project


@pytest.mark.slow
def test_the_running_build_ends_as_if_alone_and_one_given_wait_builds_after_it(busy_build) -> None:
    first, waiting = busy_build.first, busy_build.waiting
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "trained fedavg on digits/dir0.5 seed 0" in first.stdout
    assert waiting.returncode == 0, waiting.stdout[-3000:] + waiting.stderr[-3000:]
    assert waiting.stdout.startswith(f"fedskew: waiting for the build running in this project to end "
                                     f"(pid {busy_build.pid}: fedskew run --cores 2, since "), waiting.stdout
    assert "trained" not in waiting.stdout  # it found the run built, and rebuilt only the tables
    assert "unlock" not in (waiting.stdout + waiting.stderr).lower()


@pytest.mark.slow
def test_kill_9_of_fedskew_run_stops_snakemake_and_its_jobs_and_the_next_run_resumes_to_the_same_results(
        tmp_path, template, busy_build) -> None:
    root = _project(template, tmp_path)
    build = _start(root, "run", "--cores", "2")
    _wait_for_training(root, build)
    os.kill(build.pid, signal.SIGKILL)  # the fedskew process only: nothing it could catch
    build.communicate(timeout=60)

    assert _none_left_in(root, within_s=10) == []
    assert not list(root.glob("results/runs/**/metrics.json"))  # stopped mid-training, not finished on its own
    again = _fedskew(root, "run", "--cores", "2")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "unlock" not in (again.stdout + again.stderr).lower()
    assert "resuming after round" in "".join(p.read_text() for p in root.glob("logs/train/tiny/**/*.log"))
    assert _digests(root) == busy_build.digests  # as the build that ran undisturbed


@pytest.mark.slow
def test_a_snakemake_lock_left_by_a_build_killed_whole_is_removed_by_the_next_build_itself(
        tmp_path, template, busy_build) -> None:
    """As after a power loss or the out-of-memory killer: Snakemake had no time to release its lock."""
    root = _project(template, tmp_path)
    build = _start(root, "run", "--cores", "2")
    _wait_for_training(root, build)
    snakemake = _snakemake_of(build.pid)
    os.kill(build.pid, signal.SIGKILL)
    os.killpg(snakemake, signal.SIGKILL)  # Snakemake and its job, before the watchdog's SIGINT could stop them
    build.communicate(timeout=60)
    assert _none_left_in(root, within_s=10) == []
    assert list((root / ".snakemake" / "locks").iterdir())  # the lock a user once had to --unlock

    again = _fedskew(root, "run", "--cores", "2")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (f"fedskew: Snakemake was killed in the build of pid {build.pid} (fedskew run --cores 2, since "
            in again.stdout), again.stdout
    assert f"and left its lock in {root}; no build is running: removing it" in again.stdout, again.stdout
    assert "unlock" not in again.stderr.lower()
    assert _digests(root) == busy_build.digests
