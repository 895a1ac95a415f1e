"""kill -9 of the whole workflow at random moments, then a resume: nothing lost, nothing different.

Each trial starts a small suite under Snakemake in a fresh project (so the MLflow store is
created during the trial, the moment that used to brick it), kills the job group with
SIGKILL at random moments, unlocking and resuming after each kill as a user would. The
results must be byte-identical to an uninterrupted run, and the MLflow store must hold
exactly one FINISHED run per configuration. `make test` runs 6 kills in one project (about
two minutes); the soak runs 40 more, in 20 projects, over a larger suite:
`.venv/bin/python -m pytest -m soak tests/reliability`.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fedskew import tracking
from tests.helpers import TINY_PARAMS, isolated_env, make_copy, venv_bin

pytest.importorskip("mlflow")

COMPARED = ("results", "data/partitions")
NOT_COMPARED = ("results/checkpoints",)  # the means of resuming, not a result


def small_suite(methods: list[str], seeds: list[int]) -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=methods, seeds=seeds)
    params["training"]["tiny"].update(rounds=4, checkpoint_every=1, eval_every=2, threads=1)
    return params


def snakemake(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([venv_bin("snakemake"), "--cores", "2", *args], cwd=root, env=isolated_env(root),
                          capture_output=True, text=True, timeout=600)


def kill_at(root: Path, delay: float, until_file: str | None = None) -> None:
    """Run (or resume) the workflow; SIGKILL its whole process group after `delay` s or once `until_file` appears."""
    process = subprocess.Popen([venv_bin("snakemake"), "--cores", "2", "--rerun-incomplete"], cwd=root,
                               env=isolated_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and process.poll() is None:
        if until_file and list(root.glob(until_file)):
            break
        time.sleep(0.01)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def digests(root: Path) -> dict[str, str]:
    out = {}
    for top in COMPARED:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not relative.startswith(NOT_COMPARED):
                out[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def mlflow_runs(root: Path) -> list[tuple[str, str]]:
    """(fedskew run id, status) of every MLflow run of the suite."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fedskew/tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return sorted((r.data.tags.get("fedskew.run_id", "?"), r.info.status) for r in runs)


def check_trial(root: Path, reference: dict[str, str], configurations: int, what: str) -> None:
    got = digests(root)
    assert sorted(got) == sorted(reference), f"{what}: different files"
    changed = [name for name in reference if got[name] != reference[name]]
    assert not changed, f"{what}: not byte-identical: {changed}"
    runs = mlflow_runs(root)
    assert len(runs) == configurations and {status for _, status in runs} == {"FINISHED"}, f"{what}: {runs}"
    assert len({key for key, _ in runs}) == configurations, f"{what}: a configuration recorded twice: {runs}"


def project_copy(folder: Path, params: dict) -> Path:
    folder.mkdir()
    return make_copy(folder, params)


def kill_trials(tmp_path: Path, params: dict, trials: int, kills: int, seed: int) -> None:
    """`trials` fresh projects; each is killed `kills` times at random moments, resumed after each
    kill, and finally checked against an uninterrupted run.

    A kill lands `uniform(0.05, 1) x` (a reference run's duration) after the (re)start, so
    kills fall into every stage: download, partitioning, training, logging, aggregation.
    Trial 0's first kill is aimed at the creation of the MLflow store.
    """
    configurations = len(params["suites"]["tiny"]["methods"]) * len(params["suites"]["tiny"]["seeds"])
    reference_root = project_copy(tmp_path / "reference", params)
    start = time.monotonic()
    done = snakemake(reference_root)
    duration = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-5000:]
    reference = digests(reference_root)
    assert any(name.endswith("metrics.json") for name in reference)
    check_trial(reference_root, reference, configurations, "uninterrupted run")

    rng = random.Random(seed)
    for trial in range(trials):
        root = project_copy(tmp_path / f"trial{trial}", params)
        moments = []
        for kill in range(kills):
            if trial == 0 and kill == 0:  # the moment that used to brick the store: while it is being created
                kill_at(root, duration, until_file=".mlflow.db.init-*")
                moments.append("while the MLflow store was being created")
            else:
                delay = rng.uniform(0.05, 1.0) * duration
                kill_at(root, delay)
                moments.append(f"{delay:.1f} s after a (re)start")
            store = root / "mlflow.db"
            assert not store.exists() or tracking.store._store_problem(store) is None  # never a half-made store
            # What `snakemake --unlock` does, without its seconds of start-up; the last resume uses the command.
            shutil.rmtree(root / ".snakemake" / "locks", ignore_errors=True)
        unlock = snakemake(root, "--unlock")
        assert unlock.returncode == 0, unlock.stderr[-3000:]
        done = snakemake(root, "--rerun-incomplete")
        assert done.returncode == 0, done.stderr[-5000:]
        check_trial(root, reference, configurations,
                    f"trial {trial}, killed {'; '.join(moments)} (reference run: {duration:.1f} s)")


@pytest.mark.slow
def test_kills_at_random_moments_resume_to_identical_results(tmp_path) -> None:
    # 6 kills in one project (the first while the MLflow store is created): each kill and restart costs
    # seconds of start-up, each project a whole uninterrupted run; the soak tries many more projects
    kill_trials(tmp_path, small_suite(["fedavg", "fedlc"], [0]), trials=1, kills=6, seed=0)


@pytest.mark.soak
def test_soak_kills_over_a_larger_suite(tmp_path) -> None:
    # 20 independent projects, two kills each, over split and stateful methods and two seeds
    kill_trials(tmp_path, small_suite(["fedavg", "fedlc", "scaffold", "scala"], [0, 1]), trials=20, kills=2,
                seed=1)
