"""Tracking in a worker process (`fedskew.tracking.worker`): it records the same MLflow run as the
in-process LiveRun, and whatever happens to the worker or the job, training goes on, the run
files are written and the MLflow run ends as it did with in-process tracking.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fedskew import paths, tracking
from fedskew.tracking.worker import SidecarRun
from tests.helpers import KILL_ROUNDS, REPO, live_run, metric_steps, mlflow_runs, wait_for_checkpoint

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow
PARAMS = {"training": {"lr": 0.05, "rounds": 300}, "model": "mlp", "seeds": [0, 1], "note": None}
TAGS = {tracking.RUN_KEY_TAG: "sidecar-run", "fedskew.config_hash": "sidecar-run"}


def _history(rounds: int) -> list[dict]:
    """Rows like the engine's: every round a loss and traffic, every fifth an evaluation; some
    values NaN or infinite (a diverging run), which must reach MLflow as they are."""
    rows = []
    for r in range(1, rounds + 1):
        row = {"round": r, "train_loss": 1.0 / r, "clients": 5, "bytes_up": 1000 * r, "bytes_down": 2000 * r}
        if r % 5 == 0:
            row.update({"test_acc": r / rounds, **{f"test_acc_class{c}": c / 10 for c in range(10)}})
        rows.append(row)
    rows[6]["train_loss"], rows[7]["train_loss"], rows[8]["train_loss"] = math.nan, math.inf, -math.inf
    return rows


def _points(client: MlflowClient, run_id: str) -> dict[str, list[tuple]]:
    """Every metric's points as (step, value, timestamp); NaN as a string, since NaN != NaN."""
    run = client.get_run(run_id)
    return {key: sorted((p.step, "nan" if math.isnan(p.value) else p.value, p.timestamp)
                        for p in client.get_metric_history(run_id, key)) for key in run.data.metrics}


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return sorted(found)


def test_the_worker_records_the_same_run_as_the_in_process_live_run(tmp_path, migrated_store) -> None:
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "curve.png").write_bytes(b"png")
    artifacts = [tmp_path / "metrics.json", tmp_path / "figures"]
    history = _history(300)  # about 2 300 values: more than one batch of MAX_METRICS_PER_BATCH
    client = MlflowClient(tracking_uri=uri)
    runs = {}
    for kind in (tracking.LiveRun, SidecarRun):
        live = kind(project_root=tmp_path, experiment=kind.__name__, run_name="digits/dir0.5/fedavg/seed0",
                    params=PARAMS, tags=TAGS, uri=uri).start()
        for row in history:
            live.log_round(row)
            if kind is SidecarRun and row["round"] == 1:
                live.await_first_round()  # round 1 is in MLflow now, while the job trains on
                assert [p.step for p in client.get_metric_history(live.run_id, "loss/train_loss")] == [1]
        live.end("FINISHED", artifacts, {"fedskew.threads": "1"})
        assert live.error is None
        runs[kind] = client.get_run(live.run_id)

    in_process, worker = runs[tracking.LiveRun], runs[SidecarRun]
    assert worker.info.status == in_process.info.status == "FINISHED"
    assert worker.data.params == in_process.data.params
    assert worker.data.tags == in_process.data.tags
    points = {kind: _points(client, run.info.run_id) for kind, run in runs.items()}
    # the same values at the same steps, each point time-stamped with its own run's start
    for kind, run in runs.items():
        assert {t for series in points[kind].values() for _, _, t in series} == {run.info.start_time}
    assert ({key: [p[:2] for p in series] for key, series in points[SidecarRun].items()}
            == {key: [p[:2] for p in series] for key, series in points[tracking.LiveRun].items()})
    assert len(points[SidecarRun]["loss/train_loss"]) == 300
    assert len(points[SidecarRun]["per_class/test_acc_class9"]) == 60
    assert _artifacts(client, worker.info.run_id) == _artifacts(client, in_process.info.run_id) == [
        "figures/curve.png", "metrics.json"]


def test_the_worker_speaks_json_lines_and_never_imports_torch(tmp_path, migrated_store) -> None:
    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    no_torch = ("import runpy, sys; sys.modules['torch'] = None; "  # importing torch now raises ImportError
                "runpy.run_module('fedskew.tracking.worker', run_name='__main__')")
    commands = [{"command": "start", "project_root": str(tmp_path), "experiment": "e", "run_name": "r",
                 "params": PARAMS, "tags": TAGS, "uri": uri, "flush_every_s": 10.0},
                {"command": "rows", "rows": [{"round": 1, "train_loss": math.nan, "test_acc": 0.5}]},
                {"command": "rows", "rows": [{"round": 2, "train_loss": math.inf, "test_acc": 0.75}]},
                {"command": "end", "status": "FINISHED", "artifacts": [], "tags": {}}]
    worker = subprocess.run([sys.executable, "-c", no_torch], input="".join(json.dumps(c) + "\n" for c in commands),
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert worker.returncode == 0, worker.stderr[-3000:]
    first, last = map(json.loads, worker.stdout.splitlines())  # after the first rows, and after the end
    assert (first["after"], last["after"]) == ("rows", "end")
    assert first["error"] is None and last["error"] is None and first["run_id"] and last["run_id"] == first["run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(first["run_id"]).info.status == "FINISHED"
    history = client.get_metric_history(first["run_id"], "loss/train_loss")
    losses = [p.value for p in sorted(history, key=lambda p: p.step)]
    assert math.isnan(losses[0]) and losses[1] > 1e300  # MLflow stores infinity as the largest float


def test_a_worker_that_cannot_reach_its_store_fails_tracking_not_training(tmp_path) -> None:
    (tmp_path / "not-a-folder").write_text("")
    live = SidecarRun(project_root=tmp_path, experiment="e", run_name="r", params=PARAMS, tags=TAGS,
                      uri=f"sqlite:///{tmp_path / 'not-a-folder' / 'mlflow.db'}").start()
    live.log_round({"round": 1, "train_loss": 0.5})
    live.await_first_round()
    assert live.error is not None and "opening the MLflow run failed" in live.error
    live.log_round({"round": 2, "train_loss": 0.25})  # ignored, as by LiveRun after a failure
    live.end("FINISHED")  # returns: the worker records nothing more for this run, and exits


# --- whole training jobs ---------------------------------------------------------------------------

# `python -m fedskew`, noting whether torch was imported already when the tracker was started
# SIGINT is reset to Python's handler: a shell starts background jobs (a suite run with `&`) with
# SIGINT ignored, and an ignored SIGINT is inherited, so Ctrl-C would otherwise not reach the job.
_MAIN = """import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import fedskew.tracking.worker as sidecar
start = sidecar.SidecarRun.start
def noting_start(self):
    print("torch imported before the tracker started:", "torch" in sys.modules, flush=True)
    return start(self)
sidecar.SidecarRun.start = noting_start
from fedskew.cli import main
sys.exit(main())
"""


def _train(project: Path, cfg, uri: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_TRACKING_URI": uri, "FEDSKEW_TRACKING": "1",
           "FEDSKEW_TRACKING_FLUSH_S": "0.5"}
    return subprocess.Popen([sys.executable, "-c", _MAIN, "train", "--suite", cfg.suite, "--dataset", cfg.dataset,
                             "--partition", cfg.partition, "--method", cfg.method, "--seed", str(cfg.seed)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(job: subprocess.Popen, code: int = 0) -> str:
    """Wait for the job, check its exit code and that it started the tracker before importing torch; its log."""
    out, err = job.communicate(timeout=300)
    assert job.returncode == code, err[-3000:]
    assert "torch imported before the tracker started: False" in out
    return err


def _worker_of(job: subprocess.Popen) -> int:
    for child in Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split():
        if b"fedskew.tracking.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError("the job has no tracking worker")


def _gone(pid: int, timeout: float) -> bool:
    """Whether process `pid` has exited (a zombie counts: it no longer runs) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def store(project, migrated_store) -> str:
    shutil.copy(migrated_store, project / "mlflow.db")
    return f"sqlite:///{project / 'mlflow.db'}"


def test_a_killed_worker_fails_tracking_not_the_job_and_track_backfills(project, store) -> None:
    cfg = live_run(project, rounds=KILL_ROUNDS)
    job = _train(project, cfg, store)
    wait_for_checkpoint(project, cfg, job)  # the run is in MLflow before the first checkpoint
    os.kill(_worker_of(job), signal.SIGKILL)
    log = _finish(job)
    assert "TRACKING FAILED" in log and "was killed by SIGKILL" in log
    assert f"python -m fedskew track --suite {cfg.suite}" in log
    assert (project / cfg.path(paths.RUN_METRICS)).exists()  # the run files are the truth
    (run,) = mlflow_runs(store, cfg)
    assert run.info.status == "RUNNING"

    backfill = subprocess.run([sys.executable, "-m", "fedskew", "track", "--suite", cfg.suite], cwd=project,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_TRACKING_URI": store},
                              capture_output=True, text=True, timeout=300, check=False)
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    (run,) = mlflow_runs(store, cfg)  # the same run, completed
    assert run.info.status == "FINISHED" and metric_steps(store, run.info.run_id) == Counter(range(1, KILL_ROUNDS + 1))


def test_a_job_killed_alone_leaves_its_run_running_and_the_retry_continues_it(project, store) -> None:
    """kill -9 of the job only (the OOM killer picks the largest process): the worker sees its
    stdin close, exits at once and leaves the run RUNNING, as a killed in-process job did."""
    cfg = live_run(project, rounds=KILL_ROUNDS)
    job = _train(project, cfg, store)
    wait_for_checkpoint(project, cfg, job)
    worker = _worker_of(job)
    job.kill()
    job.communicate(timeout=60)
    assert _gone(worker, timeout=30)
    (stopped,) = mlflow_runs(store, cfg)
    assert stopped.info.status == "RUNNING" and 1 <= len(metric_steps(store, stopped.info.run_id)) < KILL_ROUNDS

    assert "resuming after round" in _finish(_train(project, cfg, store))
    (run,) = mlflow_runs(store, cfg)
    assert run.info.run_id == stopped.info.run_id and run.info.status == "FINISHED"
    assert metric_steps(store, run.info.run_id) == Counter(range(1, KILL_ROUNDS + 1))


def test_ctrl_c_reaches_the_worker_too_but_the_job_records_killed(project, store) -> None:
    """SIGINT to the whole process group, as Ctrl-C in a terminal: the worker ignores it and
    records the KILLED status that the job sends."""
    cfg = live_run(project, rounds=KILL_ROUNDS)
    job = _train(project, cfg, store)
    wait_for_checkpoint(project, cfg, job)
    os.killpg(job.pid, signal.SIGINT)
    _finish(job, code=130)
    (run,) = mlflow_runs(store, cfg)
    assert run.info.status == "KILLED" and run.data.tags[tracking.ERROR_TAG] == "interrupted"
