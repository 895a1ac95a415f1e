"""Live tracking: a training job's MLflow run is RUNNING while it trains and ends FINISHED, FAILED
or KILLED; a resumed job continues the same run without duplicating or losing a round.

Each case runs against a real SQLite store and against a real `mlflow server` on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from fedskew import paths
from tests.helpers import (
    KILL_ROUNDS,
    REPO,
    MlflowServer,
    live_run,
    metric_steps,
    mlflow_runs,
    wait_for_checkpoint,
)

pytest.importorskip("mlflow")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking server on a free loopback port, with its own SQLite store (the cluster tests' one too)."""
    server = MlflowServer(tmp_path_factory.mktemp("server")).start(timeout_s=90)
    yield server.uri
    server.stop()


@pytest.fixture(params=["sqlite", "server"])
def store(request, project):
    """The tracking URI of the case: the project's own SQLite file, or the loopback server."""
    return f"sqlite:///{project / 'mlflow.db'}" if request.param == "sqlite" else request.getfixturevalue(
        "mlflow_server")


def _train(project, cfg, uri, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "MLFLOW_TRACKING_URI": uri,
           "FEDSKEW_TRACKING": "1", "FEDSKEW_TRACKING_FLUSH_S": "0.5"}
    return subprocess.Popen([sys.executable, "-m", "fedskew", "train", "--suite", cfg.suite, "--dataset", cfg.dataset,
                             "--partition", cfg.partition, "--method", cfg.method, "--seed", str(cfg.seed)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def _wait_for_round(project, cfg, uri, at_least: int, job: subprocess.Popen) -> None:
    """Until the live run shows `at_least` rounds and a checkpoint exists (so a kill leaves one)."""
    checkpoint = project / cfg.path(paths.CHECKPOINT_DIR) / "last.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = mlflow_runs(uri, cfg)
        if runs and checkpoint.exists() and len(metric_steps(uri, runs[0].info.run_id)) >= at_least:
            return
        if job.poll() is not None and not runs:
            pytest.fail(f"the job ended ({job.returncode}) without a live run: {job.stderr.read()[-3000:]}")
        time.sleep(0.1)
    pytest.fail("the live run never showed progress")


def test_a_finished_run_was_running_while_it_trained(project, store) -> None:
    # KILL_ROUNDS: long enough that round 1 shows up well before the end (with LIVE_ROUNDS a loaded
    # machine could see the run only once it had finished)
    cfg = live_run(project, rounds=KILL_ROUNDS)
    job = _train(project, cfg, store)
    _wait_for_round(project, cfg, store, 1, job)
    (running,) = mlflow_runs(store, cfg)
    assert running.info.status == "RUNNING"  # visible before the end
    assert job.wait(timeout=300) == 0, job.stderr.read()[-3000:]
    (run,) = mlflow_runs(store, cfg)
    assert run.info.run_id == running.info.run_id and run.info.status == "FINISHED"
    assert metric_steps(store, run.info.run_id) == Counter(range(1, KILL_ROUNDS + 1))
    # the tags trace the cell to its exact inputs
    assert run.data.tags["fedskew.partition_hash"] == json.loads(
        (project / cfg.path(paths.PARTITION_JSON)).read_text())["content_hash"]
    assert run.data.tags["fedskew.dataset_sha256"] == json.loads(
        (project / paths.RAW_READY.format(dataset=cfg.dataset)).read_text())["sha256"]
    assert run.data.tags["git.commit"] and run.data.tags["fedskew.config_hash"] == cfg.run_id


def test_a_failing_run_is_marked_failed_with_its_rounds(project, store) -> None:
    cfg = live_run(project, lr=1e6)  # diverges; on_divergence defaults to an error
    job = _train(project, cfg, store)
    assert job.wait(timeout=300) == 1
    (run,) = mlflow_runs(store, cfg)
    assert run.info.status == "FAILED" and "non-finite" in run.data.tags["fedskew.error"]


@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_run_is_continued_by_its_retry_without_duplicates(project, store, kill) -> None:
    cfg = live_run(project, rounds=KILL_ROUNDS)
    job = _train(project, cfg, store)
    wait_for_checkpoint(project, cfg, job)
    os.killpg(job.pid, kill)
    code = job.wait(timeout=60)
    (stopped,) = mlflow_runs(store, cfg)
    if kill == signal.SIGTERM:  # a preemption: the run says so, the job says how to go on
        assert code == 143 and "stopped by signal SIGTERM" in job.stderr.read()
        assert stopped.info.status == "KILLED"
    else:  # nothing could be recorded: the run stays RUNNING until its retry continues it
        assert stopped.info.status == "RUNNING"
    logged_before = metric_steps(store, stopped.info.run_id)
    assert 1 <= len(logged_before) < KILL_ROUNDS and set(logged_before.values()) == {1}

    retry = _train(project, cfg, store)
    assert retry.wait(timeout=300) == 0, retry.stderr.read()[-3000:]
    assert "resuming after round" in retry.stderr.read()
    (run,) = mlflow_runs(store, cfg)  # the same run, continued: not a second one
    assert run.info.run_id == stopped.info.run_id and run.info.status == "FINISHED"
    assert "fedskew.error" not in run.data.tags  # the kill's reason went with the kill
    assert metric_steps(store, run.info.run_id) == Counter(range(1, KILL_ROUNDS + 1))  # every round exactly once
