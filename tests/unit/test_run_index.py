"""Each committed suite's run index (results/tables/runs/<suite>.csv) names the runs its tables read: the run ids
params.yaml and the code give now, so a change that moves a run id fails here before a table keeps old numbers."""

import pytest

from fedskew import paths
from fedskew.cli import main
from fedskew.config import load_params
from fedskew.report.tables import RUN_INDEX_COLUMNS, run_index
from tests.helpers import REPO

PARAMS = load_params(REPO / "params.yaml", experiments=None)
INDEXED = sorted(path.stem for path in (REPO / "results" / "tables" / "runs").glob("*.csv"))


def test_every_committed_table_has_its_run_index() -> None:
    tabled = sorted(path.stem for path in (REPO / "results" / "tables").glob("*.md"))
    assert INDEXED == tabled


@pytest.mark.parametrize("suite", INDEXED)
def test_a_committed_run_index_is_what_params_yaml_and_the_code_give(suite) -> None:
    committed = (REPO / paths.RUN_INDEX.format(suite=suite)).read_text()
    assert committed == run_index(PARAMS, suite), f"run `python -m fedskew runs --suite {suite} --write`"
    header, *rows = committed.splitlines()
    assert header.split(",") == list(RUN_INDEX_COLUMNS) and len(rows) == len(PARAMS.suite_runs(suite))


def test_runs_prints_the_index_and_refuses_an_unknown_suite(capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["runs", "--suite", "default"]) == 0
    assert capsys.readouterr().out == (REPO / "results/tables/runs/default.csv").read_text()
    assert main(["runs", "--suite", "nope"]) == 2
    assert "'nope' is not a suite" in capsys.readouterr().err
