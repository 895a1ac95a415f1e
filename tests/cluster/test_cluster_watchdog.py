"""scripts/slurm-cluster.sh leaves nothing behind: the cluster stops by itself when its owner dies or its
time is up, ending its jobs too, and a second cluster is refused while one runs.

Each test starts a cluster of its own (about 15 s), before tests/cluster/test_slurm_cluster.py starts
the session's; `pytest -m cluster tests/cluster` runs them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import harness

pytestmark = pytest.mark.cluster

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")


@pytest.fixture
def folder() -> Iterator[Path]:
    """A short folder for a cluster (SLURM's socket paths must stay short: see the script)."""
    made = Path(tempfile.mkdtemp(prefix="fedskew-slurm-", dir="/tmp"))
    try:
        yield made / "c"
    finally:
        harness.stop_cluster(made / "c")
        shutil.rmtree(made, ignore_errors=True)


def processes_with(marker: str) -> list[int]:
    """Pids whose command line (arguments joined by NUL) contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def daemons(folder: Path) -> list[int]:
    """The pids of the cluster's daemons that are still alive (from its pid files)."""
    alive = []
    for pid_file in (folder / "run").glob("*.pid"):
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            continue
    return alive


def submit_sleeper(cluster: harness.Cluster, tag: str) -> None:
    """A job step that would sleep for 10 minutes, named sleep-<tag> so that its process can be found."""
    cluster.command("sbatch", "--parsable", "-A", cluster.account, "-p", cluster.partition, "--mem", "100",
                    "-o", "/dev/null", "--wrap", f"srun -n1 bash -c 'exec -a sleep-$0 sleep 600' {tag}; true")
    harness.wait_until(lambda: processes_with(f"sleep-{tag}"), 120, "the job's step to run", 0.5)


def test_the_cluster_stops_with_its_jobs_when_its_owner_dies(folder: Path) -> None:
    owner = subprocess.Popen(["sleep", "900"], start_new_session=True)
    harness.watchdog(owner.pid, 900)
    try:
        cluster = harness.start_cluster(folder, 900, owner=owner.pid)
        assert DEFAULT_CONF.resolve() == folder / "etc" / "slurm.conf"
        assert cluster.node_state() == "idle"
        # A second cluster is refused while this one runs (they would share /etc/slurm/slurm.conf).
        second = subprocess.run(["bash", str(harness.SCRIPT), "start", "--dir", str(folder.parent / "other")],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1 and f"another cluster of this script runs in {folder}" in second.stderr
        tag = uuid.uuid4().hex
        submit_sleeper(cluster, tag)
        assert daemons(folder)

        owner.send_signal(signal.SIGKILL)  # the test that owns the cluster dies
        owner.wait()
        harness.wait_until(lambda: not daemons(folder) and not processes_with(tag), 180,
                           "the cluster and its job to stop after the owner died")
        assert not DEFAULT_CONF.is_symlink()
        assert "stopped" in (folder / "log" / "watchdog.out").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_cluster_stops_when_its_time_is_up(folder: Path) -> None:
    harness.start_cluster(folder, 60)
    assert daemons(folder)
    harness.wait_until(lambda: not daemons(folder), 180, "the cluster to stop after --max-seconds 60")
    assert not DEFAULT_CONF.is_symlink()
    status = subprocess.run(["bash", str(harness.SCRIPT), "status", "--dir", str(folder)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 1 and "not running" in status.stderr
