"""Per-client outcomes reach MLflow (fedskew.tracking.clients): per evaluated round, in the section `clients/`,
live and from run files; a run recorded without them (an older fedskew's, or while its partition was missing)
is logged again by the next backfill, into the same MLflow run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedskew import client_outcomes as co
from fedskew import tracking
from fedskew.tracking import clients

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

PARAMS = {"suite": "s", "dataset": "digits", "partition": "p", "seed": 0, "method": "fedavg"}
COUNTS = [[10, 0, 0], [5, 5, 0], [1, 1, 2], [0, 0, 7]]   # the hand example of test_client_outcomes.py
EXPECTED = {"clients/mean_acc": 0.5625, "clients/worst10_acc": 0.2}   # of per-class accuracies 0.9, 0.5, 0.2


def history() -> list[dict]:
    """Round 1 not evaluated; rounds 2 and 3 with per-class accuracies (round 3: each 0.1 higher)."""
    evaluated = [{"round": r, "test_acc": 0.5, "clients": 4, "train_loss": 1.0,
                  **{f"test_acc_class{c}": a + (r - 2) / 10 for c, a in enumerate([0.9, 0.5, 0.2])}} for r in (2, 3)]
    return [{"round": 1, "train_loss": 2.0, "clients": 4}, *evaluated]


def write_partition(root: Path) -> None:
    path = co.partition_summary(root, "digits", "p", 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"label_counts": COUNTS, "content_hash": "x"}))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_store: Path) -> MlflowClient:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(migrated_store, tmp_path / "mlflow.db")  # the default store of a project at tmp_path
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


def logged(root: Path, key: str = "run1") -> str:
    return tracking.log_run(project_root=root, experiment="fedskew/s", run_name="digits/p/fedavg/seed0",
                            params=PARAMS, history=history(), tags={tracking.RUN_KEY_TAG: key}, artifacts=[])


def test_a_backfill_logs_each_evaluated_rounds_outcomes_in_the_clients_section(tmp_path, store) -> None:
    write_partition(tmp_path)
    run = store.get_run(logged(tmp_path))
    assert run.data.tags[clients.TAG] == "logged"
    assert {k for k in run.data.metrics if k.startswith("clients/")} == {
        "clients/mean_acc", "clients/worst10_acc", "clients/spread_acc"}
    assert "traffic/clients" in run.data.metrics   # the history's participating clients keep their name
    for key, value in EXPECTED.items():
        points = sorted((p.step, p.value) for p in store.get_metric_history(run.info.run_id, key))
        assert [step for step, _ in points] == [2, 3]   # the evaluated rounds only
        assert points[0][1] == pytest.approx(value, abs=1e-12)
        assert points[1][1] == pytest.approx(value + 0.1, abs=1e-12)   # every class 0.1 higher: every client too
    spread = store.get_metric_history(run.info.run_id, "clients/spread_acc")
    assert [p.value for p in spread] == pytest.approx([co.summarise([0.9, 0.7, 0.45, 0.2])[2]] * 2, abs=1e-12)
    assert tracking.recorded_runs(f"sqlite:///{tmp_path}/mlflow.db", "fedskew/s") == {"run1": "FINISHED"}


def test_a_run_logged_without_its_partition_is_completed_by_the_next_backfill(tmp_path, store) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = logged(tmp_path)   # runs imported from elsewhere: their partition is not drawn here
    run = store.get_run(first)
    assert run.data.tags[clients.TAG] == "missing data/partitions/digits/p/seed0.json"
    assert not any(k.startswith("clients/") for k in run.data.metrics) and "accuracy/test_acc" in run.data.metrics
    # nothing to add while the partition is missing: recorded, not logged again by every backfill
    assert tracking.recorded_runs(uri, "fedskew/s", tmp_path) == {"run1": "FINISHED"}
    write_partition(tmp_path)   # drawn here: the next backfill completes it
    assert tracking.recorded_runs(uri, "fedskew/s", tmp_path) == {"run1": "FINISHED (no per-client outcomes)"}
    assert logged(tmp_path) == first   # the same MLflow run, continued
    run = store.get_run(first)
    assert run.data.tags[clients.TAG] == "logged"
    assert run.data.metrics["clients/mean_acc"] == pytest.approx(EXPECTED["clients/mean_acc"] + 0.1)
    assert len(store.get_metric_history(first, "accuracy/test_acc")) == 2   # its points stored once
    assert tracking.recorded_runs(uri, "fedskew/s", tmp_path) == {"run1": "FINISHED"}


def test_params_that_name_no_partition_log_as_before(tmp_path, store) -> None:
    run_id = tracking.log_run(project_root=tmp_path, experiment="e", run_name="r", params={"lr": 0.1},
                              history=history(), tags={tracking.RUN_KEY_TAG: "k"}, artifacts=[])
    run = store.get_run(run_id)
    assert run.data.tags[clients.TAG] == "not a fedskew run" and not any(k.startswith("clients/")
                                                                          for k in run.data.metrics)
    assert tracking.recorded_runs(f"sqlite:///{tmp_path}/mlflow.db", "e") == {"k": "FINISHED"}


def test_a_live_run_logs_them_as_its_rounds_come(tmp_path, store) -> None:
    write_partition(tmp_path)
    live = tracking.LiveRun(project_root=tmp_path, experiment="fedskew/s", run_name="live", params=PARAMS,
                            tags={tracking.RUN_KEY_TAG: "live"}, strict=True, flush_every_s=0.0).start()
    for row in history():
        live.log_round(row)   # each row sent at once (flush_every_s=0), as the tracking worker's LiveRun does
    assert store.get_metric_history(live.run_id, "clients/mean_acc")[0].value == pytest.approx(0.5625)
    live.end("FINISHED")
    assert [p.step for p in store.get_metric_history(live.run_id, "clients/worst10_acc")] == [2, 3]


def test_rows_whose_classes_the_partition_lacks_are_not_logged() -> None:
    assert clients.metric_values(history(), None) == []
    wrong = [[1, 2]] * 4   # a partition of two classes, a history of three
    assert clients.metric_values(history(), wrong) == []
    values = clients.metric_values(history(), COUNTS)
    assert [(k, s) for k, _, s in values] == [(co.mlflow_key(n), r) for r in (2, 3) for n in co.NAMES]


def test_track_logs_again_a_run_an_older_fedskew_recorded_without_them(project, monkeypatch, migrated_store) -> None:
    from fedskew import job
    from fedskew.config import load_params
    from fedskew.runfiles import write_run_files

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(migrated_store, project / "mlflow.db")
    params = load_params(project / "params.yaml")
    cfg = params.run("tiny", "digits", "q2", "fedavg", 0)
    rows = [{"round": r, "test_acc": 0.5, "test_loss": 1.0, **{f"test_acc_class{c}": c / 10 for c in range(10)}}
            for r in (2, 4)]
    write_run_files(cfg, rows, {"status": "finished", "final_round": 4, "final_acc": 0.5, "final_loss": 1.0})
    counts = {"logged": 1, "already recorded": 0, "not trained": 7, "failed": 0}
    assert job.track_suite(params, "tiny") == counts
    assert job.track_suite(params, "tiny") == {**counts, "logged": 0, "already recorded": 1}
    client = MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fedskew/tiny").experiment_id])
    final = co.final_outcomes(cfg)
    assert run.data.metrics["clients/mean_acc"] == pytest.approx(final.mean, abs=1e-12)
    assert run.data.metrics["clients/spread_acc"] == pytest.approx(final.spread, abs=1e-12)
    client.delete_tag(run.info.run_id, clients.TAG)   # as a run logged before per-client outcomes existed
    assert job.track_suite(params, "tiny") == counts   # logged again, into the same MLflow run
    (again,) = client.search_runs([client.get_experiment_by_name("fedskew/tiny").experiment_id])
    assert again.info.run_id == run.info.run_id and again.data.tags[clients.TAG] == "logged"


def test_an_unreadable_partition_summary_is_named_and_the_run_still_logged(tmp_path, store) -> None:
    path = co.partition_summary(tmp_path, "digits", "p", 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"content_hash": "x"}')   # no label_counts
    with pytest.raises(ValueError, match="seed0.json holds no readable label_counts"):
        co.read_label_counts(path)
    run = store.get_run(logged(tmp_path))
    assert run.data.tags[clients.TAG] == "unreadable seed0.json" and "accuracy/test_acc" in run.data.metrics
    assert not any(k.startswith("clients/") for k in run.data.metrics)
