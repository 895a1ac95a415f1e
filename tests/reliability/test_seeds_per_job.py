"""Several runs in one training job (`fedskew train --seed 0 1`, suites with `seeds_per_job: all`).

One process trains the seeds one after another with one tracking worker. Each run must come
out exactly as from a job of its own (run files byte for byte, its own MLflow run); a failed
run must not stop the others; a stopped job must leave every run resumable, and its retry
must record no run twice.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedskew import paths
from fedskew.config import load_params
from tests.helpers import KILL_ROUNDS, REPO, mlflow_runs

pytest.importorskip("mlflow")

pytestmark = pytest.mark.slow

# `python -m fedskew`, printing a line for every tracking worker it starts
_MAIN = """import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import fedskew.tracking.worker as sidecar
start = sidecar.SidecarWorker.start
def noting_start(self):
    print("tracking worker started", flush=True)
    return start(self)
sidecar.SidecarWorker.start = noting_start
from fedskew.cli import main
sys.exit(main())
"""


def _job(project: Path, cfg, seeds: list[int], uri: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDSKEW_TRACKING_FLUSH_S": "0.5",
           **({"MLFLOW_TRACKING_URI": uri, "FEDSKEW_TRACKING": "1"} if uri else {"FEDSKEW_TRACKING": "0"})}
    return subprocess.Popen([sys.executable, "-c", _MAIN, "train", "--suite", cfg.suite, "--dataset", cfg.dataset,
                             "--partition", cfg.partition, "--method", cfg.method,
                             "--seed", *map(str, seeds)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(job: subprocess.Popen, code: int = 0) -> tuple[str, str]:
    out, err = job.communicate(timeout=600)
    assert job.returncode == code, err[-3000:]
    return out, err


def _runs(project: Path, rounds: int | None = None) -> list:
    """The tiny suite's dir0.5 / fedavg runs, seeds 0 and 1 (optionally with other rounds)."""
    if rounds is not None:
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["training"]["tiny"].update(rounds=rounds, eval_every=1, checkpoint_every=1)
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    params = load_params(project / "params.yaml")
    return [params.run("tiny", "digits", "dir0.5", "fedavg", seed) for seed in (0, 1)]


def _files(project: Path, cfg) -> dict[str, bytes]:
    return {p: (project / cfg.path(p)).read_bytes() for p in (paths.RUN_HISTORY, paths.RUN_METRICS, paths.RUN_CONFIG)}


def _forget(project: Path, cfg) -> None:
    shutil.rmtree(project / cfg.path(paths.RUN_DIR))
    shutil.rmtree(project / cfg.path(paths.CHECKPOINT_DIR))


@pytest.fixture
def store(project, migrated_store) -> str:
    shutil.copy(migrated_store, project / "mlflow.db")
    return f"sqlite:///{project / 'mlflow.db'}"


def test_one_job_trains_each_seed_as_its_own_job_would_with_one_tracking_worker(project, store) -> None:
    runs = _runs(project)
    out, err = _finish(_job(project, runs[0], [0, 1], store))
    assert out.count("tracking worker started") == 1
    assert "TRACKING FAILED" not in err
    together = {cfg.seed: _files(project, cfg) for cfg in runs}
    for cfg in runs:
        [recorded] = mlflow_runs(store, cfg)
        assert recorded.info.status == "FINISHED"
        assert recorded.data.params["seed"] == str(cfg.seed)
        assert recorded.data.tags["fedskew.seed"] == str(cfg.seed)
        with open(project / cfg.path(paths.RUN_HISTORY), newline="") as history:
            last = list(csv.DictReader(history))[-1]
        assert recorded.data.metrics["accuracy/test_acc"] == pytest.approx(float(last["test_acc"]))
        _forget(project, cfg)
    for cfg in runs:  # each seed in a job of its own, without tracking
        _finish(_job(project, cfg, [cfg.seed], None))
        assert _files(project, cfg) == together[cfg.seed]


def test_a_failed_run_does_not_stop_the_others_and_the_job_names_it(project, store) -> None:
    runs = _runs(project)
    (project / runs[0].path(paths.PARTITION)).unlink()  # seed 0 cannot train; seed 1 can
    _, err = _finish(_job(project, runs[0], [0, 1], store), code=1)
    assert "1 of 2 runs failed: seed 0" in err
    assert not (project / runs[0].path(paths.RUN_METRICS)).exists()
    assert (project / runs[1].path(paths.RUN_METRICS)).exists()
    assert [r.info.status for r in mlflow_runs(store, runs[0])] == ["FAILED"]
    assert [r.info.status for r in mlflow_runs(store, runs[1])] == ["FINISHED"]


def test_a_job_stopped_in_its_second_run_is_resumed_by_its_retry_without_duplicate_runs(project, store) -> None:
    runs = _runs(project, rounds=KILL_ROUNDS)
    job = _job(project, runs[0], [0, 1], store)
    checkpoint = project / runs[1].path(paths.CHECKPOINT_DIR) / "last.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists():  # seed 0 has finished, seed 1 is training
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the second run never wrote a checkpoint: {job.stderr.read()[-3000:]}")
        time.sleep(0.01)
    os.killpg(job.pid, signal.SIGTERM)  # a preemption reaches the job and its worker
    _finish(job, code=143)
    assert [r.info.status for r in mlflow_runs(store, runs[0])] == ["FINISHED"]
    assert [r.info.status for r in mlflow_runs(store, runs[1])] == ["KILLED"]
    assert not (project / runs[1].path(paths.RUN_METRICS)).exists()
    first = _files(project, runs[0])

    _, err = _finish(_job(project, runs[0], [0, 1], store))  # the retry, as Snakemake would run it
    assert f"run {runs[0].run_id}: resuming after round {KILL_ROUNDS}" in err
    assert f"run {runs[1].run_id}: resuming after round" in err
    assert _files(project, runs[0]) == first  # restored from its last checkpoint, byte for byte
    for cfg in runs:
        [recorded] = mlflow_runs(store, cfg)  # continued, not recorded twice
        assert recorded.info.status == "FINISHED"
