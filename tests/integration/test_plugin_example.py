"""The worked plugins, examples/fedfocal (a loss) and examples/fedavgm (a server update with a state kept across
rounds), as a researcher uses them: installed as packages, their own tests passing, listed, validated and trained
by the whole workflow with their experiments, in a scratch copy of the project.

Both are installed by one pip call into a folder of the test's own (`--target`), which the commands find on their
PYTHONPATH: fedskew finds their entry points there, and the project's environment stays as it was.
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
SERVER_EXAMPLE = REPO / "examples" / "fedavgm"
WATCHED = ("src/", "params.yaml", "workflow/", "tests/", "examples/")  # what a run must not write in the repo


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Both examples installed into a scratch folder by one pip call, offline, from copies (pip builds in their
    source folders)."""
    scratch = tmp_path_factory.mktemp("plugin")
    for example in (EXAMPLE, SERVER_EXAMPLE):
        shutil.copytree(example, scratch / example.name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target",
                           str(scratch / "site"), str(scratch / EXAMPLE.name), str(scratch / SERVER_EXAMPLE.name)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return scratch / "site"


def _status() -> list[str]:
    """The real repository's `git status` lines under WATCHED, every untracked file listed."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return sorted(line for line in done.stdout.splitlines() if line[3:].startswith(WATCHED))


def _project(tmp_path: Path) -> Path:
    """A scratch copy of the project, params.yaml as committed, with the examples' experiments made tiny: focal's
    with two seeds (a paired interval), momentum's with one (its comparison is focal's machinery)."""
    root = make_copy(tmp_path, yaml.safe_load((REPO / "params.yaml").read_text()))
    shutil.copy(REPO / "params.yaml", root / "params.yaml")  # verbatim, comments and all
    (root / "experiments").mkdir()
    for example, suite, seeds in ((EXAMPLE, "focal", [0, 1]), (SERVER_EXAMPLE, "momentum", [0])):
        experiment = yaml.safe_load((example / "experiments" / f"{suite}.yaml").read_text())
        experiment["suites"][suite]["seeds"] = seeds
        experiment["training"][suite].update(rounds=2, checkpoint_every=2)
        (root / "experiments" / f"{suite}.yaml").write_text(yaml.safe_dump(experiment, sort_keys=False))
    return root


def _in(root: Path, site: Path, *cmd: str) -> subprocess.CompletedProcess:
    """`cmd` in the scratch project, its own code and the installed plugin on the path, tracking into its store."""
    return run(list(cmd), root, PYTHONPATH=os.pathsep.join([str(root / "src"), str(site)]), FEDSKEW_TRACKING="1")


@pytest.mark.parametrize("example", [EXAMPLE, SERVER_EXAMPLE], ids=lambda example: example.name)
def test_the_examples_own_tests_pass(site, tmp_path, example) -> None:
    shutil.copytree(example, tmp_path / example.name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path / example.name, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout


def test_fedskew_lists_the_installed_plugin(site, tmp_path) -> None:
    root = _project(tmp_path)
    listed = _in(root, site, sys.executable, "-m", "fedskew", "methods")
    assert listed.returncode == 0, listed.stderr[-3000:]
    line = next(line for line in listed.stdout.splitlines() if line.startswith("fedfocal "))
    assert "[federated] (plugin of fedskew-fedfocal) gamma=2.0" in line
    assert "Lin et al." in listed.stdout
    line = next(line for line in listed.stdout.splitlines() if line.startswith("fedavgm "))
    assert "[federated] (plugin of fedskew-fedavgm) server_lr=1.0, server_momentum=0.9" in line
    assert "(Hsu, Qi and Brown" in listed.stdout
    # without the scratch install the project knows no fedfocal (unless this environment has it installed itself)
    if not any(entry.name == "fedfocal" for entry in metadata.entry_points(group="fedskew.methods")):
        plain = run([sys.executable, "-m", "fedskew", "methods"], root)
        assert plain.returncode == 0 and "fedfocal" not in plain.stdout


def _table(root: Path, suite: str, method: str, seeds: int) -> None:
    """The suite's table holds `method` beside fedavg, from `seeds` run files each."""
    table = (root / f"results/tables/{suite}.md").read_text()
    assert f"| {method} |" in table and "| fedavg |" in table and "digits / dir0.1" in table
    assert len(list((root / f"results/runs/{suite}").glob("digits/dir0.1/*/seed*/metrics.json"))) == 2 * seeds


def _mlflow_params(root: Path, suite: str, method: str, seeds: int) -> dict[str, str]:
    """The params of `method`'s first MLflow run in the suite's experiment, once every run of the suite (fedavg's
    and the method's, `seeds` each) is checked FINISHED with both rounds' training loss."""
    import mlflow

    from fedskew.tracking import tracking_uri

    client = mlflow.MlflowClient(tracking_uri(root))
    experiment = client.get_experiment_by_name(f"fedskew/{suite}")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["method_spec.algorithm"] for r in runs) == ["fedavg"] * seeds + [method] * seeds
    for mlflow_run in runs:
        assert mlflow_run.info.status == "FINISHED"
        assert len(client.get_metric_history(mlflow_run.info.run_id, "loss/train_loss")) == 2
    return next(r for r in runs if r.data.params["method_spec.algorithm"] == method).data.params


def test_their_experiments_validate_and_build_their_tables_with_mlflow_records(site, tmp_path) -> None:
    from fedskew.engine.checkpoint import read_checkpoint

    before = _status()
    root = _project(tmp_path)
    validated = _in(root, site, sys.executable, "-m", "fedskew", "validate")
    assert validated.returncode == 0, validated.stderr[-3000:]
    for suite, method in (("focal", "fedfocal"), ("momentum", "fedavgm")):
        described = _in(root, site, sys.executable, "-m", "fedskew", "suites", "--suite", suite, "--no-cost")
        assert described.returncode == 0 and method in described.stdout, described.stderr[-3000:]

    pages = [f"results/tables/{page}.md" for page in ("focal", "compare/focal", "momentum")]
    built = _in(root, site, venv_bin("snakemake"), "--cores", "2", *pages)
    assert built.returncode == 0, built.stderr[-4000:]
    _table(root, "focal", "fedfocal", seeds=2)
    _table(root, "momentum", "fedavgm", seeds=1)
    # the user's suite gets the comparison a shipped suite gets: fedfocal against fedavg, paired over both seeds
    compared = json.loads((root / "results/tables/compare/focal.json").read_text())
    assert [(c["partition"], c["method"], c["baseline"], c["seeds"]) for c in compared] == [
        ("dir0.1", "fedfocal", "fedavg", [0, 1])]
    assert compared[0]["low"] <= compared[0]["mean"] <= compared[0]["high"]
    assert "| digits / dir0.1 | fedfocal | 2 |" in (root / "results/tables/compare/focal.md").read_text()
    focal = _mlflow_params(root, "focal", "fedfocal", seeds=2)
    assert focal["method_spec.gamma"] == "2.0"
    # what computed its runs: the plugin's distribution, its version and its code, which their ids fold in
    assert (focal["plugins.method.distribution"], focal["plugins.method.version"]) == ("fedskew-fedfocal", "0.1.0")
    assert len(focal["plugins.method.code"]) == 64
    momentum = _mlflow_params(root, "momentum", "fedavgm", seeds=1)
    assert (momentum["method_spec.server_momentum"], momentum["method_spec.server_lr"]) == ("0.9", "1.0")
    # FedAvgM's velocity is in its run's checkpoint, one tensor per trainable parameter (buffers have none)
    saved = read_checkpoint(root / "results/checkpoints/momentum/digits/dir0.1/fedavgm/seed0/last.pt")
    velocity = saved["algorithm_state"]["velocity"]
    assert saved["round"] == 2 and velocity and set(velocity) <= set(saved["global_state"])
    assert all(v.shape == saved["global_state"][key].shape and v.abs().sum() > 0 for key, v in velocity.items())

    assert _status() == before  # everything was written in the scratch copy
