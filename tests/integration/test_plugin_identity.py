"""A plugin's code is part of its runs' ids, with nothing to remember: changing the arithmetic of an installed
plugin method, its version untouched, makes Snakemake plan exactly that method's training and `fedskew stale` name
those runs with the plugin as the cause; rewording its docstrings and comments plans nothing. A plugin scheme whose
code changed draws its partitions again and retrains the runs on them. Every run of a plugin piece records the
distribution, its version and the code identity (config.yaml, from which MLflow's params come).

The plugins are written as pip installs them (their code and a .dist-info folder with entry_points.txt) into a
folder on the commands' PYTHONPATH; the project trains the tiny suite once (two rounds, one seed), then only dry
runs.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import TINY_PARAMS, make_copy, run, single_setting, venv_bin

pytestmark = pytest.mark.slow  # a build of the tiny suite, then dry runs

METHOD = '''"""Scaled: FedAvg whose clients train on their cross entropy times a constant."""

import torch.nn.functional as F

from fedskew.fl.fedavg import FedAvg


class Scaled(FedAvg):
    name = "scaled"

    def local_loss(self, logits, features, y, client, x=None):
        """The client's cross entropy, scaled."""
        return F.cross_entropy(logits, y) * 0.5
'''
REWORDED = METHOD.replace('"""The client\'s cross entropy, scaled."""',
                          '"""Another wording:\n        the loss, times a constant."""\n        # a comment')
RECOMPUTED = METHOD.replace("* 0.5", "* 0.25")


# A partition scheme of another distribution, a single module: label-sorted blocks dealt round robin.
SCHEME = '''"""Blocks: the samples sorted by label, cut into one block a client."""

import numpy as np

from fedskew.data.partitions import Parameter, Scheme


class Blocks(Scheme):
    name = "blocks"
    parameters = {"clients": Parameter(int, ref="sample_count")}

    @staticmethod
    def sample(labels, num_classes, params, rng, natural_groups=None, dataset=""):
        return np.array_split(np.argsort(labels, kind="stable").astype(np.int64), params["clients"])
'''


def _installed(site: Path) -> Path:
    """fedskew-scaled 0.1 (the package `scaled`) and fedskew-blocks 0.1 (the module `blocks_scheme`) as pip
    installs them into `site`: their code and their .dist-info folders."""
    (site / "scaled").mkdir(parents=True)
    (site / "scaled" / "__init__.py").write_text('"""A fedskew method plugin."""\n')
    (site / "scaled" / "method.py").write_text(METHOD)
    (site / "blocks_scheme.py").write_text(SCHEME)
    for distribution, entry_points in (("fedskew-scaled", "[fedskew.methods]\nscaled = scaled.method:Scaled\n"),
                                       ("fedskew-blocks", "[fedskew.partitions]\nblocks = blocks_scheme:Blocks\n")):
        info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(entry_points)
    return site


def _planned(dry_run: str) -> list[tuple[str, str, str]]:
    """(rule, partition, method) of each job a `snakemake -n` plans that draws a partition or trains a run."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:)", dry_run):
        rule = re.match(r"rule (\w+):", block)
        if rule and rule.group(1) in ("partition", "train"):
            method = re.search(r"method=([\w.-]+)", block)
            jobs.append((rule.group(1), re.search(r"partition=([\w.-]+)", block).group(1),
                         method.group(1) if method else ""))
    return sorted(jobs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny suite (FedAvg and the plugin's method, on a Dirichlet partition and the plugin scheme's, one seed,
    two rounds) built with both plugins installed."""
    tmp = tmp_path_factory.mktemp("identity")
    site = _installed(tmp / "site")
    params = single_setting(copy.deepcopy(TINY_PARAMS))
    params["partitions"]["blk"] = {"scheme": "blocks", "clients": 4}
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5", "blk"]
    params["suites"]["tiny"]["methods"] = ["fedavg", "scaled"]
    params["training"]["tiny"].update(rounds=2, eval_every=1, checkpoint_every=2)
    root = make_copy(tmp, params)
    built = _in(root, site, venv_bin("snakemake"), "--cores", "2")
    assert built.returncode == 0, built.stderr[-3000:]
    return root, site


def _in(root: Path, site: Path, *cmd: str):
    return run(list(cmd), root, PYTHONPATH=os.pathsep.join([str(root / "src"), str(site)]), FEDSKEW_TRACKING="0")


def _stale(root: Path, site: Path) -> list[dict]:
    listed = _in(root, site, sys.executable, "-m", "fedskew", "stale", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    return json.loads(listed.stdout)


def test_its_runs_record_the_distribution_its_version_and_its_code(trained) -> None:
    root, _ = trained
    recorded = yaml.safe_load((root / "results/runs/tiny/digits/dir0.5/scaled/seed0/config.yaml").read_text())
    plugin = recorded["plugins"]["method"]
    assert {k: plugin[k] for k in ("distribution", "version", "entry_point")} == {
        "distribution": "fedskew-scaled", "version": "0.1", "entry_point": "scaled.method:Scaled"}
    assert re.fullmatch(r"[0-9a-f]{64}", plugin["code"])
    # a built-in method's run records no plugin, as before
    fedavg = root / "results/runs/tiny/digits/dir0.5/fedavg/seed0/config.yaml"
    assert "plugins" not in yaml.safe_load(fedavg.read_text())


def test_a_reworded_docstring_plans_nothing_and_changed_arithmetic_plans_exactly_its_runs(trained) -> None:
    root, site = trained
    method = site / "scaled" / "method.py"
    assert "Nothing to be done" in _in(root, site, venv_bin("snakemake"), "-n").stdout
    try:
        method.write_text(REWORDED)  # docstrings and a comment: what Python runs is the same
        planned = _in(root, site, venv_bin("snakemake"), "-n")
        assert planned.returncode == 0 and "Nothing to be done" in planned.stdout, planned.stdout[-3000:]
        assert _stale(root, site) == []

        method.write_text(RECOMPUTED)  # one constant of its loss, its version and its distribution's untouched
        planned = _in(root, site, venv_bin("snakemake"), "-n")
        assert planned.returncode == 0, planned.stderr[-3000:]
        # its runs, on both partitions, and no other method's, no partition drawn again
        assert _planned(planned.stdout) == [("train", "blk", "scaled"), ("train", "dir0.5", "scaled")]
        assert "Params have changed since last execution" in planned.stdout
        records = _stale(root, site)
        assert sorted((r["partition"], r["method"]) for r in records) == [("blk", "scaled"), ("dir0.5", "scaled")]
        assert {r["cause"] for r in records} == {"plugin fedskew-scaled changed (method scaled: its code)"}
        text = _in(root, site, sys.executable, "-m", "fedskew", "stale")
        assert "plugin fedskew-scaled changed (method scaled: its code): 2 run(s)" in text.stdout, text.stdout
    finally:
        method.write_text(METHOD)


def test_a_plugin_scheme_whose_code_changed_draws_its_partitions_again_and_retrains_their_runs(trained) -> None:
    root, site = trained
    scheme = site / "blocks_scheme.py"
    try:
        scheme.write_text(SCHEME.replace("np.argsort(labels,", "np.argsort(-labels,"))  # the blocks in another order
        planned = _in(root, site, venv_bin("snakemake"), "-n")
        assert planned.returncode == 0, planned.stderr[-3000:]
        assert _planned(planned.stdout) == [("partition", "blk", ""), ("train", "blk", "fedavg"),
                                            ("train", "blk", "scaled")]
        records = _stale(root, site)
        assert sorted((r["partition"], r["method"]) for r in records) == [("blk", "fedavg"), ("blk", "scaled")]
        assert {r["cause"] for r in records} == {"plugin fedskew-blocks changed (scheme blocks: its code)"}
    finally:
        scheme.write_text(SCHEME)
    assert "Nothing to be done" in _in(root, site, venv_bin("snakemake"), "-n").stdout
