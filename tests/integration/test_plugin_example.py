"""The worked plugin, examples/fedfocal, as a researcher uses it: installed as a package, listed, validated and
trained by the whole workflow with its experiment, in a scratch copy of the project.

It is installed with pip into a folder of the test's own (`--target`), which the commands find on their
PYTHONPATH: fedskew finds its entry point there, and the project's environment stays as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, make_copy, run, venv_bin

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "fedfocal"
WATCHED = ("src/", "params.yaml", "workflow/", "tests/", "examples/")  # what a run must not write in the repo


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """examples/fedfocal installed into a scratch folder, offline, from a copy (pip builds in its source folder)."""
    scratch = tmp_path_factory.mktemp("plugin")
    shutil.copytree(EXAMPLE, scratch / "fedfocal", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target",
                           str(scratch / "site"), str(scratch / "fedfocal")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return scratch / "site"


def _status() -> list[str]:
    """The real repository's `git status` lines under WATCHED, every untracked file listed."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return sorted(line for line in done.stdout.splitlines() if line[3:].startswith(WATCHED))


def _project(tmp_path: Path) -> Path:
    """A scratch copy of the project, params.yaml as committed, with the example's experiment made tiny."""
    root = make_copy(tmp_path, yaml.safe_load((REPO / "params.yaml").read_text()))
    shutil.copy(REPO / "params.yaml", root / "params.yaml")  # verbatim, comments and all
    experiment = yaml.safe_load((EXAMPLE / "experiments" / "focal.yaml").read_text())
    experiment["suites"]["focal"]["seeds"] = [0, 1]  # two seeds: a paired interval
    experiment["training"]["focal"].update(rounds=2, checkpoint_every=2)
    (root / "experiments").mkdir()
    (root / "experiments" / "focal.yaml").write_text(yaml.safe_dump(experiment, sort_keys=False))
    return root


def _in(root: Path, site: Path, *cmd: str) -> subprocess.CompletedProcess:
    """`cmd` in the scratch project, its own code and the installed plugin on the path, tracking into its store."""
    return run(list(cmd), root, PYTHONPATH=os.pathsep.join([str(root / "src"), str(site)]), FEDSKEW_TRACKING="1")


def test_the_examples_own_tests_pass(site, tmp_path) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "fedfocal", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tmp_path / "fedfocal",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_fedskew_lists_the_installed_plugin(site, tmp_path) -> None:
    root = _project(tmp_path)
    listed = _in(root, site, sys.executable, "-m", "fedskew", "methods")
    assert listed.returncode == 0, listed.stderr[-3000:]
    line = next(line for line in listed.stdout.splitlines() if line.startswith("fedfocal "))
    assert "[federated] (plugin of fedskew-fedfocal) gamma=2.0" in line
    assert "Lin et al." in listed.stdout
    # without the scratch install the project knows no fedfocal (unless this environment has it installed itself)
    if not any(entry.name == "fedfocal" for entry in metadata.entry_points(group="fedskew.methods")):
        plain = run([sys.executable, "-m", "fedskew", "methods"], root)
        assert plain.returncode == 0 and "fedfocal" not in plain.stdout


def test_its_experiment_validates_and_builds_its_table_with_mlflow_records(site, tmp_path) -> None:
    before = _status()
    root = _project(tmp_path)
    validated = _in(root, site, sys.executable, "-m", "fedskew", "validate")
    assert validated.returncode == 0, validated.stderr[-3000:]
    described = _in(root, site, sys.executable, "-m", "fedskew", "suites", "--suite", "focal", "--no-cost")
    assert described.returncode == 0 and "fedfocal" in described.stdout, described.stderr[-3000:]

    built = _in(root, site, venv_bin("snakemake"), "--cores", "2", "results/tables/focal.md",
                "results/tables/compare/focal.md")
    assert built.returncode == 0, built.stderr[-4000:]
    table = (root / "results/tables/focal.md").read_text()
    assert "| fedfocal |" in table and "| fedavg |" in table and "digits / dir0.1" in table
    assert len(list((root / "results/runs/focal").glob("digits/dir0.1/*/seed*/metrics.json"))) == 2 * 2
    # the user's suite gets the comparison a shipped suite gets: fedfocal against fedavg, paired over both seeds
    compared = json.loads((root / "results/tables/compare/focal.json").read_text())
    assert [(c["partition"], c["method"], c["baseline"], c["seeds"]) for c in compared] == [
        ("dir0.1", "fedfocal", "fedavg", [0, 1])]
    assert compared[0]["low"] <= compared[0]["mean"] <= compared[0]["high"]
    assert "| digits / dir0.1 | fedfocal | 2 |" in (root / "results/tables/compare/focal.md").read_text()

    import mlflow

    from fedskew.tracking import tracking_uri

    client = mlflow.MlflowClient(tracking_uri(root))
    experiment = client.get_experiment_by_name("fedskew/focal")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["method_spec.algorithm"] for r in runs) == ["fedavg"] * 2 + ["fedfocal"] * 2
    for mlflow_run in runs:
        assert mlflow_run.info.status == "FINISHED"
        assert len(client.get_metric_history(mlflow_run.info.run_id, "loss/train_loss")) == 2
    focal = next(r for r in runs if r.data.params["method_spec.algorithm"] == "fedfocal")
    assert focal.data.params["method_spec.gamma"] == "2.0"

    assert _status() == before  # everything was written in the scratch copy
