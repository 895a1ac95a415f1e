"""scripts/slurm-cluster.sh refuses bad input with a clear message, before it starts or changes anything.

These run in `make test` (no cluster is started); tests/cluster/test_slurm_cluster.py starts one for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Path]:
    """A folder under /tmp short enough for a cluster (the script refuses longer ones)."""
    made = Path(tempfile.mkdtemp(prefix="fsk-", dir="/tmp"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_without_a_command_it_prints_its_usage() -> None:
    done = script()
    assert done.returncode == 2
    assert "slurm-cluster.sh start" in done.stderr and "slurm-cluster.sh stop" in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["restart"], "unknown command 'restart': start, stop, status or env"),
    (["start", "--max-seconds", "ten"], "--max-seconds needs a positive number, got 'ten'"),
    (["start", "--max-seconds", "0"], "--max-seconds needs a positive number, got '0'"),
    (["start", "--owner-pid", "me"], "--owner-pid needs a process id, got 'me'"),
    (["start", "--dir"], "--dir needs a folder"),
    (["stop", "--verbose"], "unknown option '--verbose'"),
])
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    done = script(*args)
    assert done.returncode != 0
    assert message in done.stderr


def test_env_and_status_of_a_folder_without_a_cluster_say_so(tmp_path: Path) -> None:
    for command in ("env", "status"):
        done = script(command, "--dir", str(tmp_path))
        assert done.returncode == 1 and f"no cluster in {tmp_path}" in done.stderr


def test_stop_without_a_cluster_does_nothing(tmp_path: Path) -> None:
    absent = tmp_path / "never-started"
    done = script("stop", "--dir", str(absent))
    assert done.returncode == 0 and not absent.exists()


def test_start_never_empties_a_folder_that_is_not_its_own(short: Path) -> None:
    (short / "thesis.tex").write_text("precious")
    done = script("start", "--dir", str(short), "--owner-pid", str(os.getpid()))
    assert done.returncode == 1
    if os.geteuid() == 0:
        assert "neither empty nor a cluster folder of this script" in done.stderr
    else:
        assert "run as root" in done.stderr
    assert (short / "thesis.tex").read_text() == "precious" and sorted(os.listdir(short)) == ["thesis.tex"]


def test_start_refuses_a_folder_too_long_for_socket_paths() -> None:
    done = script("start", "--dir", "/tmp/" + "x" * 60, "--owner-pid", str(os.getpid()))
    assert done.returncode == 1
    assert "is 65 characters long; at most 60" in done.stderr or "run as root" in done.stderr
    assert not Path("/tmp/" + "x" * 60).exists()


def test_start_needs_a_living_owner(short: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = script("start", "--dir", str(short / "c"), "--owner-pid", str(gone.pid))
    assert done.returncode == 1
    assert f"--owner-pid {gone.pid} is no running process" in done.stderr or "run as root" in done.stderr
    assert not (short / "c").exists()
