"""Fixtures of the cluster tests: one SLURM cluster per session, timings (harness.Timings)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import harness

CLUSTER_MAX_SECONDS = 3 * 3600  # the watchdog stops the cluster after this, whatever happens

TIMINGS: list[harness.Timings] = []


@pytest.fixture(scope="session")
def timings() -> harness.Timings:
    TIMINGS.append(harness.Timings())
    return TIMINGS[-1]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The measured time of each part, after the test summary (what docs/cluster.md quotes)."""
    for record in TIMINGS:
        terminalreporter.write_sep("-", "cluster test timings")
        for line in record.report():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def cluster(timings: harness.Timings) -> Iterator[harness.Cluster]:
    # Under /tmp, not pytest's deeper folders: SLURM's socket paths must stay short (see the script).
    folder = Path(tempfile.mkdtemp(prefix="fedskew-slurm-", dir="/tmp")) / "c"
    with timings.part("start the one-node SLURM cluster (munge, MariaDB, slurmdbd, slurmctld, slurmd)"):
        started = harness.start_cluster(folder, CLUSTER_MAX_SECONDS)
    try:
        yield started
    finally:
        with timings.part("stop the cluster"):
            stopped = harness.stop_cluster(folder)
        assert stopped.returncode == 0, stopped.stderr
        shutil.rmtree(folder.parent, ignore_errors=True)
