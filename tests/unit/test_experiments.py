"""Experiments of one's own: files under experiments/ merged over params.yaml (fedskew.experiments)."""

import re
import shutil
from pathlib import Path

import pytest
import yaml

from fedskew.cli import main
from fedskew.config import ConfigError, load_params
from fedskew.dvcstages import dvc_files, dvc_yaml_text
from tests.helpers import REPO

FOCAL = {
    "suites": {"focal": {"settings": [{"dataset": "digits", "partitions": ["dir0.1"]}],
                         "methods": ["fedavg", "fedprox_strong"], "seeds": [0, 1, 2]}},
    "methods": {"fedprox_strong": {"algorithm": "fedprox", "mu": 0.1}},
    "training": {"focal": {"inherit": "default", "rounds": 5, "checkpoint_every": 5}},
}


def project(tmp_path: Path, **experiments: dict) -> Path:
    """A project folder holding the shipped params.yaml and the given experiment files."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "experiments").mkdir()
    for name, body in experiments.items():
        (tmp_path / "experiments" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return tmp_path


def problems(root: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_params(root / "params.yaml")
    return str(info.value)


def test_an_experiment_s_suite_is_merged_and_built_besides_run_suites(tmp_path) -> None:
    params = load_params(project(tmp_path, focal=FOCAL) / "params.yaml")
    assert params.default_suites == ["default", "focal"] and params.run_suites == ["default"]  # `make run`'s
    runs = params.runs(["focal"])
    assert len(runs) == 6 and {cfg.method_spec.get("mu") for cfg in runs} == {None, 0.1}
    # the shipped suites are the shipped file's, run for run
    shipped = load_params(REPO / "params.yaml", experiments=None)
    assert [c.run_id for c in params.runs(["default"])] == [c.run_id for c in shipped.runs(["default"])]


def test_inheriting_a_training_block_is_the_same_run_as_writing_it_out(tmp_path) -> None:
    inherited = load_params(project(tmp_path, focal=FOCAL) / "params.yaml").runs(["focal"])[0]
    written = dict(yaml.safe_load((REPO / "params.yaml").read_text())["training"]["default"])
    written.pop("overrides")  # synthetic_1_1's: the suite trains on digits only
    spelled = {**FOCAL, "training": {"focal": {**written, "rounds": 5, "checkpoint_every": 5}}}
    other = tmp_path / "spelled"
    other.mkdir()
    assert load_params(project(other, focal=spelled) / "params.yaml").runs(["focal"])[0].run_id == inherited.run_id
    assert "inherit" not in inherited.training and inherited.training["rounds"] == 5


def test_an_unknown_method_is_refused_with_the_file_and_the_key(tmp_path) -> None:
    bad = {**FOCAL, "suites": {"focal": {**FOCAL["suites"]["focal"], "methods": ["fedavg", "fedproxx"]}}}
    message = problems(project(tmp_path, focal=bad))
    written = (tmp_path / "experiments" / "focal.yaml").read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(written) if text.strip() == "- fedproxx")  # the file, line and key
    assert f"experiments/focal.yaml: line {line}: suites.focal.methods[1]: 'fedproxx' is neither" in message
    assert "did you mean 'fedprox'?" in message


def test_an_experiment_adds_names_and_replaces_none(tmp_path) -> None:
    clash = {"suites": {"default": FOCAL["suites"]["focal"]}, "training": {"default": {"rounds": 1}}}
    message = problems(project(tmp_path, mine=clash))
    assert "experiments/mine.yaml: suites.default is already defined in" in message and "params.yaml" in message
    assert "training.default is already defined" in message
    other = tmp_path / "twice"
    other.mkdir()
    twice = problems(project(other, a=FOCAL, b=FOCAL))
    assert "experiments/b.yaml: suites.focal is already defined in" in twice and "experiments/a.yaml" in twice


def test_run_and_reproduce_stay_params_yaml_s(tmp_path) -> None:
    message = problems(project(tmp_path, focal={**FOCAL, "run": {"suites": ["focal"]}}))
    assert "experiments/focal.yaml: `run` cannot be set by an experiment" in message


def test_a_suite_without_a_training_block_is_an_error_naming_it(tmp_path) -> None:
    message = problems(project(tmp_path, focal={k: v for k, v in FOCAL.items() if k != "training"}))
    assert re.search(r"experiments/focal.yaml: line \d+: suites.focal: no training block training.focal", message)
    assert "inherit" in message


def test_an_inherited_block_must_exist_and_not_inherit_from_itself(tmp_path) -> None:
    typo = {**FOCAL, "training": {"focal": {"inherit": "defualt"}}}
    assert "training.focal.inherit: 'defualt' is not a training block (did you mean 'default'?)" in problems(
        project(tmp_path, focal=typo))
    loop = {**FOCAL, "training": {"focal": {"inherit": "focal2"}, "focal2": {"inherit": "focal"}}}
    other = tmp_path / "loop"
    other.mkdir()
    assert "cannot inherit from itself" in problems(project(other, focal=loop))


def test_dvc_reads_an_experiment_s_keys_from_its_file_in_a_stage_file_of_its_own(tmp_path) -> None:
    root = project(tmp_path, focal=FOCAL)
    files = dvc_files(load_params(root / "params.yaml"), REPO)
    assert files["dvc.yaml"] == dvc_yaml_text(load_params(root / "params.yaml", experiments=None), REPO)
    stages = yaml.safe_load(files["experiments/dvc.yaml"])["stages"]
    train = stages["train-focal"]
    assert train["wdir"] == ".." and train["cmd"] == "snakemake --cores all results/runs/focal/TRAINED"
    assert "training.default" in train["params"]  # a change of the inherited block retrains the suite
    assert {"experiments/focal.yaml": ["suites.focal", "training.focal", "methods.fedprox_strong"]} in train["params"]


def test_validate_checks_the_experiments(tmp_path, capsys, monkeypatch) -> None:
    root = project(tmp_path, focal=FOCAL)
    monkeypatch.chdir(root)
    assert main(["validate"]) == 0
    assert "focal" in capsys.readouterr().out


def test_make_run_builds_run_suites_alone_and_an_experiment_s_suite_when_named(tmp_path, monkeypatch) -> None:
    from fedskew import cli, rebuild

    built = []

    def build(params, suites, **options) -> tuple[int, str]:  # what `run` asks to build, without building it
        built.append(suites)
        return 0, "fedskew: rebuilt"

    monkeypatch.setattr(rebuild, "run_in_place", build)
    monkeypatch.setattr(cli, "_say_what_is_stale", lambda params, suites: None)
    monkeypatch.chdir(project(tmp_path, focal=FOCAL))
    for args in (["run"], ["run", "--suite", "focal"], ["run", "--suite", "default", "focal"]):
        assert main(args) == 0, args
    assert built == [["default"], ["focal"], ["default", "focal"]]
