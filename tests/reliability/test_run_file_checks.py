"""Run files are checked before any table uses them: a sealed run file (its hashes match) whose number is not
finite or out of its metric's range, or a finished run without its reported number, is refused by the reader
every consumer shares (fedskew.runfiles), naming the file and why, and no table, comparison or ledger is
written from it: every one stays byte for byte as it was. A diverged run, recorded as fedskew records one (its
numbers null), is still a result, counted apart.

The runs are written by hand over the real partitions of the `project` fixture (as a training job writes them,
without training), then sealed again after an edit with the hashes fedskew checks, as someone who knows the
format would.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from fedskew import paths
from fedskew.cli import main
from fedskew.config import load_params
from fedskew.report.tables import statistics_over_seeds
from fedskew.runfiles import INTEGRITY_KEY, RunFileError, _canonical, read_history, read_metrics, write_run_files

SEEDS = [0, 1, 2]
ROUNDS = (2, 4)
CLAIMS = {"suite": "tiny", "claims": [
    {"id": "c1", "statement": "FedLC beats FedAvg on Dirichlet 0.5", "word": "beats", "subject": "fedlc",
     "against": ["fedavg"], "columns": ["digits / dir0.5"]}]}
CLAIMS_FILE = "experiments/claims/tiny.yaml"
# every command that writes a table, a comparison or a ledger from the suite's runs
COMMANDS = {"aggregate": ["aggregate", "--suite", "tiny"], "compare": ["compare", "--suite", "tiny", "--write"],
            "claims": ["claims", "--file", CLAIMS_FILE]}


@pytest.fixture
def tiny_params(tiny_params):
    tiny_params["suites"]["tiny"]["seeds"] = SEEDS   # n = 3 in every cell
    return tiny_params


@pytest.fixture
def unpartitioned(tmp_path, tiny_params, monkeypatch) -> Path:
    """The tiny project without its data: for what reads run files alone (no per-client outcomes)."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def accuracy(cfg, round_: int) -> float:
    return 0.5 + 0.05 * cfg.seed + (0.1 if cfg.method == "fedlc" else 0.0) + 0.01 * round_


def history_row(cfg, round_: int) -> dict:
    acc = accuracy(cfg, round_)
    return {"round": round_, "train_loss": 1.5, "bytes_up": 1000, "bytes_down": 1000, "test_loss": 1.0,
            "test_acc": acc, "test_balanced_acc": acc, **{f"test_acc_class{c}": min(1.0, acc + 0.02 * c - 0.09)
                                                          for c in range(10)}}


def final_record(cfg) -> dict:
    acc = accuracy(cfg, ROUNDS[-1])
    return {"status": "finished", "final_round": ROUNDS[-1], "final_acc": acc, "final_balanced_acc": acc,
            "final_loss": 1.0, "best_round": ROUNDS[-1], "best_acc": acc, "total_bytes_up": 1000 * ROUNDS[-1],
            "total_bytes_down": 1000 * ROUNDS[-1]}


def diverged_record() -> dict:
    """What fedskew.engine.summary records for a run that diverged: no accuracy, its traffic until then."""
    return {"status": "diverged", "diverged_round": 3, "error": "run x: non-finite training loss (nan) in round 3",
            "final_acc": None, "final_balanced_acc": None, "final_loss": None, "best_round": None, "best_acc": None,
            "total_bytes_up": 2000, "total_bytes_down": 2000}


def write_runs(project: Path, diverged=()) -> list:
    runs = load_params(project / "params.yaml").suite_runs("tiny")
    for cfg in runs:
        rows = [history_row(cfg, r) for r in ROUNDS]
        if (cfg.partition, cfg.method, cfg.seed) in diverged:
            write_run_files(cfg, rows[:1], diverged_record())
        else:
            write_run_files(cfg, rows, final_record(cfg))
    claims = project / CLAIMS_FILE
    claims.parent.mkdir(parents=True, exist_ok=True)
    claims.write_text(yaml.safe_dump(CLAIMS, sort_keys=False))
    return runs


def built(project: Path, capsys) -> dict[str, bytes]:
    """Every table, comparison and ledger of the suite, built from its runs: path -> bytes."""
    for command in COMMANDS.values():
        assert main(command) == 0, capsys.readouterr().err
    capsys.readouterr()
    files = {str(p.relative_to(project)): p.read_bytes() for p in sorted((project / "results").rglob("*"))
             if p.is_file() and "runs" not in p.relative_to(project / "results").parts[:1]}
    assert {"results/tables/tiny.md", "results/tables/tiny.json", "results/tables/compare/tiny.json",
            "results/claims/tiny.md", "results/claims/tiny.json"} <= set(files)
    return files


def the_run(runs, partition="dir0.5", method="fedlc", seed=1):
    [cfg] = [c for c in runs if (c.partition, c.method, c.seed) == (partition, method, seed)]
    return cfg


def reseal(cfg, record_change=None, history_change=None) -> None:
    """Edit a run's metrics.json and/or history.csv, then record hashes that match the edit (integrity passes)."""
    metrics_path, history_path = Path(cfg.path(paths.RUN_METRICS)), Path(cfg.path(paths.RUN_HISTORY))
    record = json.loads(metrics_path.read_text())
    integrity = record.pop(INTEGRITY_KEY)
    if history_change is not None:
        history_path.write_text(history_change(history_path.read_text()))
        integrity["history.csv"] = hashlib.sha256(history_path.read_bytes()).hexdigest()
    if record_change is not None:
        record_change(record)
    integrity["metrics"] = hashlib.sha256(_canonical(record).encode()).hexdigest()
    metrics_path.write_text(json.dumps({**record, INTEGRITY_KEY: integrity}, indent=2) + "\n")


def set_value(key, value):
    return lambda record: record.__setitem__(key, value)


def replace_last_row(column: str, value: str):
    """history.csv with `column` of its last row (the final round) replaced by `value`."""
    def change(text: str) -> str:
        lines = text.splitlines()
        header = lines[0].split(",")
        cells = lines[-1].split(",")
        cells[header.index(column)] = value
        return "\n".join([*lines[:-1], ",".join(cells)]) + "\n"
    return change


SEALED = {
    "final_acc NaN": (set_value("final_acc", math.nan), None, paths.RUN_METRICS,
                      "final_acc is NaN, not a finite number in [0, 1]"),
    "final_acc 1.5": (set_value("final_acc", 1.5), None, paths.RUN_METRICS, "final_acc is 1.5, outside [0, 1]"),
    "final_acc -0.1": (set_value("final_acc", -0.1), None, paths.RUN_METRICS, "final_acc is -0.1, outside [0, 1]"),
    "final_loss inf": (set_value("final_loss", math.inf), None, paths.RUN_METRICS, "final_loss is Infinity"),
    "final_acc a string": (set_value("final_acc", "0.9"), None, paths.RUN_METRICS, "final_acc is '0.9', not a number"),
    "negative traffic": (set_value("total_bytes_up", -5), None, paths.RUN_METRICS,
                         "total_bytes_up is -5, outside [0, "),
    "final_acc missing": (lambda record: record.pop("final_acc"), None, paths.RUN_METRICS,
                          "a finished run without final_acc"),
    "unknown status": (set_value("status", "running"), None, paths.RUN_METRICS,
                       "status 'running' is neither 'finished' nor 'diverged'"),
    "history test_acc NaN": (None, replace_last_row("test_acc", "nan"), paths.RUN_HISTORY,
                             "round 4: test_acc is NaN"),
    "history per-class accuracy 7": (None, replace_last_row("test_acc_class3", "7.0"), paths.RUN_HISTORY,
                                     "round 4: test_acc_class3 is 7.0, outside [0, 1]"),
    "history per-class accuracy inf": (None, replace_last_row("test_acc_class3", "inf"), paths.RUN_HISTORY,
                                       "round 4: test_acc_class3 is Infinity"),
}


@pytest.mark.parametrize("damage", sorted(SEALED))
def test_the_reader_every_consumer_shares_refuses_a_sealed_impossible_number_naming_the_file_and_why(
        unpartitioned, damage) -> None:
    record_change, history_change, template, reason = SEALED[damage]
    cfg = the_run(write_runs(unpartitioned))
    reseal(cfg, record_change, history_change)
    for read in (read_metrics, read_history):   # whatever a consumer reads of the run, the whole run is checked
        with pytest.raises(RunFileError) as refused:
            read(cfg)
        assert str(refused.value).startswith(f"{cfg.path(template)}: ") and reason in str(refused.value)


# the commands' all or nothing, for a number in each file and each way of being wrong
BUILT_AGAIN = ["final_acc NaN", "final_loss inf", "final_acc 1.5", "final_acc missing", "history test_acc NaN"]


@pytest.mark.parametrize("damage", BUILT_AGAIN)
def test_a_sealed_run_file_with_an_impossible_number_is_refused_and_no_table_comparison_or_ledger_moves(
        project, capsys, damage) -> None:
    runs = write_runs(project)
    before = built(project, capsys)
    record_change, history_change, template, reason = SEALED[damage]
    cfg = the_run(runs)
    reseal(cfg, record_change, history_change)
    for name, command in COMMANDS.items():
        assert main(command) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err   # one line, no traceback
        assert str(cfg.path(template)) in err and reason in err, (name, err)
    after = {name: (project / name).read_bytes() for name in before}
    assert after == before   # every table, comparison and ledger byte for byte as it was
    assert sorted(str(p.relative_to(project)) for p in (project / "results").rglob("*") if p.is_file()
                  and "runs" not in p.relative_to(project / "results").parts[:1]) == sorted(before)


def test_a_diverged_run_recorded_as_fedskew_records_one_is_still_a_result(project, capsys) -> None:
    runs = write_runs(project, diverged={("dir0.5", "fedlc", 1)})
    cfg = the_run(runs)
    assert read_metrics(cfg)["status"] == "diverged"
    assert read_history(cfg)[0]["round"] == ROUNDS[0]
    for command in COMMANDS.values():
        assert main(command) == 0, capsys.readouterr().err
    table = (project / "results/tables/tiny.md").read_text()
    assert "(n=2; 1 diverged)" in table
    assert "fedlc diverged on seeds [1]" in (project / "results/tables/compare/tiny.md").read_text()


def test_a_class_the_test_set_lacks_is_recorded_as_nan_and_accepted(unpartitioned) -> None:
    # evaluate records NaN for a class with no test sample (fedskew.engine.evaluate): not a wrong number
    cfg = the_run(write_runs(unpartitioned))
    reseal(cfg, history_change=replace_last_row("test_acc_class3", "nan"))
    assert math.isnan(read_history(cfg)[-1]["test_acc_class3"])


def test_a_cell_whose_seeds_do_not_all_have_a_number_is_refused_not_labelled_with_the_wrong_n() -> None:
    import pandas as pd

    runs = pd.DataFrame([{"dataset": "digits", "partition": "dir0.5", "method": "fedavg", "seed": seed,
                          "status": "finished", "final_acc": acc} for seed, acc in enumerate([0.5, math.nan, 0.7])])
    with pytest.raises(ValueError, match=r"digits / dir0.5 / fedavg: 3 seeds finished, 2 with a final_acc"):
        statistics_over_seeds(runs)


def test_writing_a_finished_run_with_a_non_finite_number_is_refused_and_leaves_no_file(unpartitioned) -> None:
    cfg = load_params(unpartitioned / "params.yaml").suite_runs("tiny")[0]
    with pytest.raises(RunFileError, match=r"final_loss is Infinity"):
        write_run_files(cfg, [history_row(cfg, 2)], {**final_record(cfg), "final_loss": math.inf})
    assert not Path(cfg.path(paths.RUN_METRICS)).exists() and not Path(cfg.path(paths.RUN_HISTORY)).exists()


def test_a_diverged_runs_non_finite_summary_is_written_as_null(unpartitioned) -> None:
    cfg = load_params(unpartitioned / "params.yaml").suite_runs("tiny")[0]
    write_run_files(cfg, [history_row(cfg, 2)], {**diverged_record(), "final_acc": math.nan, "final_loss": math.inf})
    text = Path(cfg.path(paths.RUN_METRICS)).read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = read_metrics(cfg)
    assert record["final_acc"] is None and record["final_loss"] is None
