"""Tests for fedskew.track: param flattening, git state, and MLflow logging (incl. concurrent writers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedskew import tracking

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

METRICS = ("accuracy", "loss", "balanced_accuracy")


def make_history(rounds: int, offset: float = 0.0) -> list[dict]:
    """Per-round rows whose values are simple functions of the round, so each point can be checked."""
    return [{"round": r, "accuracy": offset + r / 100, "loss": 10.0 - r / 10 + offset,
             "balanced_accuracy": offset + r, "note": "text is not a metric"}
            for r in range(1, rounds + 1)]


def expected_value(metric: str, step: int, offset: float = 0.0) -> float:
    return {"accuracy": offset + step / 100, "loss": 10.0 - step / 10 + offset,
            "balanced_accuracy": offset + step}[metric]


def test_flatten_params_nested_dicts_lists_and_none() -> None:
    params = {"method": "fedavg", "lr": 0.01, "model": {"name": "resnet8", "norm": {"kind": "group", "groups": 2}},
              "milestones": [50, 75], "betas": (0.9, 0.99), "decay": None, "empty": {}, "flag": True}
    assert tracking.flatten_params(params) == {
        "method": "fedavg", "lr": "0.01", "model.name": "resnet8", "model.norm.kind": "group",
        "model.norm.groups": "2", "milestones": "[50, 75]", "betas": "[0.9, 0.99]", "decay": "null",
        "empty": "{}", "flag": "True"}
    assert tracking.flatten_params({"b": 1}, prefix="a") == {"a.b": "1"}


def test_flatten_params_truncates_to_mlflow_limit_with_marker() -> None:
    flat = tracking.flatten_params({"long": "x" * 10_000, "list": list(range(3000)), "short": "y" * 6000})
    assert len(flat["long"]) == 6000 and flat["long"].endswith(tracking.runs.TRUNCATION_MARKER)
    assert len(flat["list"]) == 6000 and flat["list"].startswith("[0, 1, 2")
    assert flat["short"] == "y" * 6000  # exactly at the limit: untouched


def test_tracking_uri_default_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow-server:5000")
    assert tracking.tracking_uri(tmp_path) == "http://mlflow-server:5000"


def test_git_state_outside_a_repo_and_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = {"git.commit": "unknown", "git.dirty": "unknown"}
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert tracking.git_state(tmp_path) == unknown
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git executable at all
    assert tracking.git_state(tmp_path) == unknown


def test_git_state_in_a_repo_clean_then_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()
    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git not available")
    (tmp_path / "code.py").write_text("a = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "init")
    (tmp_path / "untracked_output.csv").write_text("x\n")  # untracked outputs do not make the tree dirty
    state = tracking.git_state(tmp_path)
    assert len(state["git.commit"]) == 40 and int(state["git.commit"], 16) >= 0
    assert state["git.dirty"] == "false"
    (tmp_path / "code.py").write_text("a = 2\n")
    assert tracking.git_state(tmp_path) == {"git.commit": state["git.commit"], "git.dirty": "true"}


def test_local_store_detection() -> None:
    assert tracking.store.local_store_path("sqlite:////abs/dir/mlflow.db") == Path("/abs/dir/mlflow.db")
    assert tracking.store.local_store_path("sqlite:///rel/mlflow.db?timeout=5") == Path("rel/mlflow.db")
    assert tracking.store.local_store_path("file:///abs/mlruns") == Path("/abs/mlruns")
    assert tracking.store.local_store_path("/abs/mlruns") == Path("/abs/mlruns")
    for remote in ("http://mlflow-server:5000", "https://x.org", "postgresql://u@h/db", "sqlite://"):
        assert tracking.store.local_store_path(remote) is None


def test_experiment_created_by_another_writer_in_between_is_reused() -> None:
    """A remote store takes no lock, so create_experiment can lose a race; the winner's experiment is used."""
    from mlflow.exceptions import MlflowException

    class RacingClient:
        def __init__(self) -> None:
            self.lookups = 0

        def get_experiment_by_name(self, name: str) -> object:
            self.lookups += 1
            return None if self.lookups == 1 else type("Experiment", (), {"experiment_id": "7", "tags": {}})()

        def create_experiment(self, name: str, artifact_location: str | None = None, tags=None) -> str:
            raise MlflowException(f"Experiment '{name}' already exists.")

        def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
            self.tagged = (experiment_id, key, value)

    client = RacingClient()
    assert tracking.runs._experiment_id(client, "e", None) == "7"
    assert client.tagged == ("7", "mlflow.experimentKind", "custom_model_development")


def test_log_run_records_params_tags_metrics_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       migrated_store: Path) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(migrated_store, tmp_path / "mlflow.db")  # the default store of a project at tmp_path
    (tmp_path / "history.csv").write_text("round,accuracy\n1,0.01\n")
    (tmp_path / "metrics.json").write_text('{"final": 1}')
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "curve.png").write_bytes(b"png")
    # more params (150) and metric points (1200) than one MLflow batch may carry
    per_class = {f"c{i}": i for i in range(147)}
    params = {"method": "fedprox", "fl": {"mu": 0.01, "rounds": 400}, "seeds": [0, 1], "per_class": per_class}
    run_id = tracking.log_run(project_root=tmp_path, experiment="suite-a", run_name="cifar10/fedprox/seed0",
                              params=params, history=make_history(400), tags={"suite": "suite-a", "seed": "0"},
                              artifacts=[tmp_path / "history.csv", tmp_path / "metrics.json", tmp_path / "figures"])

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "cifar10/fedprox/seed0"
    assert client.get_experiment(run.info.experiment_id).name == "suite-a"
    assert run.data.params == {"method": "fedprox", "fl.mu": "0.01", "fl.rounds": "400", "seeds": "[0, 1]",
                               **{f"per_class.c{i}": str(i) for i in range(147)}}
    assert run.data.tags["suite"] == "suite-a" and run.data.tags["seed"] == "0"
    assert {"git.commit", "git.dirty"} <= run.data.tags.keys()
    assert set(run.data.metrics) == set(METRICS)  # "round" and non-numeric values are not metrics
    for metric in METRICS:
        points = client.get_metric_history(run_id, metric)
        assert sorted(p.step for p in points) == list(range(1, 401))
        assert all(p.value == pytest.approx(expected_value(metric, p.step)) for p in points)
    assert sorted(f.path for f in client.list_artifacts(run_id)) == ["figures", "history.csv", "metrics.json"]
    artifact_dir = Path(client.download_artifacts(run_id, "", str(tmp_path / "dl")))
    assert (artifact_dir / "metrics.json").read_text() == '{"final": 1}'
    assert (artifact_dir / "figures" / "curve.png").read_bytes() == b"png"
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").resolve().as_uri())
    assert tracking.count_runs(f"sqlite:///{tmp_path}/mlflow.db", "suite-a") == 1
    assert tracking.count_runs(f"sqlite:///{tmp_path}/mlflow.db", "no-such-experiment") == 0


def test_a_run_replaced_under_a_new_run_id_stays_and_says_what_replaced_it(tmp_path: Path, monkeypatch,
                                                                          migrated_store: Path) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(migrated_store, tmp_path / "mlflow.db")

    def logged(key: str, name: str = "digits/dir0.1/fedprox/seed0") -> str:
        return tracking.log_run(project_root=tmp_path, experiment="fedskew/s", run_name=name, params={"mu": key},
                                history=make_history(2), tags={tracking.runs.RUN_KEY_TAG: key}, artifacts=[])

    old, other = logged("aaaa"), logged("cccc", name="digits/dir0.1/fedavg/seed0")
    new = logged("bbbb")  # mu changed: a new run id for the same grid point
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(old).data.tags[tracking.runs.REPLACED_TAG] == "bbbb"
    assert client.get_run(old).data.params == {"mu": "aaaa"}  # kept as it was, findable by its own id
    assert tracking.runs.REPLACED_TAG not in client.get_run(new).data.tags
    assert tracking.runs.REPLACED_TAG not in client.get_run(other).data.tags  # another grid point
    assert logged("bbbb") == new  # the same run id again continues its run and replaces nothing


def test_log_run_failed_status_and_env_uri_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    migrated_store: Path) -> None:
    other = tmp_path / "elsewhere" / "tracking.db"
    other.parent.mkdir()
    shutil.copy(migrated_store, other)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    run_id = tracking.log_run(project_root=tmp_path / "project", experiment="e", run_name="crashed", params={},
                              history=make_history(3), tags={}, artifacts=[], status="FAILED")
    assert other.exists() and not (tmp_path / "project" / "mlflow.db").exists()
    assert MlflowClient(tracking_uri=f"sqlite:///{other}").get_run(run_id).info.status == "FAILED"


def test_log_run_failure_midway_marks_run_failed_and_names_store(tmp_path: Path, migrated_store: Path) -> None:
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(RuntimeError, match="mlflow.db") as excinfo:
        tracking.log_run(project_root=tmp_path, experiment="e", run_name="r", params={"a": 1},
                         history=make_history(5), tags={}, artifacts=[tmp_path / "missing.csv"], uri=uri)
    assert "marked FAILED" in str(excinfo.value)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_log_run_rejects_unknown_status(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="status"):
        tracking.log_run(project_root=tmp_path, experiment="e", run_name="r", params={}, history=[], tags={},
                         artifacts=[], status="DONE", uri=f"sqlite:///{tmp_path}/mlflow.db")
    assert not (tmp_path / "mlflow.db").exists()


WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fedskew import tracking
    import mlflow.store.tracking.sqlalchemy_store  # the slow imports happen before the start line
    root, index = Path(sys.argv[1]), int(sys.argv[2])
    (root / f"ready{index}").touch()
    while not (root / "go").exists():
        time.sleep(0.005)
    history = [{"round": r, "accuracy": index + r / 100, "loss": 10.0 - r / 10 + index,
                "balanced_accuracy": index + r} for r in range(1, 51)]
    run_id = tracking.log_run(project_root=root, experiment="race", run_name=f"worker{index}",
                           params={"index": index, "cfg": {"lr": 0.1}}, history=history,
                           tags={"worker": str(index)}, artifacts=[])
    print(run_id)
""")


def test_concurrent_processes_lose_no_run_or_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several real processes log at the same moment into one store that does not exist yet."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    n_workers, rounds = 4, 50
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tracking.runs.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(i)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(n_workers)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(n_workers)):
        assert all(w.poll() is None for w in workers), [w.communicate() for w in workers]
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.01)
    assert not (tmp_path / "mlflow.db").exists()  # the store is created in the race itself
    (tmp_path / "go").touch()
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0] * n_workers, [err for _, err in outputs]

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert tracking.count_runs(uri, "race") == n_workers
    client = MlflowClient(tracking_uri=uri)
    run_ids = [out.strip().splitlines()[-1] for out, _ in outputs]
    assert len(set(run_ids)) == n_workers
    for run_id in run_ids:
        run = client.get_run(run_id)
        index = int(run.data.tags["worker"])
        assert run.info.status == "FINISHED" and run.info.run_name == f"worker{index}"
        assert run.data.params == {"index": str(index), "cfg.lr": "0.1"}
        for metric in METRICS:
            points = sorted(client.get_metric_history(run_id, metric), key=lambda p: p.step)
            assert [p.step for p in points] == list(range(1, rounds + 1))
            assert [p.value for p in points] == pytest.approx([expected_value(metric, s, index)
                                                               for s in range(1, rounds + 1)])
    assert sorted(int(client.get_run(r).data.tags["worker"]) for r in run_ids) == list(range(n_workers))


def test_experiments_are_model_training_ones_and_runs_carry_their_dataset(tmp_path: Path,
                                                                          migrated_store: Path) -> None:
    """`mlflow ui` opens an experiment on its runs table (not MLflow 3's GenAI overview) only when the
    experiment is tagged as model development; the runs table's Dataset column reads the dataset inputs."""
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("fedskew/old")  # a store written before fedskew tagged experiments
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    dataset = {"name": "digits", "sha256": "ab" * 32, "source": "/data/raw/digits/READY.json", "partition": "q2"}
    history = [{"round": 1, "test_acc": 0.5, "train_loss": 1.0, "bytes_up": 10, "test_acc_class0": 0.4,
                "method_extra": 1.0, "clients": 5}]
    run_ids = [tracking.log_run(project_root=tmp_path, experiment=name, run_name="r", params={}, history=history,
                                tags={tracking.RUN_KEY_TAG: f"key-{name}"}, artifacts=[], dataset=dataset)
               for name in ("fedskew/new", "fedskew/old")]
    # logged again (a backfill after a tracking failure): the same run, one dataset input
    tracking.log_run(project_root=tmp_path, experiment="fedskew/new", run_name="r", params={}, history=history,
                     tags={tracking.RUN_KEY_TAG: "key-fedskew/new"}, artifacts=[], dataset=dataset)

    for name in ("fedskew/new", "fedskew/old"):
        assert client.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development"
    for run_id in run_ids:
        run = client.get_run(run_id)
        (logged,) = run.inputs.dataset_inputs
        assert (logged.dataset.name, logged.dataset.digest) == ("digits", "ab" * 8)
        assert json.loads(logged.dataset.source) == {"uri": "/data/raw/digits/READY.json"}
        assert {t.key: t.value for t in logged.tags} == {"mlflow.data.context": "training",
                                                         "fedskew.partition": "q2"}
        # accuracies and losses open the run page; counters go to sections below them
        assert set(run.data.metrics) == {"accuracy/test_acc", "loss/train_loss", "traffic/bytes_up", "traffic/clients",
                                         "per_class/test_acc_class0", "method/method_extra"}
    assert len(client.search_runs([client.get_experiment_by_name("fedskew/new").experiment_id])) == 1


def test_mlflow_metric_sections() -> None:
    assert [tracking.mlflow_metric_key(k) for k in ("test_acc", "test_balanced_acc", "test_loss", "train_loss")] == \
        ["accuracy/test_acc", "accuracy/test_balanced_acc", "loss/test_loss", "loss/train_loss"]
    assert tracking.mlflow_metric_key("some_new_number") == "some_new_number"
    assert tracking.mlflow_metric_key("bytes_down_weights") == "traffic/bytes_down_weights"
    assert tracking.mlflow_metric_key("test_acc_class7") == "per_class/test_acc_class7"
    assert tracking.mlflow_metric_key("local_after_missing") == "local_drift/local_after_missing"


def test_ui_links_open_each_suite_on_its_runs_table(tmp_path: Path, migrated_store: Path) -> None:
    from fedskew.tracking.ui import ui_links

    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    ids = {name: client.create_experiment(name) for name in ("fedskew/default", "fedskew/methods", "other")}
    assert ui_links(uri, "http://127.0.0.1:5000") == [
        f"fedskew/{suite}: http://127.0.0.1:5000/#/experiments/{ids['fedskew/' + suite]}/runs"
        "?workflowType=machine_learning" for suite in ("default", "methods")]


class _ClashingClient:
    """log_inputs fails `clashes` times as an MLflow server does when another job inserted the same dataset."""

    def __init__(self, clashes: int) -> None:
        self.clashes, self.calls = clashes, 0

    def log_inputs(self, run_id, datasets):
        from mlflow.exceptions import MlflowException

        self.calls += 1
        if self.calls <= self.clashes:
            raise MlflowException("BAD_REQUEST: (sqlite3.IntegrityError) UNIQUE constraint failed: datasets.name")


def test_a_dataset_clash_with_another_job_is_retried(monkeypatch):
    from fedskew import tracking

    monkeypatch.setattr(tracking.runs.time, "sleep", lambda s: None)
    client = _ClashingClient(clashes=1)
    tracking.runs._log_dataset(client, "run", object())
    assert client.calls == 2  # the retry finds the other job's dataset and links it

    from mlflow.exceptions import MlflowException

    stubborn = _ClashingClient(clashes=10)
    with pytest.raises(MlflowException):
        tracking.runs._log_dataset(stubborn, "run", object())
    assert stubborn.calls == tracking.runs.DATASET_LOG_TRIES  # bounded
