"""Models as their own single source, and models from installed packages (entry points of group fedskew.models).

What validation and `fedskew models` know of a model is derived from its declaration (fedskew.catalog.Model) by
building it on torch's meta device (fedskew.catalog.describe_model); the first tests hold that derivation to what
it must refuse. The others install scratch plugin packages with pip into folders of their own (`--target`), which
the commands find on their PYTHONPATH, as a researcher's installed package is found: a good one is listed,
validated, given its version in its runs' ids and trained; a broken one, one that takes a built-in model's name and
one that names no declaration are each refused in one line naming its distribution and entry point.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict
from math import prod
from pathlib import Path

import pytest
from torch import nn

from fedskew.catalog import DatasetInfo, describe_model
from fedskew.models import InputNeeds, Model, SplittableNet
from tests.helpers import TINY_PARAMS, install_plugin, make_copy, run

# --- describing a declaration (in this process) ----------------------------------------------------


def _net(info: DatasetInfo, width: int = 8, points: tuple[str, ...] = ("relu",)) -> SplittableNet:
    """A flattening net of `width` features (the docstring's first paragraph is what `fedskew models` prints).

    Not this paragraph."""
    stages = OrderedDict(flatten=nn.Flatten(), fc=nn.Linear(prod(info.input_shape), width), relu=nn.ReLU())
    return SplittableNet(stages, width, info.num_classes, points)


def test_a_declaration_is_described_from_its_builder():
    record = describe_model(Model(_net))
    assert record == {"summary": "A flattening net of `width` features (the docstring's first paragraph is what "
                                 "`fedskew models` prints).",
                      "needs": {"image": False, "shapes": [], "min_side": 1, "why": ""},
                      "split_points": {"relu": "relu"}, "feature_dim": 8}


def test_a_width_that_is_the_flattened_input_is_recorded_as_none():
    def flat(info):
        return SplittableNet(OrderedDict(flatten=nn.Flatten()), prod(info.input_shape), info.num_classes, ("flatten",))

    assert describe_model(Model(flat))["feature_dim"] is None


@pytest.mark.parametrize("declaration, message", [
    (Model("build"), "its build is a str, not a function of a DatasetInfo"),
    (Model(_net, needs={"image": True}), "its needs is a dict; write needs=InputNeeds(...)"),
    (Model(_net, version=0), "its version is 0; write a whole number, 1 or more"),
    (Model(_net, version=True), "its version is True"),
    (Model(_net, InputNeeds(image=True, shapes=((1, 4, 4),), min_side=8)), "its needs take no inputs"),
    (Model(lambda info: nn.Linear(2, 2)), "its build returned a Linear, not a fedskew.models.SplittableNet"),
    (Model(lambda info: _net(info, width=len(info.input_shape))),
     "its feature width (head.in_features) changes with the input (1 on 64; 3 on 3×1×1"),
    (Model(lambda info: _net(info, points=("relu",) if info.is_image else ("fc",))),
     "its split points change with the input"),
])
def test_a_declaration_that_cannot_be_used_is_refused_saying_why(declaration, message):
    with pytest.raises(ValueError) as raised:
        describe_model(declaration)
    assert message in str(raised.value), raised.value


def test_a_builder_that_fails_on_inputs_its_needs_allow_is_told_to_declare_them():
    def images_only(info):
        channels, height, width = info.input_shape  # vectors have one side
        return _net(DatasetInfo((channels + height + width,), info.num_classes, False, False))

    with pytest.raises(ValueError) as raised:
        describe_model(Model(images_only))
    assert str(raised.value).startswith("building it for 64 vectors failed: ValueError: not enough values to unpack")
    assert "say so in its needs (InputNeeds)" in str(raised.value)
    assert describe_model(Model(images_only, InputNeeds(image=True)))["feature_dim"] == 8


# --- plugins, installed -------------------------------------------------------------------------------

TINYNET = '''
"""A tiny CNN declared to fedskew as a model plugin."""

from collections import OrderedDict

from torch import nn

from fedskew.models import InputNeeds, Model, SplittableNet


def build(info):
    """TinyNet: one 3×3 conv and a 2×2 pool, then 16 features.

    Its cut points: `cut` after the pool, `late` after the features."""
    channels, height, width = info.input_shape
    stages = OrderedDict(conv=nn.Conv2d(channels, 4, 3, padding=1), relu=nn.ReLU(), pool=nn.MaxPool2d(2),
                         flatten=nn.Flatten(), fc=nn.Linear(4 * (height // 2) * (width // 2), 16), relu2=nn.ReLU())
    return SplittableNet(stages, 16, info.num_classes, {"cut": "pool", "late": "relu2"})


tinynet = Model(build, InputNeeds(image=True, min_side=4, why="its 2×2 pool needs a few pixels"), version=2)
'''

# distribution -> (entry point name, the module's text): one package a case
PACKAGES = {
    "fedskew-tinynet": ("tinynet", TINYNET),
    "fedskew-brokennet": ("brokennet", "import a_module_nobody_installed\n"),
    "fedskew-mlpclash": ("mlp", TINYNET),
    "fedskew-bareclass": ("barenet", TINYNET + "\nbarenet = build\n"),
}


def _install(scratch: Path, distribution: str) -> Path:
    """`distribution` written as a package with one entry point of group fedskew.models, installed offline into a
    folder of its own; that folder."""
    name, text = PACKAGES[distribution]
    module = distribution.removeprefix("fedskew-")
    attribute = "barenet" if name == "barenet" else "tinynet"
    return install_plugin(scratch, distribution, {"fedskew.models": {name: f"{module}:{attribute}"}},
                          {f"{module}/__init__.py": text})


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    scratch = tmp_path_factory.mktemp("model-plugins")
    return {distribution: _install(scratch, distribution) for distribution in PACKAGES}


def _params(model: str = "tinynet", **training) -> dict:
    """The tiny project training `model`, with a split method's suite cut at the plugin's `late` point."""
    params = copy.deepcopy(TINY_PARAMS)
    params["training"]["tiny"].update(model=model, **training)
    params["methods"]["sfl"] = {"algorithm": "splitfed_v1"}
    params["suites"]["split"] = {"settings": [{"dataset": "digits", "partitions": ["q2"]}], "methods": ["sfl"],
                                 "seeds": [0]}
    params["training"]["split"] = {**params["training"]["tiny"], "split_point": "late"}
    return params


def _in(root: Path, site: Path, *cmd: str) -> subprocess.CompletedProcess:
    """`cmd` in the scratch project, its own code and the installed plugin on the path."""
    return run([sys.executable, *cmd], root, PYTHONPATH=os.pathsep.join([str(root / "src"), str(site)]))


@pytest.mark.slow
def test_a_plugin_s_model_is_listed_validated_versioned_and_trained(sites, tmp_path):
    site = sites["fedskew-tinynet"]
    root = make_copy(tmp_path, _params())
    listed = _in(root, site, "-m", "fedskew", "models")
    assert listed.returncode == 0, listed.stderr[-3000:]
    lines = listed.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("tinynet "))
    assert lines[at] == ("tinynet          split points: cut (after pool), late (after relu2); default cut "
                         "(plugin of fedskew-tinynet)")
    assert lines[at + 1].strip() == "TinyNet: one 3×3 conv and a 2×2 pool, then 16 features."
    assert lines[0].startswith("logreg ")  # the built-in ones first

    validated = _in(root, site, "-m", "fedskew", "validate")
    assert validated.returncode == 0, validated.stderr[-3000:]
    # its declared version is in its runs' config (and so their ids); it builds, and trains a run
    script = textwrap.dedent('''
        import json
        from pathlib import Path
        from fedskew.config import load_params
        from fedskew.engine.simulation import run_training
        from fedskew.models import MODELS, build_model, example_info

        cfg = load_params(Path("params.yaml")).run("tiny", "digits", "q2", "fedavg", 0)
        net = build_model("tinynet", example_info("tinynet"))
        result = run_training(cfg)
        print(json.dumps({"versions": cfg.to_dict().get("numerics_versions"), "listed": "tinynet" in MODELS,
                          "features": net.head.in_features, "rounds": len(result.history)}))
    ''')
    for step in (["download", "--dataset", "digits"], ["partition", "--dataset", "digits", "--partition", "q2",
                                                        "--seed", "0"]):
        prepared = _in(root, site, "-m", "fedskew", *step)
        assert prepared.returncode == 0, prepared.stderr[-3000:]
    trained = _in(root, site, "-c", script)
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = json.loads(trained.stdout.splitlines()[-1])
    assert out["versions"] == {"model": 2} and out["listed"] and out["features"] == 16 and out["rounds"] >= 1, out


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    # the synthetic vectors, which its needs refuse
    (lambda p: p["suites"]["tiny"]["settings"].append({"dataset": "synth", "partitions": ["natural"]}),
     "training.tiny: model 'tinynet' on dataset 'synth': model 'tinynet' needs image inputs [C, H, W]"),
    (lambda p: p["training"]["split"].update(split_point="S2"),
     "training.split: split_point 'S2' is not a split point of model 'tinynet'; known: cut, late"),
])
def test_validation_holds_a_plugin_s_model_to_its_declaration(sites, tmp_path, change, message):
    params = _params()
    change(params)
    root = make_copy(tmp_path, params)
    done = _in(root, sites["fedskew-tinynet"], "-m", "fedskew", "validate")
    assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("distribution, problem", [
    ("fedskew-brokennet", "failed to load: ModuleNotFoundError: No module named 'a_module_nobody_installed'; fix the "
                          "package, or uninstall it (pip uninstall fedskew-brokennet)"),
    ("fedskew-mlpclash", "'mlp' is the name of a built-in model; give the entry point another name"),
    ("fedskew-bareclass", "names a function, not a model declaration: point it at a "
                          "fedskew.models.Model(build, needs=InputNeeds(...), version=1)"),
])
def test_a_plugin_that_fedskew_cannot_use_is_refused_in_one_line_naming_it(sites, tmp_path, distribution, problem):
    name = PACKAGES[distribution][0]
    root = make_copy(tmp_path, _params(model="mlp"))
    for command in ("models", "validate"):
        done = _in(root, sites[distribution], "-m", "fedskew", command)
        assert done.returncode == 2, (command, done.stdout[-2000:], done.stderr[-3000:])
        line, = done.stderr.strip().splitlines()  # one line, no traceback
        assert line.startswith(f"fedskew {command}: ") and f"entry point {name!r}" in line, line
        assert "group fedskew.models" in line and f"distribution {distribution!r}" in line, line
        assert problem in line, line
