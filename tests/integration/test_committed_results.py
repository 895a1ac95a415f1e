"""The committed tables follow from the committed runs: each suite's archives in results/committed-runs/
(the runs of `reproduce.suites`, results/committed-runs/README.md) and results/imported/ (the suites of
`reproduce.imported`), imported into a scratch project, rebuild its committed table byte for byte; and
every paper table whose suites all have their runs committed rebuilds from them, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.packed.archive import archived_run_ids, import_archives
from fedskew.report.tables import write_tables
from fedskew.reproduce.layouts import load_layouts
from fedskew.reproduce.paper_tables import paper_table_ids
from fedskew.reproduce.tables import write_paper_table
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


def _run_suites(table: str) -> set[str]:
    """The suites of a paper table that this project trains or imports (its other cells read "not run")."""
    return load_layouts()[table].suites() & {*PARAMS.reproduce_suites, *PARAMS.imported_suites}


def _tables_with_runs() -> list[str]:
    return [t for t in paper_table_ids() if _run_suites(t) and all(_archives(s) for s in _run_suites(t))]


@pytest.fixture(scope="module")
def committed_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch project holding every committed run."""
    root = tmp_path_factory.mktemp("committed")
    archives = [a for s in sorted({*PARAMS.reproduce_suites, *PARAMS.imported_suites}) for a in _archives(s)]
    import_archives(PARAMS, archives, root)
    return root


@pytest.mark.parametrize("table", _tables_with_runs())
def test_a_paper_table_follows_from_the_committed_runs(table: str, committed_project: Path) -> None:
    md, json = (paths.PAPER_TABLE.format(table=table, ext=ext) for ext in ("md", "json"))
    write_paper_table(PARAMS, table, committed_project / md, committed_project / json, committed_project)
    for page in (md, json):
        assert (committed_project / page).read_bytes() == (REPO / page).read_bytes(), f"{page} does not follow from the runs"
