"""Partition schemes of installed packages (entry points of group `fedskew.partitions`) and what a scheme declares.

A scratch plugin, installed with pip into a folder of the test's own (`--target`) that the commands find on their
PYTHONPATH, is listed, validated as its class declares its parameters, drawn by the partition job and versioned in
its runs' ids like a built-in scheme. Each way a plugin can be unusable (it fails to import, takes a built-in
name, is no Scheme, declares its parameters otherwise, is named otherwise, has no draw) stops every command with
one line naming its distribution and its entry point. Those broken packages are written as pip installs them (the
module and a .dist-info folder with METADATA and entry_points.txt), which is what fedskew reads of an installed
package, so that each case costs one command and no build.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedskew.data.partitions import Parameter, Scheme, load_partition
from fedskew.data.partitions.parameters import SCHEMA_REFS, scheme_schema
from fedskew.data.partitions.registry import BUILT_IN, scheme_problem
from tests.helpers import REPO, TINY_PARAMS

# The scratch plugin: label-sorted blocks, `per_client` of them to each client, dealt round robin.
BLOCKS = '''
"""Label-sorted blocks: the samples sorted by label, cut into clients * per_client blocks, dealt round robin."""

import numpy as np

from fedskew.data.partitions import Parameter, PartitionError, Scheme


class Blocks(Scheme):
    name = "blocks"
    parameters = {"clients": Parameter(int, ref="sample_count"),
                  "per_client": Parameter(int, 1, minimum=1, maximum=100)}
    version = 2

    @staticmethod
    def sample(labels, num_classes, params, rng, natural_groups=None, dataset=""):
        m, k = params["clients"], params["per_client"]
        blocks = np.array_split(np.argsort(labels, kind="stable").astype(np.int64), m * k)
        return [np.concatenate(blocks[c::m]) for c in range(m)]

    @classmethod
    def check(cls, p, n, num_classes, class_counts, ctx):
        if p["clients"] * p["per_client"] > n:
            raise PartitionError(f"more blocks than samples; use fewer clients or a smaller per_client {ctx}")
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "fedskew-blocks"
version = "0.1.0"

[project.entry-points."fedskew.partitions"]
blocks = "blocks_scheme:Blocks"

[tool.setuptools]
py-modules = ["blocks_scheme"]
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The scratch plugin installed into a folder of its own, offline."""
    scratch = tmp_path_factory.mktemp("blocks")
    (scratch / "src").mkdir()
    (scratch / "src" / "pyproject.toml").write_text(PYPROJECT)
    (scratch / "src" / "blocks_scheme.py").write_text(BLOCKS)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target",
                           str(scratch / "site"), str(scratch / "src")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return scratch / "site"


def _project(root: Path, partitions: dict | None = None) -> Path:
    """The tiny project in `root`, its suite also on `partitions` (defined beside the tiny ones)."""
    params = copy.deepcopy(TINY_PARAMS)
    params["partitions"].update(partitions or {})
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5", *(partitions or {})]
    root.mkdir(exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def _in(root: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    """`python <args>` in the project `root`, with fedskew's code and the folder `site` on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(site)])}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # about 10 s: the partition job imports torch
def test_an_installed_scheme_is_listed_validated_and_drawn_by_the_partition_job(site, tmp_path) -> None:
    root = _project(tmp_path / "project", {"blk": {"scheme": "blocks", "clients": 10}})
    listed = _in(root, site, "-m", "fedskew", "partitions")
    assert listed.returncode == 0, listed.stderr[-3000:]
    lines = listed.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("blk "))
    assert lines[at].split(None, 2) == ["blk", "blocks", "clients=10, per_client=1 (default) (scheme of plugin "
                                                         "fedskew-blocks)"]
    assert lines[at + 1].strip() == "used by tiny (digits)"
    validated = _in(root, site, "-m", "fedskew", "validate")
    assert validated.returncode == 0, validated.stderr[-3000:]

    for command in (["download", "digits"], ["partition", "--dataset", "digits", "--partition", "blk", "--seed", "0"]):
        done = _in(root, site, "-m", "fedskew", *command)
        assert done.returncode == 0, done.stderr[-3000:]
    made = load_partition(root / "data/partitions/digits/blk/seed0.npz")
    assert made.meta["scheme"] == "blocks" and made.meta["params"] == {"clients": 10, "per_client": 1}
    assert made.num_clients == 10 and made.label_counts.sum() == made.meta["num_samples"] == 1437
    # one contiguous block of the label-sorted digits each: near-equal sizes, and no class below the previous one's
    assert max(made.client_sizes) - min(made.client_sizes) <= 1
    classes = [np.flatnonzero(counts) for counts in made.label_counts]
    assert all(held[-1] <= following[0] for held, following in zip(classes, classes[1:]))
    assert (root / "data/partitions/digits/blk/seed0.png").is_file()


def test_its_parameters_are_checked_as_its_class_declares_them(site, tmp_path) -> None:
    root = _project(tmp_path / "project", {"b0": {"scheme": "blocks", "clients": 10, "per_client": 0},
                                           "bx": {"scheme": "blocks", "clients": 10, "beta": 0.5},
                                           "bn": {"scheme": "blocks", "per_client": 2}})
    done = _in(root, site, "-m", "fedskew", "validate")
    assert done.returncode == 2
    assert "partitions.b0.per_client: 0 is out of range; must be >= 1" in done.stderr
    assert "partitions.bx: unknown key(s) beta; allowed: clients, per_client, scheme" in done.stderr
    assert "partitions.bn: 'clients' is a required property" in done.stderr
    # then, once the schema holds, the class's own check on the dataset's size known in advance
    root = _project(tmp_path / "other", {"b9": {"scheme": "blocks", "clients": 800, "per_client": 2}})
    done = _in(root, site, "-m", "fedskew", "validate")
    assert done.returncode == 2
    assert "partitions.b9 cannot split datasets.digits" in done.stderr and "more blocks than samples" in done.stderr


def test_its_runs_carry_its_version_and_the_built_in_ones_none(site, tmp_path) -> None:
    root = _project(tmp_path / "project", {"blk": {"scheme": "blocks", "clients": 10}})
    code = ("import json; from fedskew.config import load_params; "
            "print(json.dumps({r.partition: r.numerics_versions for r in load_params('params.yaml').runs(['tiny'])}))")
    done = _in(root, site, "-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"dir0.5": {}, "blk": {"scheme": 2}}


# --- broken plugins --------------------------------------------------------------------------------------------

_SCHEME = '''
from fedskew.data.partitions import Parameter, Scheme
from fedskew.data.partitions.iid import Iid


class Broken(Scheme):
    name = "{name}"
    parameters = {parameters}
    sample = Iid.sample
'''


def _scheme(name: str = "broken", parameters: str = '{"clients": Parameter(int, ref="sample_count")}') -> str:
    return _SCHEME.replace("{name}", name).replace("{parameters}", parameters)


BROKEN = {  # case -> (entry point, module source, what the error says)
    "fails to import": ("broken = broken_scheme:Broken", "import a_module_nobody_installed\n",
                        "failed to load: ModuleNotFoundError: No module named 'a_module_nobody_installed'; fix the "
                        "package, or uninstall it (pip uninstall fedskew-broken)"),
    "takes a built-in name": ("iid = broken_scheme:Broken", _scheme("iid"),
                              "'iid' is the name of a built-in partition scheme; give the entry point and its "
                              "class's `name` another name"),
    "is no Scheme": ("broken = broken_scheme:draw", "def draw(labels, num_classes, params, rng):\n    return []\n",
                     "is not a partition scheme: subclass fedskew.data.partitions.Scheme"),
    "declares a type, not a Parameter": ("broken = broken_scheme:Broken", _scheme(parameters='{"clients": int}'),
                                         "parameter 'clients' is declared as <class 'int'>; declare it as "
                                         "fedskew.data.partitions.Parameter("),
    "declares an unbounded integer": ("broken = broken_scheme:Broken", _scheme(parameters='{"k": Parameter(int, 2)}'),
                                      "parameter 'k': an int needs a `maximum`"),
    "is named otherwise": ("broken = broken_scheme:Broken", _scheme("other"),
                           "the class sets name = 'other', but params.yaml calls the scheme by the entry point's "
                           "name; write name = 'broken' in the class"),
    "has no draw": ("broken = broken_scheme:Broken", _scheme().replace("    sample = Iid.sample\n", ""),
                    "does not implement sample("),
}


def _hand_installed(site: Path, entry_point: str, source: str) -> Path:
    """The distribution fedskew-broken as pip installs it into `site`: its module and its .dist-info."""
    site.mkdir()
    (site / "broken_scheme.py").write_text(source)
    info = site / "fedskew_broken-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedskew-broken\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[fedskew.partitions]\n{entry_point}\n")
    return site


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_stops_every_command_in_one_line_naming_its_distribution_and_entry_point(case,
                                                                                                 tmp_path) -> None:
    entry_point, source, says = BROKEN[case]
    site = _hand_installed(tmp_path / "site", entry_point, source)
    root = _project(tmp_path / "project")
    name, value = (part.strip() for part in entry_point.split("="))
    where = f"entry point {name!r} = {value!r} in group fedskew.partitions of distribution 'fedskew-broken'"
    for command in ("validate", "partitions"):
        done = _in(root, site, "-m", "fedskew", command)
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.startswith(f"fedskew {command}: {where}") and done.stderr.count("\n") == 1, done.stderr
        assert says in done.stderr


# --- what a scheme declares ---------------------------------------------------------------------------------------

def test_every_built_in_scheme_declares_what_a_plugin_must() -> None:
    assert list(BUILT_IN) == ["dirichlet", "extended_dirichlet", "iid", "iid_mixture", "longtail_dirichlet", "natural",
                              "quantity", "quantity_per_label", "shards"]
    assert {name: scheme_problem(cls, name) for name, cls in BUILT_IN.items()} == dict.fromkeys(BUILT_IN)


def test_a_schemes_defaults_are_those_of_its_declarations() -> None:
    class Two(Scheme):
        name = "two"
        parameters = {"clients": Parameter(int, ref="sample_count"), "beta": Parameter(float, 0.5, minimum=0),
                      "k": Parameter(int, 3, minimum=1, maximum=9)}

    assert Two.defaults == {"beta": 0.5, "k": 3}
    assert Two.normalise({"clients": 4.0, "k": 2}, 100, "toy") == {"clients": 4, "beta": 0.5, "k": 2}
    assert scheme_schema("two", Two.parameters) == {
        "if": {"properties": {"scheme": {"const": "two"}}},
        "then": {"additionalProperties": False, "required": ["clients"],
                 "properties": {"scheme": True, "clients": {"$ref": "#/$defs/sample_count"},
                                "beta": {"type": "number", "minimum": 0},
                                "k": {"type": "integer", "minimum": 1, "maximum": 9}}}}


@pytest.mark.parametrize("declared, says", [
    (Parameter(str), "its type is <class 'str'>; declare int or float"),
    (Parameter(int, 5), "an int needs a `maximum`"),
    (Parameter(int, ref="clients"), "ref 'clients' is not one of sample_count"),
    (Parameter(float, ref="sample_count"), "ref 'sample_count' holds int values, not float"),
    (Parameter(int, ref="sample_count", minimum=2), "give a ref or bounds, not both"),
    (Parameter(int, 0.5, maximum=9), "the default 0.5 is not of its type, int"),
    (Parameter(float, True), "the default True is not of its type, float"),
    (Parameter(float, 0.0, exclusive_minimum=0), "the default 0.0 breaks its own exclusive_minimum=0"),
    (Parameter(int, 10, minimum=1, maximum=5), "the default 10 breaks its own maximum=5"),
])
def test_a_declaration_fedskew_cannot_use_says_why(declared: Parameter, says: str) -> None:
    assert declared.problem().startswith(says)


def test_the_refs_a_parameter_may_name_are_definitions_of_the_schema_holding_that_type() -> None:
    from fedskew.config_schema import SCHEMA_PATH

    definitions = yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]
    assert {ref: definitions[ref]["type"] for ref in SCHEMA_REFS} == \
        {ref: "integer" if kind is int else "number" for ref, kind in SCHEMA_REFS.items()}

