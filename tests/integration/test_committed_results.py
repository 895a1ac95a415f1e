"""The committed tables follow from the committed runs: each suite's archives in results/committed-runs/
(the runs of `reproduce.suites`, results/committed-runs/README.md) and results/imported/ (the suites of
`reproduce.imported`), imported into a scratch project, rebuild its committed table byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.packed.archive import archived_run_ids, import_archives
from fedskew.report.tables import write_tables
from tests.conftest import REPO

pytestmark = pytest.mark.slow

PARAMS = load_params(REPO / "params.yaml")
COMMITTED_RUNS = REPO / "results" / "committed-runs"


def _archives(suite: str) -> list[Path]:
    folder = (REPO / paths.IMPORTED_ARCHIVES.format(suite=suite) if suite in PARAMS.imported_suites
              else COMMITTED_RUNS / suite)
    return sorted(folder.glob("*.tar.gz"))


def _suites_with_runs() -> list[str]:
    return [s for s in [*PARAMS.reproduce_suites, *PARAMS.imported_suites]
            if _archives(s) and (REPO / paths.TABLE.format(suite=s, ext="md")).exists()]


def test_every_committed_runs_folder_is_a_reproduce_suite() -> None:
    folders = {p.name for p in COMMITTED_RUNS.iterdir() if p.is_dir()}
    assert folders <= set(PARAMS.reproduce_suites), folders - set(PARAMS.reproduce_suites)


@pytest.mark.parametrize("suite", _suites_with_runs())
def test_a_suites_committed_runs_are_whole_and_rebuild_its_table(suite: str, tmp_path: Path) -> None:
    archives = _archives(suite)
    wanted = {cfg.run_id for cfg in PARAMS.suite_runs(suite)}
    held = set().union(*(archived_run_ids(a.parent) for a in archives))
    assert held == wanted, f"{suite}: {len(wanted - held)} runs missing, {len(held - wanted)} unknown"
    report = import_archives(PARAMS, archives, tmp_path)
    assert len(report.imported) == len(wanted)
    write_tables(PARAMS, suite, tmp_path)
    for ext in ("md", "csv", "tex", "json"):
        table = paths.TABLE.format(suite=suite, ext=ext)
        assert (tmp_path / table).read_bytes() == (REPO / table).read_bytes(), f"{table} does not follow from its runs"
