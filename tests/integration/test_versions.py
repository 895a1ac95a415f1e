"""Raising a method's numerics version retrains exactly its runs: Snakemake plans FedProx's training and nothing
else's, because the run id it tracks as a parameter folds in the version read from fedprox.py; `fedskew stale`
names the same runs."""

from __future__ import annotations

import copy
import json
import re
import sys

from tests.helpers import TINY_PARAMS, make_copy, run, venv_bin


def _planned_training(dry_run: str) -> list[str]:
    """The methods of the training jobs a `snakemake -n` plans (one per job)."""
    blocks = re.split(r"\n(?=rule \w+:)", dry_run)
    return [re.search(r"method=([\w.-]+)", block).group(1) for block in blocks if block.startswith("rule train:")]


def test_a_raised_method_version_plans_exactly_that_methods_training(tmp_path) -> None:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=["fedavg", "fedprox", "fedlc"], seeds=[0, 1])
    params["training"]["tiny"].update(rounds=2, eval_every=1, checkpoint_every=2)
    root = make_copy(tmp_path, params)
    built = run([venv_bin("snakemake"), "--cores", "2"], root, FEDSKEW_TRACKING="0")
    assert built.returncode == 0, built.stderr[-3000:]
    assert "Nothing to be done" in run([venv_bin("snakemake"), "-n"], root).stdout

    fedprox = root / "src/fedskew/fl/fedprox.py"
    text = fedprox.read_text()
    fedprox.write_text(text.replace('    name = "fedprox"\n', '    name = "fedprox"\n    version = 2\n'))
    assert fedprox.read_text() != text
    planned = run([venv_bin("snakemake"), "-n"], root)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert sorted(_planned_training(planned.stdout)) == ["fedprox", "fedprox"]  # its two seeds, no other method
    assert "Params have changed since last execution" in planned.stdout
    # `fedskew stale` names the same runs, and why
    listed = run([sys.executable, "-m", "fedskew", "stale", "--json"], root)
    assert listed.returncode == 0, listed.stderr[-3000:]
    records = json.loads(listed.stdout)
    assert sorted((r["method"], r["seed"]) for r in records) == [("fedprox", 0), ("fedprox", 1)]
    assert {r["cause"] for r in records} == {"method fedprox: version 1 -> 2"}
