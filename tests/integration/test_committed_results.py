"""The committed tables follow from the committed runs: each suite's archives in results/committed-runs/
(the runs of `reproduce.suites`, results/committed-runs/README.md) and results/imported/ (the suites of
`reproduce.imported`), imported into a scratch project, rebuild its committed table byte for byte; and
every paper table whose suites all have their runs committed, and the claims ledger, rebuild from them byte
for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.packed.archive import archived_run_ids, import_archives
from fedskew.report.tables import write_tables
from fedskew.reproduce.layouts import load_layouts
from fedskew.reproduce.ledger import write_ledger
from fedskew.reproduce.paper_tables import paper_table_ids
from fedskew.reproduce.tables import write_paper_table
from tests.helpers import REPO

pytestmark = pytest.mark.slow

PARAMS = load_params(REPO / "params.yaml")
COMMITTED_RUNS = REPO / "results" / "committed-runs"


# Suites of `reproduce.suites` retrained in stretches (more than a working day on two cores): their folder
# holds the runs finished so far, as they came, and their committed tables are rebuilt once it is whole.
# Take a suite off this list when its folder holds every run.
IN_STRETCHES: set[str] = set()


def _folder(suite: str) -> Path:
    return (REPO / paths.IMPORTED_ARCHIVES.format(suite=suite) if suite in PARAMS.imported_suites
            else COMMITTED_RUNS / suite)


def _archives(suite: str) -> list[Path]:
    return sorted(_folder(suite).glob("*.tar.gz"))


def _held(suite: str) -> set[str]:
    return archived_run_ids(_folder(suite))


def _wanted(suite: str) -> set[str]:
    return {cfg.run_id for cfg in PARAMS.suite_runs(suite)}


def _suites_with_runs() -> list[str]:
    return [s for s in [*PARAMS.reproduce_suites, *PARAMS.imported_suites]
            if _archives(s) and s not in IN_STRETCHES and (REPO / paths.TABLE.format(suite=s, ext="md")).exists()]


def test_every_committed_runs_folder_holds_a_reproduce_suites_runs_whole_or_in_stretches() -> None:
    folders = {p.name for p in COMMITTED_RUNS.iterdir() if p.is_dir()}
    assert folders <= set(PARAMS.reproduce_suites), folders - set(PARAMS.reproduce_suites)
    assert IN_STRETCHES <= folders, f"no runs committed for {IN_STRETCHES - folders}"
    for suite in sorted(folders):
        wanted, held = _wanted(suite), _held(suite)
        assert held <= wanted, f"{suite}: {len(held - wanted)} runs that are not the suite's"
        if suite in IN_STRETCHES:
            assert held != wanted, f"{suite}: every run is committed; take it off IN_STRETCHES and rebuild its tables"
        else:
            assert held == wanted, f"{suite}: {len(wanted - held)} runs missing (a suite in stretches is named in IN_STRETCHES)"


@pytest.mark.parametrize("suite", _suites_with_runs())
def test_a_suites_committed_runs_are_whole_and_rebuild_its_table(suite: str, tmp_path: Path) -> None:
    archives = _archives(suite)
    wanted, held = _wanted(suite), _held(suite)
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


def _runs_committed(suite: str) -> bool:
    """A suite of `reproduce.imported` counts with the seeds imported so far; one of `reproduce.suites` when whole."""
    return bool(_archives(suite)) and (suite in PARAMS.imported_suites or _held(suite) == _wanted(suite))


def _tables_with_runs() -> list[str]:
    return [t for t in paper_table_ids() if _run_suites(t) and all(_runs_committed(s) for s in _run_suites(t))]


@pytest.fixture(scope="module")
def committed_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch project holding every committed run."""
    root = tmp_path_factory.mktemp("committed")
    suites = sorted({*PARAMS.reproduce_suites, *PARAMS.imported_suites})
    report = import_archives(PARAMS, [a for s in suites for a in _archives(s)], root)
    assert len(report.imported) == sum(len(_held(s)) for s in suites), "an archive's runs were not all imported"
    return root


@pytest.mark.parametrize("table", _tables_with_runs())
def test_a_paper_table_follows_from_the_committed_runs(table: str, committed_project: Path) -> None:
    md, json = (paths.PAPER_TABLE.format(table=table, ext=ext) for ext in ("md", "json"))
    write_paper_table(PARAMS, table, committed_project / md, committed_project / json, committed_project)
    for page in (md, json):
        assert (committed_project / page).read_bytes() == (REPO / page).read_bytes(), f"{page} does not follow from the runs"


def test_the_claims_ledger_follows_from_the_committed_runs(committed_project: Path) -> None:
    not_whole = [s for s in [*PARAMS.reproduce_suites, *PARAMS.imported_suites] if not _runs_committed(s)]
    assert not not_whole, f"the runs of {not_whole} are not committed whole (results/committed-runs/README.md)"
    md, json = (paths.CLAIMS.format(ext=ext) for ext in ("md", "json"))
    write_ledger(PARAMS, committed_project / md, committed_project / json, committed_project)
    for page in (md, json):
        assert (committed_project / page).read_bytes() == (REPO / page).read_bytes(), f"{page} does not follow from the runs"
