"""Shared fixtures: a tiny, fast params dict and a prepared project folder in tmp_path.

Fixtures and hooks only: the constants and functions that tests share are in tests/helpers.py."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import pytest
import yaml

from fedskew import plugins
from fedskew.numerics import cpu_pin

# The kernels a training job uses (`python -m fedskew` pins them first thing): tests that train in this
# process then compute what the jobs compute (fedskew.numerics.cpu_pin).
cpu_pin.apply()

# fedskew's tests see the pieces fedskew ships, and the plugins a test installs itself (into a folder of its own that
# it puts on the path), never those a user installed in the environment: fedskew takes no plugin from the folders on
# the path as the tests start (fedskew.plugins.visible). Set before any test module is collected (some enumerate
# the methods as they are imported), and inherited by every command a test runs.
os.environ[plugins.IGNORED_FOLDERS] = os.pathsep.join(folder for folder in sys.path if folder)

# Before its first import: a failing assert in a helper reports its values, as in a test module.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers import REPO, TINY_PARAMS  # noqa: E402


@pytest.fixture(autouse=True)
def no_local_dataset_folders(monkeypatch):
    """Tests see none of this machine's dataset folders (FEDSKEW_DATA_DIRS, OS packages such as
    /usr/share/datasets/fashion-mnist) and fetch no registry package: a test that wants one names it itself."""
    from fedskew.data import sources

    monkeypatch.delenv(sources.ENV_VAR, raising=False)
    monkeypatch.setattr(sources, "OS_PACKAGES", {})
    monkeypatch.setattr(sources, "REGISTRY_PACKAGES", {})


@pytest.fixture
def tiny_params() -> dict:
    return copy.deepcopy(TINY_PARAMS)


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


os.environ.setdefault("MPLBACKEND", "Agg")
