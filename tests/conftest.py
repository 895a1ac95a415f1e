"""Shared fixtures: a tiny, fast params dict and a prepared project folder in tmp_path."""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path

import pytest
import yaml

from fedskew.numerics import cpu_pin

# The kernels a training job uses (`python -m fedskew` pins them first thing): tests that train in this
# process then compute what the jobs compute (fedskew.numerics.cpu_pin).
cpu_pin.apply()

REPO = Path(__file__).resolve().parents[1]

# Small enough that one run trains in about a second on one core.
TINY_PARAMS = {
    "run": {"suites": ["tiny"]},
    "datasets": {
        "digits": {"source": "digits"},
        "synth": {"source": "synthetic", "lam": 1.0, "mu": 1.0, "clients": 12, "seed": 0},
    },
    "partitions": {
        "dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 4, "min_size": 5},
        "q2": {"scheme": "quantity", "alpha": 2, "clients": 5},
        "natural": {"scheme": "natural"},
    },
    "methods": {
        "fedavg": {"algorithm": "fedavg"},
        "fedprox": {"algorithm": "fedprox", "mu": 0.01},
        "fedlc": {"algorithm": "fedlc", "tau": 1.0},
    },
    "suites": {
        "tiny": {
            "settings": [{"dataset": "digits", "partitions": ["dir0.5", "q2"]}],
            "methods": ["fedavg", "fedlc"],
            "seeds": [0, 1],
        },
    },
    "training": {
        "tiny": {"model": "mlp", "rounds": 4, "participation": 0.5, "local_epochs": 1, "batch_size": 32,
                 "lr": 0.05, "eval_every": 2, "checkpoint_every": 2, "threads": 1},
    },
}


@pytest.fixture(autouse=True)
def no_local_dataset_folders(monkeypatch):
    """Tests see none of this machine's dataset folders (FEDSKEW_DATA_DIRS, OS packages such as
    /usr/share/datasets/fashion-mnist) and fetch no registry package: a test that wants one names it itself."""
    from fedskew.data import sources

    monkeypatch.delenv(sources.ENV_VAR, raising=False)
    monkeypatch.setattr(sources, "OS_PACKAGES", {})
    monkeypatch.setattr(sources, "REGISTRY_PACKAGES", {})


# A project with Fashion-MNIST alone (the tests of its local sources and of the OS package).
FASHION_PARAMS = {
    "run": {"suites": ["s"]},
    "datasets": {"fashionmnist": {"source": "fashionmnist"}},
    "partitions": {"iid": {"scheme": "iid", "clients": 2}},
    "methods": {},
    "suites": {"s": {"settings": [{"dataset": "fashionmnist", "partitions": ["iid"]}], "methods": ["fedavg"],
                     "seeds": [0]}},
    "training": {},
}


@pytest.fixture
def tiny_params() -> dict:
    return copy.deepcopy(TINY_PARAMS)


def single_setting(params: dict) -> dict:
    """One partition (dir0.5) and one seed: the `project` fixture then prepares only that."""
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"]["seeds"] = [0]
    return params


def method_config(params: dict, method: str, training: dict | None = None, label: str | None = None,
                  **hyperparameters):
    """The tiny digits/dir0.5 seed-0 run of any registered method (paper defaults unless overridden)."""
    import dataclasses

    from fedskew.algorithms import ALGORITHMS
    from fedskew.config import load_params

    base = load_params(params).run("tiny", "digits", "dir0.5", params["suites"]["tiny"]["methods"][0], 0)
    spec = {"algorithm": method, **ALGORITHMS[method].hyperparameters, **hyperparameters}
    return dataclasses.replace(base, method=label or method, method_spec=spec,
                               training={**base.training, **(training or {})})


@pytest.fixture
def project(tmp_path, tiny_params, monkeypatch):
    """A working directory with params.yaml written and every needed dataset and partition prepared."""
    from fedskew.cli import cmd_partition
    from fedskew.config import load_params
    from fedskew.data.registry import prepare

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDSKEW_TRACKING", "0")
    params = load_params(tmp_path / "params.yaml")
    for dataset in {d for d, _, _ in params.partitions_needed()}:
        prepare(dataset, params.dataset_spec(dataset))
    for dataset, partition, seed in sorted(params.partitions_needed()):
        cmd_partition(params, argparse.Namespace(dataset=dataset, partition=partition, seed=seed))
    return tmp_path


@pytest.fixture
def server():
    """A loopback HTTP server for fake dataset archives (tests/fixtures/fake_archives.py), closed afterwards."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    from fake_archives import LoopbackServer

    srv = LoopbackServer()
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow store with its schema in place: creating one costs seconds of migrations,
    so tests that are not about creating the store start from a copy of it."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def venv_bin(name: str) -> str:
    """A console script of the environment running the tests (snakemake, dvc, ...)."""
    import sys

    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


os.environ.setdefault("MPLBACKEND", "Agg")
