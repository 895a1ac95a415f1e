"""DVC on top of Snakemake: `dvc status` names exactly the stages a change affects, and `dvc repro` re-runs exactly
the phases and runs it affects.

The status tests work on a copy of what a fresh clone holds, with no output built: `dvc status` trains nothing."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedskew import dvclock, dvcstages
from tests.helpers import REPO, make_copy, run, venv_bin


def stale_stages(root: Path) -> set[str]:
    result = run([venv_bin("dvc"), "status", "--json"], root)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout or "{}"))


def clone_copy(tmp_path: Path) -> Path:
    """What a fresh clone holds for DVC: the code, the workflow, the claims files, params.yaml, dvc.yaml, dvc.lock,
    DVC's config, and the committed tables, comparisons, figures and own ledgers (outputs git keeps); no data,
    partition or run."""
    root = tmp_path / "clone"
    for folder in ("src", "workflow", "experiments/claims", "results/claims"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("params.yaml", "dvc.yaml", "dvc.lock", ".dvcignore", ".dvc/config", ".dvc/.gitignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    for suite in yaml.safe_load((REPO / "params.yaml").read_text())["run"]["suites"]:
        tables = REPO / "results/tables"
        for table in [*tables.glob(f"{suite}.*"), *tables.glob(f"compare/{suite}.*")]:
            (root / table.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(table, root / table.relative_to(REPO))
        shutil.copytree(REPO / "results/figures" / suite, root / "results/figures" / suite)
    assert run(["git", "init", "-q"], root).returncode == 0
    return root


def changes(root: Path) -> dict[str, set[str]]:
    """Stage -> what `dvc status` says changed in it, but for outputs not built here (an output not in the cache,
    or missing, also where a later stage depends on it)."""
    result = run([venv_bin("dvc"), "status", "--json"], root)
    assert result.returncode == 0, result.stderr
    declared = {name: body for file in ("dvc.yaml", "experiments/dvc.yaml") if (root / file).exists()
                for name, body in yaml.safe_load((root / file).read_text())["stages"].items()}
    outputs = {path for body in declared.values() for key in ("outs", "metrics", "plots")
               for entry in body.get(key, []) for path in entry}
    found: dict[str, set[str]] = {}
    for stage, entries in json.loads(result.stdout or "{}").items():
        reasons = set()
        for entry in entries:
            if isinstance(entry, str):  # "changed command"
                reasons.add(entry)
                continue
            for path, what in entry.get("changed deps", {}).items():
                if isinstance(what, dict):  # params.yaml: {key: modified | new | deleted}
                    reasons |= {f"{path}: {key} {how}" for key, how in what.items()}
                elif not (what == "deleted" and path in outputs):
                    reasons.add(f"{path} {what}")
            reasons |= {f"output {path} {what}" for path, what in entry.get("changed outs", {}).items()
                        if what not in ("not in cache", "deleted")}
        if reasons:
            found[stage] = reasons
    return found


def edit_params(root: Path, edit) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    edit(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_a_fresh_clone_flags_only_unbuilt_outputs_and_a_changed_lr_only_its_suites_stages(tmp_path):
    root = clone_copy(tmp_path)
    assert changes(root) == {}, f"dvc.lock is stale: run `{dvclock.LOCK_COMMAND}`"

    edit_params(root, lambda p: p["training"]["default"].update(lr=0.02))
    # every stage that reads the default suite's runs: its tables, its comparison, the claims file about it
    assert changes(root) == {stage: {"params.yaml: training.default modified"} for stage in (
        "train-default", "aggregate-default", "compare-default", "claims-default")}


def test_a_methods_hyperparameter_flags_only_the_stages_of_the_suites_that_use_it(tmp_path):
    root = clone_copy(tmp_path)

    def second_suite(params: dict) -> None:
        # A second suite of run.suites on data the default suite has already (the lock then records its stages
        # without a download or partition to build): FedAvg, FedLC and MOON, no FedProx.
        params["suites"]["other"] = {"settings": [{"dataset": "digits", "partitions": ["dir0.1"]}],
                                     "methods": ["fedavg", "fedlc", "moon_mu1"], "seeds": [0]}
        params["training"]["other"] = {k: v for k, v in params["training"]["default"].items() if k != "overrides"}
        params["run"]["suites"] = ["default", "other"]

    edit_params(root, second_suite)
    lines = dvclock.record_lock(root)  # trains nothing: the outputs of `other` are simply not recorded
    assert lines[0].startswith("dvc.yaml written") and "train-other" in lines[0], lines
    assert changes(root) == {}

    base = (root / "params.yaml").read_text()
    for method, key, value, affected in (("fedprox", "mu", 0.1, {"default"}), ("moon_mu1", "mu", 5.0, {"other"}),
                                         ("fedlc", "tau", 0.5, {"default", "other"})):
        (root / "params.yaml").write_text(base)
        edit_params(root, lambda p: p["methods"][method].update({key: value}))
        expected = {f"{phase}-{suite}": {f"params.yaml: methods.{method} modified"}
                    for phase in ("train", "aggregate", "compare") for suite in affected}
        if "default" in affected:  # experiments/claims/default.yaml is about the default suite
            expected["claims-default"] = {f"params.yaml: methods.{method} modified"}
        assert changes(root) == expected, method


def test_dvc_lock_records_an_edited_module_of_a_stage_and_refuses_a_change_of_what_it_builds(tmp_path):
    root = clone_copy(tmp_path)
    for module in ("fl/moon.py", "fl/fedprox.py"):
        path = root / "src/fedskew" / module
        path.write_text(path.read_text() + "\n# a comment\n")
    # MOON is not a method of the default suite; FedProx is (its train stage runs it, its tables name its family)
    edited = "src/fedskew/fl/fedprox.py modified"
    assert changes(root) == {stage: {edited} for stage in (
        "train-default", "aggregate-default", "compare-default", "claims-default")}
    assert f"train-default: dependency {edited}: run `{dvclock.LOCK_COMMAND}`" in dvclock.lock_problems(root)

    before = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert dvclock.record_lock(root)[1].startswith("dvc.lock: deps and params recorded for train-default, "
                                                     "aggregate-default, compare-default, claims-default;")
    after = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert changes(root) == {} and dvclock.lock_problems(root) == []
    assert {name: entry.get("outs") for name, entry in after.items()} == \
        {name: entry.get("outs") for name, entry in before.items()}  # the outputs as they were recorded
    assert dvclock.record_lock(root)[1] == "dvc.lock is up to date"

    # A new learning rate changes the runs: recording it without them would call stale results current.
    lock = (root / "dvc.lock").read_bytes()
    edit_params(root, lambda p: p["training"]["default"].update(lr=0.02))
    with pytest.raises(dvcstages.DvcFilesError, match=r"train-default: \d+ of its \d+ run ids .* `dvc repro`"):
        dvclock.record_lock(root)
    assert (root / "dvc.lock").read_bytes() == lock


FOCAL = {  # a researcher's suite on the default suite's data: FedAvg against a stronger FedProx
    "suites": {"focal": {"settings": [{"dataset": "digits", "partitions": ["dir0.1"]}],
                         "methods": ["fedavg", "fedprox_strong"], "seeds": [0]}},
    "methods": {"fedprox_strong": {"algorithm": "fedprox", "mu": 0.1}},
    "training": {"focal": {"inherit": "default", "rounds": 2, "eval_every": 1, "checkpoint_every": 2}},
}


def add_experiment(root: Path, name: str, body: dict) -> None:
    (root / "experiments").mkdir(exist_ok=True)
    (root / "experiments" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))


def test_an_experiments_stages_are_recorded_in_their_own_lock_and_flagged_by_their_own_keys(tmp_path):
    root = clone_copy(tmp_path)
    dvclock.record_lock(root)  # the project's files as this code writes them, before any experiment
    shipped, lock = (root / "dvc.yaml").read_bytes(), (root / "dvc.lock").read_bytes()
    add_experiment(root, "focal", FOCAL)
    lines = dvclock.record_lock(root)  # trains nothing: the outputs of focal are simply not recorded
    assert lines[0] == ("dvc.yaml is up to date; experiments/dvc.yaml written: stages train-focal, aggregate-focal, "
                        "compare-focal"), lines
    assert lines[-1].startswith("experiments/dvc.lock: deps and params recorded for train-focal, aggregate-focal, "
                                "compare-focal"), lines
    assert (root / "dvc.yaml").read_bytes() == shipped and (root / "dvc.lock").read_bytes() == lock
    assert set(yaml.safe_load((root / "experiments/dvc.lock").read_text())["stages"]) == {
        "train-focal", "aggregate-focal", "compare-focal"}
    assert dvclock.lock_problems(root) == [] and changes(root) == {}

    # the experiment's own key, read from its file, flags its stages and no shipped one
    body = copy.deepcopy(FOCAL)
    body["methods"]["fedprox_strong"]["mu"] = 0.2
    add_experiment(root, "focal", body)
    assert changes(root) == {f"experiments/dvc.yaml:{phase}-focal": {
        "experiments/focal.yaml: methods.fedprox_strong modified"} for phase in ("train", "aggregate", "compare")}

    # and without the experiment, its stage file and lock go: the project is DVC's as shipped again
    (root / "experiments/focal.yaml").unlink()
    lines = dvclock.record_lock(root)
    assert "experiments/dvc.yaml removed" in lines[0] and "experiments/dvc.lock removed (experiments/dvc.yaml has " \
        "no stage)" in lines
    assert (root / "dvc.yaml").read_bytes() == shipped and (root / "dvc.lock").read_bytes() == lock
    assert not (root / "experiments/dvc.yaml").exists() and not (root / "experiments/dvc.lock").exists()


@pytest.mark.slow
def test_dvc_repro_builds_an_experiments_suite_from_its_own_stage_file(tmp_path, tiny_params):
    tiny_params["suites"]["tiny"].update(settings=[{"dataset": "digits", "partitions": ["dir0.5"]}],
                                         methods=["fedavg"], seeds=[0])  # one run: run.suites is not the point
    root = make_copy(tmp_path, tiny_params)
    add_experiment(root, "focal", {**FOCAL, "suites": {"focal": {**FOCAL["suites"]["focal"], "settings": [
        {"dataset": "digits", "partitions": ["dir0.5"]}]}}, "training": {"focal": {"inherit": "tiny", "rounds": 2}}})
    assert dvcstages.write_stages(root).startswith("dvc.yaml written")
    for cmd in (["git", "init", "-q"], [venv_bin("dvc"), "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        assert run(cmd, root).returncode == 0
    tracked = (root / "dvc.yaml").read_bytes()

    built = run([venv_bin("dvc"), "repro", "--all-pipelines"], root, FEDSKEW_TRACKING="0")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "Running stage 'experiments/dvc.yaml:train-focal'" in built.stdout
    assert "| fedprox_strong |" in (root / "results/tables/focal.md").read_text()
    assert (root / "results/tables/compare/focal.json").exists()
    assert len(list((root / "results/runs/focal").rglob("metrics.json"))) == 2
    assert set(yaml.safe_load((root / "experiments/dvc.lock").read_text())["stages"]) == {
        "train-focal", "aggregate-focal", "compare-focal"}
    assert (root / "dvc.yaml").read_bytes() == tracked and stale_stages(root) == set()


@pytest.mark.slow
def test_dvc_repro_reruns_only_what_a_training_change_affects(tmp_path, tiny_params):
    # Two datasets so that a change to one dataset's training settings has something to spare.
    tiny_params["suites"]["tiny"]["settings"] = [{"dataset": "digits", "partitions": ["dir0.5"]},
                                                 {"dataset": "synth", "partitions": ["natural"]}]
    tiny_params["suites"]["tiny"]["methods"] = ["fedavg"]
    tiny_params["training"]["tiny"]["overrides"] = {"synth": {"model": "logreg"}}
    root = make_copy(tmp_path, tiny_params)
    assert dvcstages.write_stages(root).startswith("dvc.yaml written")  # its stages are those of run.suites
    for cmd in (["git", "init", "-q"], [venv_bin("dvc"), "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        assert run(cmd, root).returncode == 0

    first = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert stale_stages(root) == set()
    before = metrics_mtimes(root)
    assert len(before) == 2 * 2  # (dir0.5, natural) x 2 seeds

    # Change the learning rate of the synthetic dataset only.
    tiny_params["training"]["tiny"]["overrides"]["synth"]["lr"] = 0.02
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert stale_stages(root) == {"train-tiny", "aggregate-tiny"}

    second = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = metrics_mtimes(root)
    retrained = {path for path in before if after[path] != before[path]}
    assert retrained == {p for p in before if "/synth/" in p}, retrained
    config = yaml.safe_load((root / "results/runs/tiny/synth/natural/fedavg/seed0/config.yaml").read_text())
    assert config["training"]["lr"] == 0.02

    third = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert third.returncode == 0
    assert "Running stage" not in third.stdout and metrics_mtimes(root) == after
    assert stale_stages(root) == set()


def metrics_mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.glob("results/runs/**/metrics.json")}
