"""`fedskew datasets` and `fedskew partitions` (the named partitions, then every scheme, a plugin's included), a
torch-free `--help` and `validate`, `validate` naming the installed plugins of every kind, and data/README.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from fedskew.cli import main
from tests.helpers import REPO, install_plugin


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


def test_datasets_lists_sizes_shape_whether_prepared_and_where_from(tiny_project, tiny_params, capsys):
    tiny_params["datasets"]["cifar10"] = {"source": "cifar10"}
    tiny_params["datasets"]["femnist"] = {"source": "femnist"}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["datasets"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["dataset"] == ["dataset", "source", "train", "test", "classes", "input", "prepared", "from"]
    assert rows["digits"] == ["digits", "digits", "1437", "360", "10", "1×8×8", "yes", "embedded"]
    # synth's READY.json is for seed 7, params.yaml wants seed 0: prepared for another spec
    assert rows["synth"][:2] == ["synth", "synthetic"] and rows["synth"][4:] == ["10", "60", "features",
                                                                                 "other", "spec", "embedded"]
    assert rows["cifar10"] == ["cifar10", "cifar10", "50000", "10000", "10", "3×32×32", "no", "download",
                               "(www.cs.toronto.edu)"]
    assert rows["femnist"][:7] == ["femnist", "femnist", "?", "?", "62", "1×28×28", "no"]
    assert " ".join(rows["femnist"][7:]) == ("not available: place LEAF's JSON files in data/raw/femnist/train/ "
                                             "and test/")


def _from(out: str, dataset: str) -> str:
    """The `from` cell of a dataset's row (the last column: it may hold spaces)."""
    header = next(line for line in out.splitlines() if line.startswith("dataset "))
    row = next(line for line in out.splitlines() if line.startswith(f"{dataset} "))
    return row[header.index("from"):]


FMNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                "t10k-labels-idx1-ubyte.gz")


def _place(folder, names=FMNIST_FILES):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"x")  # looked for, not verified, by the listing


def test_datasets_says_where_each_source_comes_from_in_order(tiny_project, tiny_params, capsys, monkeypatch):
    from fedskew.data import sources

    tiny_params["datasets"]["fashionmnist"] = {"source": "fashionmnist"}
    tiny_params["datasets"]["fm_copy"] = {"source": "fashionmnist"}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))

    def listed(dataset="fashionmnist"):
        assert main(["datasets"]) == 0
        return _from(capsys.readouterr().out, dataset)

    assert listed() == "download (fashion-mnist.s3-website.eu-central-1.amazonaws.com)"
    package = tiny_project / "usr-share" / "fashion-mnist"
    monkeypatch.setattr(sources, "OS_PACKAGES", {"fashionmnist": sources.OsPackage("dataset-fashion-mnist", package)})
    _place(package, FMNIST_FILES[:3])  # one file short: the package folder does not serve the dataset
    assert listed() == ("OS package dataset-fashion-mnist (" + str(package) + ") + "
                        "download (fashion-mnist.s3-website.eu-central-1.amazonaws.com)")
    _place(package)
    assert listed() == f"OS package dataset-fashion-mnist ({package})"
    named = tiny_project / "mine"
    _place(named / "fashionmnist")
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", os.pathsep.join([str(tiny_project / 'absent'), str(named)]))
    assert listed() == f"folder {named / 'fashionmnist'} (from FEDSKEW_DATA_DIRS)"
    _place(tiny_project / "data" / "raw" / "fashionmnist")
    assert listed() == "data/raw/fashionmnist"
    ready = tiny_project / "data" / "raw" / "fm_copy" / "READY.json"
    ready.parent.mkdir(parents=True)
    ready.write_text(json.dumps({"spec": {"source": "fashionmnist"},
                                 "shapes": {"y_train": [60000], "y_test": [10000]}}))
    assert listed("fm_copy") == "prepared (data/raw/fm_copy)"


def test_datasets_says_what_to_do_for_a_local_imagenet_copy(tiny_project, tiny_params, capsys):
    tiny_params["datasets"]["imnet"] = {"source": "imagenet_subset"}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["datasets"]) == 0
    assert _from(capsys.readouterr().out, "imnet") == ("not available: set datasets.imnet.imagenet_dir to a local "
                                                       "ILSVRC-2012 copy")
    (tiny_project / "ilsvrc").mkdir()
    tiny_params["datasets"]["imnet"]["imagenet_dir"] = "ilsvrc"
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["datasets"]) == 0
    assert _from(capsys.readouterr().out, "imnet") == "folder ilsvrc"


def test_datasets_reads_the_sizes_of_a_prepared_dataset_from_its_manifest(tiny_project, capsys):
    ready = tiny_project / "data" / "raw" / "synth" / "READY.json"
    ready.write_text(json.dumps({"spec": {**json.loads(ready.read_text())["spec"], "seed": 0},
                                 "shapes": {"y_train": [900], "y_test": [100]}}))
    assert main(["datasets"]) == 0
    row = _rows(capsys.readouterr().out)["synth"]
    assert row[2:4] == ["900", "100"] and row[-2:] == ["yes", "embedded"]


def test_partitions_lists_parameters_with_defaults_and_the_suites_using_them(tiny_project, tiny_params, capsys):
    tiny_params["suites"]["other"] = {"settings": [{"dataset": "synth", "partitions": ["natural"]},
                                                   {"dataset": "digits", "partitions": ["q2"]}],
                                      "methods": ["fedavg"], "seeds": [0]}
    tiny_params["training"]["other"] = {"inherit": "tiny"}
    (tiny_project / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert main(["partitions"]) == 0
    lines = capsys.readouterr().out.split("\n\n")[0].splitlines()  # the named partitions, before the schemes
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


SCHEMES_HEADER = "schemes (what a partition's `scheme` names), with their required parameters and the others' defaults:"


def _schemes(out: str) -> dict[str, str]:
    """The schemes `partitions` lists after the named partitions: name -> what it says of the scheme."""
    lines = out.split("\n\n")[1].splitlines()
    assert lines[0] == SCHEMES_HEADER
    return {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}


def test_partitions_lists_every_scheme_with_its_required_parameters_and_defaults(tiny_project, capsys):
    from fedskew.data.partitions.registry import BUILT_IN

    assert main(["partitions"]) == 0
    schemes = _schemes(capsys.readouterr().out)
    assert list(schemes) == list(BUILT_IN)  # every built-in scheme, those no partition names included
    assert schemes["dirichlet"] == "required clients, beta; defaults min_size=10, max_redraws=1000"
    assert schemes["quantity"] == "required clients, alpha"
    assert schemes["natural"] == "no parameters"


# A plugin of every kind in one package: FedAvg under a name of its own, and the blobs source, the blocks scheme
# and the tiny net of the tests of each kind of plugin.
PLAIN = '''"""FedAvg under a name of its own."""

from fedskew.fl.fedavg import FedAvg


class Plain(FedAvg):
    """FedAvg, as a plugin."""

    name = "plain"
'''


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory):
    from tests.integration.test_dataset_plugins import BLOBS
    from tests.unit.test_model_plugins import TINYNET
    from tests.unit.test_partition_plugins import BLOCKS

    groups = {"fedskew.methods": {"plain": "everykind.method:Plain"}, "fedskew.datasets": {"myblobs":
              "everykind.source:Blobs"}, "fedskew.partitions": {"blocks": "everykind.scheme:Blocks"},
              "fedskew.models": {"tinynet": "everykind.model:tinynet"}}
    modules = {"everykind/__init__.py": "", "everykind/method.py": PLAIN, "everykind/source.py": BLOBS,
               "everykind/scheme.py": BLOCKS, "everykind/model.py": TINYNET}
    return install_plugin(tmp_path_factory.mktemp("every-kind"), "fedskew-every-kind", groups, modules)


def test_validate_names_the_plugins_of_every_kind_and_partitions_lists_the_installed_scheme(every_kind, tiny_project):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(every_kind)])}
    done = {command: subprocess.run([sys.executable, "-m", "fedskew", command], cwd=tiny_project, env=env,
                                    capture_output=True, text=True, timeout=300)
            for command in ("validate", "partitions")}
    assert done["validate"].returncode == 0, done["validate"].stderr[-3000:]
    assert ("; plugins: method plain (fedskew-every-kind), dataset source myblobs (fedskew-every-kind), partition "
            "scheme blocks (fedskew-every-kind), model tinynet (fedskew-every-kind); ") in done["validate"].stdout
    assert done["partitions"].returncode == 0, done["partitions"].stderr[-3000:]
    schemes = _schemes(done["partitions"].stdout)  # listed though no partition names it yet
    assert list(schemes)[-1] == "blocks"
    assert schemes["blocks"] == "required clients; defaults per_client=1 (plugin of fedskew-every-kind)"


def _imported(args: list[str]) -> set[str]:
    """The modules `python -m fedskew <args>` imports, run from the repository (its real params.yaml)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedskew", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["validate"], ["datasets"], ["partitions"], ["models"]],
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
