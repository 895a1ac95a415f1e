"""The MLflow store under faults: kills during its creation, damaged stores, retries, a failing tracker.

The run files are the truth and MLflow observes them: whatever happens to the store, a
trained result stands, a later job or `fedskew track` records it, and no fedskew run is
recorded twice.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedskew import paths, tracking
from fedskew.cli import cmd_train, main
from fedskew.config import load_params
from tests.helpers import REPO

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

HISTORY = [{"round": r, "test_acc": r / 10, "train_loss": 1.0 / r} for r in range(1, 6)]

# Creates a store the way plain MLflow does (all migrations in place, no protection against kills).
RAW_MLFLOW_INIT = "import sys; from mlflow.tracking import MlflowClient; " \
                  "MlflowClient(tracking_uri=f'sqlite:///{sys.argv[1]}').search_experiments()"
# Creates a store through fedskew.
FEDSKEW_INIT = "import sys; from fedskew import tracking; uri = f'sqlite:///{sys.argv[1]}'; " \
               "tracking.store.import_mlflow(uri); tracking.ensure_store(uri)"


def _kill_during(code: str, store: Path, delay: float) -> None:
    """Start `code` creating `store`, kill -9 it `delay` seconds after the store's first byte appears."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen([sys.executable, "-c", code, str(store)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if any(p.stat().st_size > 0 for p in store.parent.glob(f"*{store.name}*") if p.is_file()):
            break
        time.sleep(0.01)
    time.sleep(delay)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _log(root: Path, key: str = "run-a", history: list[dict] = HISTORY, status: str = "FINISHED") -> str:
    return tracking.log_run(project_root=root, experiment="e", run_name=key, params={"lr": 0.1}, history=history,
                            tags={tracking.RUN_KEY_TAG: key}, artifacts=[], uri=f"sqlite:///{root}/mlflow.db",
                            status=status)


def _runs(store: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("e")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


@pytest.mark.parametrize("delay", [0.3, 1.2])
def test_a_store_half_created_by_plain_mlflow_is_replaced_and_logging_works(tmp_path, delay) -> None:
    store = tmp_path / "mlflow.db"
    _kill_during(RAW_MLFLOW_INIT, store, delay)
    _log(tmp_path)
    assert tracking.store._store_problem(store) is None
    assert [r.info.status for r in _runs(store)] == ["FINISHED"]


@pytest.mark.parametrize("delay", [0.0, 1.0, 2.0])
def test_a_kill_while_fedskew_creates_the_store_leaves_no_store_or_a_whole_one(tmp_path, delay) -> None:
    store = tmp_path / "mlflow.db"
    _kill_during(FEDSKEW_INIT, store, delay)
    assert not store.exists() or tracking.store._store_problem(store) is None
    _log(tmp_path)
    assert [r.info.status for r in _runs(store)] == ["FINISHED"]
    assert not list(tmp_path.glob(".mlflow.db.init-*"))  # the killed attempt's copy is cleaned up


def test_garbage_without_runs_is_moved_aside_not_deleted(tmp_path) -> None:
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"this is not a database" * 100)
    _log(tmp_path)
    assert [p.read_bytes()[:22] for p in tmp_path.glob("mlflow.db.damaged-*")] == [b"this is not a database"]
    assert len(_runs(store)) == 1


def test_a_leftover_migration_table_in_a_store_with_runs_is_repaired_keeping_the_runs(tmp_path,
                                                                                      migrated_store) -> None:
    store = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, store)
    _log(tmp_path, "old-run")
    with sqlite3.connect(store) as db:  # what a kill in the middle of a batch migration leaves
        db.execute("CREATE TABLE _alembic_tmp_webhooks AS SELECT * FROM webhooks")
    assert "interrupted schema migration" in tracking.store._store_problem(store)
    _log(tmp_path, "new-run")
    assert tracking.store._store_problem(store) is None
    assert sorted(r.data.tags[tracking.RUN_KEY_TAG] for r in _runs(store)) == ["new-run", "old-run"]


def test_an_unrepairable_store_with_runs_is_left_alone_with_instructions(tmp_path, migrated_store) -> None:
    store = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, store)
    _log(tmp_path, "old-run")
    with sqlite3.connect(store) as db:
        db.execute("DROP TABLE latest_metrics")
    before = store.read_bytes()
    with pytest.raises(tracking.TrackingStoreError, match="mlflow db upgrade") as error:
        _log(tmp_path, "new-run")
    assert "holds 1 run(s)" in str(error.value) and "fedskew track --suite" in str(error.value)
    assert store.read_bytes() == before


def test_a_retry_continues_the_orphan_run_instead_of_adding_one(tmp_path, migrated_store) -> None:
    store = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, store)
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.create_experiment("e")
    orphan = client.create_run(experiment, tags={tracking.RUN_KEY_TAG: "run-a"})  # a kill left it RUNNING
    assert _log(tmp_path) == orphan.info.run_id
    assert _log(tmp_path) == orphan.info.run_id  # and logging it yet again adds nothing
    (run,) = _runs(store)
    assert run.info.status == "FINISHED"
    points = client.get_metric_history(run.info.run_id, "accuracy/test_acc")
    assert sorted(p.step for p in points) == [1, 2, 3, 4, 5]


# --- through the CLI: the tracker fails, training does not -----------------------------------------

def _train_args(params) -> argparse.Namespace:
    cfg = params.runs(["tiny"])[0]
    return argparse.Namespace(suite="tiny", dataset=cfg.dataset, partition=cfg.partition, method=cfg.method,
                              seed=cfg.seed, threads=1)


def test_a_failing_tracker_never_fails_training_and_track_backfills(project, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FEDSKEW_TRACKING", "1")
    params = load_params(project / "params.yaml")

    # The tracker runs in a worker process, which inherits the environment: give it a store it cannot create.
    (project / "not-a-folder").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'not-a-folder' / 'mlflow.db'}")
    cmd_train(params, _train_args(params))  # returns normally
    cfg = params.runs(["tiny"])[0]
    assert (project / cfg.path(paths.RUN_METRICS)).exists()
    assert "TRACKING FAILED" in caplog.text and "fedskew track --suite tiny" in caplog.text
    monkeypatch.undo()
    monkeypatch.chdir(project)

    store = project / "mlflow.db"
    assert main(["track", "--suite", "tiny"]) == 0  # one trained run logged, the others not trained yet
    recorded = tracking.recorded_runs(f"sqlite:///{store}", "fedskew/tiny")
    assert recorded == {cfg.run_id: "FINISHED"}
    assert main(["track", "--suite", "tiny"]) == 0  # repeating it adds nothing
    assert tracking.count_runs(f"sqlite:///{store}", "fedskew/tiny") == 1


def test_a_job_whose_engine_cannot_be_imported_ends_its_run_failed(project, monkeypatch, migrated_store) -> None:
    """The tracker starts before torch is imported; if that import fails (a broken install), the
    MLflow run ends FAILED with the error instead of staying RUNNING."""
    monkeypatch.setenv("FEDSKEW_TRACKING", "1")
    shutil.copy(migrated_store, project / "mlflow.db")
    uri = f"sqlite:///{project / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = load_params(project / "params.yaml")
    monkeypatch.setitem(sys.modules, "fedskew.engine.simulation", None)  # importing it raises ImportError
    with pytest.raises(ImportError):
        cmd_train(params, _train_args(params))
    monkeypatch.undo()
    cfg = params.runs(["tiny"])[0]
    assert not (project / cfg.path(paths.RUN_METRICS)).exists()
    assert tracking.recorded_runs(uri, "fedskew/tiny") == {cfg.run_id: "FAILED"}
    (run,) = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("fedskew/tiny").experiment_id])
    assert "import of fedskew.engine.simulation" in run.data.tags["fedskew.error"]


def test_track_refuses_altered_run_files(project, capsys) -> None:
    params = load_params(project / "params.yaml")
    cmd_train(params, _train_args(params))
    cfg = params.runs(["tiny"])[0]
    history = project / cfg.path(paths.RUN_HISTORY)
    history.write_text(history.read_text().replace("\n2,", "\n7,"))
    assert main(["track", "--suite", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "history.csv" in err and "does not match the sha256" in err and "--force" in err
    assert not (project / "mlflow.db").exists() or tracking.count_runs(
        f"sqlite:///{project / 'mlflow.db'}", "fedskew/tiny") == 0


def test_track_with_an_unknown_suite_names_it(project, capsys) -> None:
    assert main(["track", "--suite", "nope"]) == 2
    assert "--suite 'nope' is not defined" in capsys.readouterr().err

