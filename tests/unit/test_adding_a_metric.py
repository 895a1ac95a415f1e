"""A new metric is one entry in fedskew.metrics plus its computation in fedskew.engine.evaluate: registered here for
the test (the error rate, 1 − accuracy, lower is better), a tiny run trained by the real job and logged by the real
tracking shows it in history.csv, metrics.json, the MLflow run (in its section), the suite table's CSV and a paper
table's cell, with no other file touched. The registry's own entries keep the names and sections every existing
table, CSV and MLflow record uses."""

from __future__ import annotations

import argparse
import csv
import json
import shutil

import pytest
import yaml

from fedskew import metrics
from fedskew.metrics import Better, Kind, Metric, Scale, Statistic

PARAMS = {
    "run": {"suites": ["toy"]},
    "datasets": {"digits": {"source": "digits"}},
    "partitions": {"dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 4, "min_size": 5}},
    "methods": {"fedavg": {"algorithm": "fedavg"}},
    "suites": {"toy": {"settings": [{"dataset": "digits", "partitions": ["dir0.5"]}], "methods": ["fedavg"],
                       "seeds": [0]}},
    "training": {"toy": {"model": "mlp", "rounds": 3, "participation": 1.0, "local_epochs": 1,
                         "batch_size": 32, "lr": 0.05, "eval_every": 1, "checkpoint_every": 3, "threads": 1}},
}

ERROR_RATE = Metric("error_rate", Kind.EVALUATED, "test_error_rate", Better.LOWER, Scale.FRACTION, "accuracy",
                    "test error rate", statistics=(Statistic.FINAL, Statistic.BEST), suite_table=True)


@pytest.fixture
def error_rate_added(monkeypatch):
    """The error rate registered (one entry) with its computation; both undone afterwards."""
    from fedskew.engine import evaluate

    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, ERROR_RATE))
    monkeypatch.setitem(evaluate.COMPUTATIONS, "error_rate", lambda p: float((~p.correct).double().mean()))


@pytest.fixture
def toy_project(tmp_path, monkeypatch, migrated_store):
    """params.yaml, the digits and their partition prepared, and an empty MLflow store, in tmp_path."""
    from fedskew.cli import cmd_partition
    from fedskew.config import load_params
    from fedskew.data.registry import prepare

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(migrated_store, tmp_path / "mlflow.db")  # the project's default store
    params = load_params(tmp_path / "params.yaml")
    prepare("digits", params.dataset_spec("digits"))
    cmd_partition(params, argparse.Namespace(dataset="digits", partition="dir0.5", seed=0))
    return params


def test_a_registered_metric_reaches_the_history_mlflow_and_the_tables(error_rate_added, toy_project,
                                                                        tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from fedskew import job, paths
    from fedskew.report.tables import write_tables
    from fedskew.reproduce.layouts import CellSpec, paper_table_metrics
    from fedskew.reproduce.tables import read_cell
    from fedskew.runfiles import read_history, read_metrics

    params = toy_project
    cfg = params.run("toy", "digits", "dir0.5", "fedavg", 0)
    job.train_run(cfg)   # the real job and engine; no live tracker: the backfill below logs the run files
    history, record = read_history(cfg), read_metrics(cfg)
    evaluated = [row for row in history if "test_acc" in row]
    assert len(evaluated) == 3
    for row in evaluated:  # an independent expectation: every test sample is either right or wrong
        assert row["test_error_rate"] == pytest.approx(1 - row["test_acc"], abs=1e-12)
    assert record["final_error_rate"] == evaluated[-1]["test_error_rate"]
    assert record["best_error_rate"] == min(row["test_error_rate"] for row in evaluated)   # lower is better

    assert job.track_suite(params, "toy") == {"logged": 1, "already recorded": 0, "not trained": 0, "failed": 0}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fedskew/toy").experiment_id])
    assert "accuracy/test_error_rate" in run.data.metrics  # in its section, beside test_acc
    points = client.get_metric_history(run.info.run_id, "accuracy/test_error_rate")
    assert sorted((p.step, p.value) for p in points) == [(row["round"], row["test_error_rate"]) for row in evaluated]

    written = write_tables(params, "toy")
    (row,) = csv.DictReader(written["csv"].read_text().splitlines())
    assert float(row["final_error_rate_mean"]) == pytest.approx(record["final_error_rate"], abs=1e-6)
    assert row["final_error_rate_std"] == ""   # one seed: no spread
    assert float(row["best_round_error_rate_mean (not reported)"]) == pytest.approx(record["best_error_rate"],
                                                                                   abs=1e-6)
    flat = json.loads(written["json"].read_text())["digits/dir0.5/fedavg"]
    assert "final_error_rate_mean" not in flat  # the flat file keeps to the reported number and the traffic

    assert "final_error_rate" in paper_table_metrics() and ERROR_RATE.described == "test error rate in %"
    spec = CellSpec("toy", "digits", "dir0.5", "fedavg")
    cell = read_cell(params, spec, "final_error_rate", {"toy"})
    assert cell.seeds == {0: 100 * record["final_error_rate"]}   # shown in percent, as a paper prints it
    best = read_cell(params, CellSpec("toy", "digits", "dir0.5", "fedavg", statistic="best"), "final_error_rate",
                     {"toy"})
    assert best.seeds == {0: 100 * record["best_error_rate"]}
    assert (tmp_path / paths.TABLE.format(suite="toy", ext="md")).exists()


def test_a_registered_metric_without_a_computation_is_refused_by_name(monkeypatch) -> None:
    import torch

    from fedskew.engine.evaluate import evaluate

    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, ERROR_RATE))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(LookupError, match=r"\['error_rate'\].*COMPUTATIONS"):
        evaluate(model, torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]), 2)


def test_every_evaluated_metric_has_a_computation_and_every_name_is_one_entry() -> None:
    from fedskew.engine.evaluate import COMPUTATIONS

    assert [m.name for m in metrics.evaluated()] == list(COMPUTATIONS)
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names)) and len({m.column for m in metrics.METRICS}) == len(names)
    with pytest.raises(KeyError, match="registered"):
        metrics.metric("no_such_metric")


def test_the_registry_keeps_the_names_tables_and_mlflow_records_use() -> None:
    from fedskew.engine.summary import evaluation_row
    from fedskew.report.tables import table_values
    from fedskew.tracking import mlflow_metric_key

    row = evaluation_row({"loss": 0.5, "acc": 0.75, "balanced_acc": 0.7, "per_class_acc": [1.0, 0.5]})
    assert list(row) == ["test_loss", "test_acc", "test_balanced_acc", "test_acc_class0", "test_acc_class1"]
    assert [m.key(s) for s in Statistic for m in metrics.summarised(s)] == [
        "final_acc", "final_balanced_acc", "final_loss", "best_acc", "total_bytes_up", "total_bytes_down"]
    assert table_values() == ["final_acc", "final_balanced_acc", "best_acc", "total_bytes_up", "total_bytes_down"]
    assert metrics.reported_key() == "final_acc"
    # Every column the engine writes, in the section MLflow has always drawn it in.
    sections = {"test_loss": "loss", "test_acc": "accuracy", "test_balanced_acc": "accuracy",
                "test_acc_class0": "per_class", "test_acc_class12": "per_class", "train_loss": "loss",
                "clients": "traffic", "bytes_up": "traffic", "bytes_down": "traffic", "bytes_up_weights": "traffic",
                "bytes_down_activations": "traffic", "method_personal_acc": "method", "method_eta_g": "method",
                "local_before_missing": "local_drift", "local_after_majority": "local_drift"}
    assert {column: mlflow_metric_key(column) for column in sections} == {
        column: f"{section}/{column}" for column, section in sections.items()}
    assert mlflow_metric_key("round_seconds") == "round_seconds"   # of no known kind: its plain name


def test_an_evaluation_that_is_not_the_registrys_is_refused() -> None:
    from fedskew.engine.summary import evaluation_row

    with pytest.raises(KeyError, match=r"missing \['balanced_acc'\], not registered \['f1'\]"):
        evaluation_row({"loss": 0.5, "acc": 0.75, "per_class_acc": [1.0], "f1": 0.3})
