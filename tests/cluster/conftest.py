"""Fixtures of the cluster tests: one SLURM cluster per session, timings."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import harness

CLUSTER_MAX_SECONDS = 3 * 3600  # the watchdog stops the cluster after this, whatever happens
REFERENCE_COMPARED = ("data/partitions", "results/runs", "results/tables", "results/figures")


class Timings:
    """Wall time of each part of the cluster tests, printed at the end of the session."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, float]] = []
        self.started = time.monotonic()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.parts.append((name, time.monotonic() - start))

    def report(self) -> list[str]:
        lines = [f"{seconds:8.1f} s  {name}" for name, seconds in self.parts]
        return lines + [f"{time.monotonic() - self.started:8.1f} s  all cluster tests (wall)"]


TIMINGS: list[Timings] = []


@pytest.fixture(scope="session")
def timings() -> Timings:
    TIMINGS.append(Timings())
    return TIMINGS[-1]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The measured time of each part, after the test summary (what docs/cluster.md quotes)."""
    for record in TIMINGS:
        terminalreporter.write_sep("-", "cluster test timings")
        for line in record.report():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def cluster(timings: Timings) -> Iterator[harness.Cluster]:
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


@dataclass
class Reference:
    """An uninterrupted run of the default suite through SLURM (see test_slurm_cluster.py's `uninterrupted`),
    whose tables were checked byte-identical to the committed ones: what each fault run must equal."""

    root: Path
    files: dict[str, str]  # relative path -> sha256 of partitions, run files, tables and figures
    commit: str  # the project's git commit, which every run's provenance records
