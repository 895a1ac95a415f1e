"""`fedskew datasets` and `fedskew partitions`, a torch-free `--help` and `validate`, and data/README.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from fedskew.cli import main
from tests.conftest import REPO


@pytest.fixture
def tiny_project(tmp_path, tiny_params, monkeypatch):
    """The tiny params in a fresh folder where `digits` is prepared and `synth` was prepared for another seed."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    for dataset, spec, shapes in [
        ("digits", {"source": "digits", "test_fraction": 0.2, "seed": 0}, {"y_train": [1437], "y_test": [360]}),
        ("synth", {"source": "synthetic", "lam": 1.0, "mu": 1.0, "clients": 12, "dim": 60, "classes": 10, "seed": 7},
         {"y_train": [900], "y_test": [100]}),
    ]:
        (tmp_path / "data" / "raw" / dataset).mkdir(parents=True)
        (tmp_path / "data" / "raw" / dataset / "READY.json").write_text(json.dumps({"spec": spec, "shapes": shapes}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by their first cell."""
    return {line.split()[0]: line.split() for line in out.splitlines() if line and not line.startswith(" ")}


def test_datasets_lists_sizes_shape_arrival_and_whether_prepared(tiny_project, tiny_params, capsys):
    tiny_params["datasets"]["cifar10"] = {"source": "cifar10"}
    tiny_params["datasets"]["femnist"] = {"source": "femnist"}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["datasets"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["dataset"] == ["dataset", "source", "train", "test", "classes", "input", "arrives", "prepared"]
    assert rows["digits"] == ["digits", "digits", "1437", "360", "10", "1×8×8", "embedded", "yes"]
    # synth's READY.json is for seed 7, params.yaml wants seed 0: prepared for another spec
    assert rows["synth"][:2] == ["synth", "synthetic"] and rows["synth"][4:] == ["10", "60", "features",
                                                                                 "embedded", "other", "spec"]
    assert rows["cifar10"] == ["cifar10", "cifar10", "50000", "10000", "10", "3×32×32", "download", "no"]
    assert rows["femnist"] == ["femnist", "femnist", "?", "?", "62", "1×28×28", "files", "by", "hand", "no"]


def test_datasets_reads_the_sizes_of_a_prepared_dataset_from_its_manifest(tiny_project, capsys):
    ready = tiny_project / "data" / "raw" / "synth" / "READY.json"
    ready.write_text(json.dumps({"spec": {**json.loads(ready.read_text())["spec"], "seed": 0},
                                 "shapes": {"y_train": [900], "y_test": [100]}}))
    assert main(["datasets"]) == 0
    row = _rows(capsys.readouterr().out)["synth"]
    assert row[2:4] == ["900", "100"] and row[-1] == "yes"


def test_partitions_lists_parameters_with_defaults_and_the_suites_using_them(tiny_project, tiny_params, capsys):
    tiny_params["suites"]["other"] = {"settings": [{"dataset": "synth", "partitions": ["natural"]},
                                                   {"dataset": "digits", "partitions": ["q2"]}],
                                      "methods": ["fedavg"], "seeds": [0]}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["partitions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    entry = {line.split()[0]: (line, lines[i + 1].strip()) for i, line in enumerate(lines) if not line.startswith(" ")}
    assert entry["dir0.5"][0].split(None, 2) == ["dir0.5", "dirichlet",
                                                 "clients=4, beta=0.5, min_size=5, max_redraws=1000 (default)"]
    assert entry["dir0.5"][1] == "used by tiny (digits)"
    assert entry["q2"][0].split(None, 2)[1:] == ["quantity", "clients=5, alpha=2"]
    assert entry["q2"][1] == "used by tiny (digits); other (digits)"
    assert entry["natural"][0].split(None, 2)[1:] == ["natural", "no parameters"]
    assert entry["natural"][1] == "used by other (synth)"


def test_an_unused_partition_says_so(tiny_project, tiny_params, capsys):
    assert main(["partitions"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[out.index(next(line for line in out if line.startswith("natural"))) + 1].strip() == "used by no suite"


def _imported(args: list[str]) -> set[str]:
    """The modules `python -m fedskew <args>` imports, run from the repository (its real params.yaml)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedskew", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["validate"], ["datasets"], ["partitions"]],
                         ids=" ".join)
def test_help_validate_and_listings_import_neither_torch_nor_mlflow(args):
    heavy = {module for module in _imported(args)
             if module.split(".")[0] in ("torch", "mlflow", "pandas", "matplotlib", "sklearn")}
    assert not heavy, sorted(heavy)[:10]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_data_readme_is_versioned_while_the_data_is_ignored():
    assert (REPO / "data" / "README.md").is_file()

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0

    assert not ignored("data/README.md")
    assert ignored("data/raw/digits/tensors.pt") and ignored("data/partitions/digits/iid/seed0.npz")
