"""A dataset source of a researcher's own package, declared as an entry point of group fedskew.datasets: listed,
validated and trained as a built-in source; a plugin that cannot be used is refused naming where it comes from."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from tests.helpers import install_plugin, make_copy, run

pytestmark = pytest.mark.slow  # pip builds a package per test module

BLOBS = '''"""Gaussian blobs of a researcher's own: 3 classes of 8-dimensional points around seeded means."""

import torch

from fedskew.data.datasets.base import GeneratedSource
from fedskew.declarations import Hyperparameter


class Blobs(GeneratedSource):
    name = "myblobs"
    tabular = True
    input_shape = (8,)
    num_classes = 3
    train_size = 300
    test_size = 60
    options = {"seed": Hyperparameter(0, ref="seed")}

    def generate(self, spec):
        generator = torch.Generator().manual_seed(spec["seed"])
        means = 4 * torch.randn(3, 8, generator=generator)

        def draw(count):
            labels = torch.arange(count) % 3
            return means[labels] + torch.randn(count, 8, generator=generator), labels

        (x_train, y_train), (x_test, y_test) = draw(300), draw(60)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


class Misnamed(Blobs):
    name = "other"


NOT_A_SOURCE = 42
'''

PARAMS = {
    "run": {"suites": ["mine"]},
    "datasets": {"blobs": {"source": "myblobs"}},
    "partitions": {"dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 3, "min_size": 5}},
    "methods": {},
    "suites": {"mine": {"settings": [{"dataset": "blobs", "partitions": ["dir0.5"]}], "methods": ["fedavg"],
                        "seeds": [0]}},
    "training": {"mine": {"model": "mlp", "rounds": 2, "participation": 1.0, "local_epochs": 1, "batch_size": 32,
                          "lr": 0.05, "eval_every": 1, "checkpoint_every": 2, "threads": 1}},
}


def _project(tmp_path, site, params=PARAMS):
    root = make_copy(tmp_path, params)

    def fedskew(*args):
        return run([sys.executable, "-m", "fedskew", *args], root,
                   PYTHONPATH=os.pathsep.join([str(root / "src"), str(site)]), FEDSKEW_TRACKING="0")
    return root, fedskew


def test_a_plugin_source_is_listed_validated_and_trained(tmp_path) -> None:
    site = install_plugin(tmp_path, "my-blobs", {"fedskew.datasets": {"myblobs": "myblobs:Blobs"}},
                          {"myblobs.py": BLOBS})
    root, fedskew = _project(tmp_path, site)
    listed = fedskew("datasets")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:4] == ["blobs", "myblobs", "300", "60"] for line in listed.stdout.splitlines())
    assert fedskew("validate").returncode == 0
    bad = fedskew("--params", str(_write(root, {"seed": -1})), "validate")
    assert bad.returncode == 2 and "datasets.blobs.seed: -1 is out of range" in bad.stderr
    for command in (["download", "blobs"], ["partition", "--dataset", "blobs", "--partition", "dir0.5", "--seed", "0"],
                    ["train", "--suite", "mine", "--dataset", "blobs", "--partition", "dir0.5", "--method", "fedavg",
                     "--seed", "0"]):
        done = fedskew(*command)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    metrics = json.loads(next(root.glob("results/runs/mine/blobs/dir0.5/fedavg/seed0/metrics.json")).read_text())
    assert metrics["status"] == "finished" and metrics["final_acc"] > 0.5  # three separated blobs; chance is 1/3


def _write(root, options: dict):
    params = {**PARAMS, "datasets": {"blobs": {"source": "myblobs", **options}}}
    path = root / "other.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.mark.parametrize(("name", "value", "message"), [
    ("digits", "myblobs:Blobs", "'digits' is the name of a built-in dataset source; give the entry point another name"),
    ("myblobs", "myblobs:NOT_A_SOURCE", "is not a dataset source class"),
    ("myblobs", "myblobs:Misnamed", "the class sets name = 'other'"),
    ("myblobs", "no_such_module:Blobs", "failed to load: ModuleNotFoundError"),
])
def test_a_plugin_that_cannot_be_used_is_refused_naming_its_entry_point(tmp_path, name, value, message) -> None:
    site = install_plugin(tmp_path, "bad-blobs", {"fedskew.datasets": {name: value}}, {"myblobs.py": BLOBS})
    _, fedskew = _project(tmp_path, site)
    done = fedskew("validate")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert f"entry point {name!r}" in line and "distribution 'bad-blobs'" in line and message in line, line
    assert "Traceback" not in done.stderr
