"""DVC's stages agree with Snakemake, and the committed dvc.lock is current (fedskew.dvcstages, fedskew.dvclock).

dvc.yaml is what `python -m fedskew dvc-stages` writes for params.yaml and the code; each stage depends on the
modules its phase runs and on the keys of params.yaml it reads, by name; and dvc.lock records every dependency
and params value as DVC computes them now, so that a fresh clone's `dvc status` flags nothing but the outputs it
has not built."""

from __future__ import annotations

import ast
import copy
import difflib

import pytest
import yaml

from fedskew import dvclock, dvcstages, phase_code
from fedskew.config import Params, load_params, read_params_file
from fedskew.dvcstages import DvcFilesError, param_key, stages, suite_keys
from fedskew.phase_code import PHASES, SourceTree, Uses
from fedskew.reproduce import own_claims
from tests.helpers import REPO

RAW = read_params_file(REPO / "params.yaml")


def params_with(**changes):
    """The committed params.yaml with top-level sections replaced (a deep copy)."""
    return load_params({**copy.deepcopy(RAW), **changes})


def stage_deps(params, name: str) -> list[str]:
    return next(s for s in stages(params, REPO) if s.name == name).body["deps"]


# ---------------------------------------------------------------------------------------------------------------
# The committed files


def test_dvc_yaml_is_what_dvc_stages_writes_for_params_yaml_and_the_code() -> None:
    committed = (REPO / "dvc.yaml").read_text()
    written = dvcstages.dvc_yaml_text(load_params(REPO / "params.yaml"), REPO)
    diff = "".join(list(difflib.unified_diff(committed.splitlines(True), written.splitlines(True), "dvc.yaml",
                                             "what dvc-stages writes"))[:60])
    if committed != written:
        pytest.fail(f"dvc.yaml is not what params.yaml and the code's imports give: run `{dvclock.LOCK_COMMAND}` "
                    f"(it writes dvc.yaml, then records dvc.lock)\n{diff}", pytrace=False)


def test_the_committed_dvc_lock_agrees_with_the_code_and_params_yaml() -> None:
    problems = dvclock.lock_problems(REPO)
    assert not problems, "dvc.lock is stale:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------------------------
# deps: the modules a phase runs


def test_a_suites_train_stage_runs_the_files_of_its_own_methods_sources_and_schemes_only(monkeypatch) -> None:
    deps = stage_deps(load_params(REPO / "params.yaml"), "train-default")  # fedavg, fedprox, fedlc; digits, synthetic
    for used in ("fl/fedavg.py", "fl/fedprox.py", "fl/fedlc.py", "fl/base.py", "fl/losses.py", "engine/simulation.py",
                 "models/net.py", "numerics/gemm.py", "job.py", "data/datasets/digits.py",
                 "data/datasets/synthetic.py", "data/partitions/dirichlet.py", "data/partitions/natural.py"):
        assert f"src/fedskew/{used}" in deps, used
    for unused in ("fl/moon.py", "fl/scaffold.py", "sfl/scala.py", "data/datasets/torchvision_family.py",
                   "data/partitions/shards.py", "report/tables.py", "cli.py", "rebuild.py"):
        assert f"src/fedskew/{unused}" not in deps, unused
    assert deps[:2] == ["data/raw", "data/partitions"] and deps[-1] == "workflow/rules/train.smk"

    # A split method brings its module (and what it imports) in; the federated ones it left stay out. (The shipped
    # claims file is about the default suite's own methods: it is left out here, as it would no longer load.)
    monkeypatch.setattr(own_claims, "claims_files", lambda folder: [])
    suites = copy.deepcopy(RAW["suites"])
    suites["default"]["methods"] = ["scala"]
    split = stage_deps(params_with(suites=suites), "train-default")
    assert "src/fedskew/sfl/scala.py" in split and "src/fedskew/fl/fedprox.py" not in split


def test_the_data_phases_do_not_depend_on_training_or_reporting_code() -> None:
    params = load_params(REPO / "params.yaml")
    download, partition = stage_deps(params, "download"), stage_deps(params, "partition")
    assert "src/fedskew/data/registry.py" in download and "src/fedskew/data/fetch/verify.py" in download
    # partition runs one function of job.py: its imports, not those of training
    assert "src/fedskew/job.py" in partition and "src/fedskew/data/partitions/heatmap.py" in partition
    for training in ("src/fedskew/engine/simulation.py", "src/fedskew/models/net.py", "src/fedskew/fl/fedavg.py",
                     "src/fedskew/tracking/worker.py"):
        assert training not in download and training not in partition, training
    assert "src/fedskew/job.py" not in download


def test_the_aggregate_stage_depends_on_the_paper_values_its_figures_read() -> None:
    deps = stage_deps(load_params(REPO / "params.yaml"), "aggregate-default")
    assert {"src/fedskew/reproduce/layouts", "src/fedskew/reproduce/papers", "src/fedskew/report/tables.py",
            "results/runs/default"} <= set(deps)
    assert "src/fedskew/engine/simulation.py" not in deps


def _cli_command_modules(command: str) -> set[str]:
    """The fedskew modules `python -m fedskew <command>` reaches from cli.cmd_<command>: those it imports, and
    those the CLI imports at its top that it names; or the module that cmd_<command> is imported from."""
    tree = ast.parse((REPO / "src/fedskew/cli.py").read_text())
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedskew"):
            for alias in node.names:
                module = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = module if SourceTree(REPO).file(module) else node.module
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f"cmd_{command}"), None)
    if function is None:  # the command's function lives in its own module, which the CLI imports it from
        return {bound[f"cmd_{command}"]}
    named = {bound[n.id] for n in ast.walk(function) if isinstance(n, ast.Name) and n.id in bound}
    own = {f"{n.module}" for n in ast.walk(function) if isinstance(n, ast.ImportFrom) and n.module}
    return {m for m in named | own if m.startswith("fedskew")}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_each_phase_runs_every_module_its_cli_command_reaches(phase: str) -> None:
    params = load_params(REPO / "params.yaml")
    tree = SourceTree(REPO)
    files = set(tree.code_of(PHASES[phase], Uses.of(params, params.default_suites).members(params)))
    reached = _cli_command_modules(PHASES[phase].command)
    assert reached, phase
    missing = sorted(m for m in reached if str(tree.file(m).relative_to(REPO)) not in files)
    assert not missing, f"cli.cmd_{phase} reaches {missing}, which fedskew.phase_code.PHASES[{phase!r}] misses"


def test_every_module_that_imports_its_whole_package_is_known() -> None:
    calling = set()
    for path in (REPO / "src/fedskew").rglob("*.py"):
        if path.name != "discovery.py" and any(
                isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "discover"
                for n in ast.walk(ast.parse(path.read_text()))):
            module = ".".join(path.relative_to(REPO / "src").with_suffix("").parts)
            calling.add(module.removesuffix(".__init__"))
    assert calling == set(phase_code.DISCOVERING)


def test_every_data_file_in_the_package_is_read_by_a_module_that_names_it() -> None:
    tree = SourceTree(REPO)
    modules = [".".join(p.relative_to(REPO / "src").with_suffix("").parts).removesuffix(".__init__")
               for p in (REPO / "src/fedskew").rglob("*.py")]
    named = {p for m in modules for p in tree.data_beside(m)}
    assert named and all(p.exists() for p in named), named
    data = [p for p in (REPO / "src/fedskew").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    unread = [str(p.relative_to(REPO)) for p in data if not any(p == n or n in p.parents for n in named)]
    assert data and not unread, f"no module names these beside itself (Path(__file__).parent / ...): {unread}"


def test_an_entry_point_naming_a_missing_function_is_refused_in_one_line() -> None:
    phase = phase_code.Phase("partition", ("fedskew.job:no_such_function",), "workflow/rules/partition.smk")
    with pytest.raises(DvcFilesError, match=r"no_such_function\(\).*correct fedskew.phase_code.PHASES"):
        SourceTree(REPO).code_of(phase, {})


# ---------------------------------------------------------------------------------------------------------------
# params: the keys a stage reads


def test_a_suites_stages_read_its_own_keys_by_name_and_no_whole_section() -> None:
    params = load_params(REPO / "params.yaml")
    keys = [key.path for key in suite_keys(params, "default")]
    assert keys == ["suites.default", "training.default", "methods.fedavg", "methods.fedprox", "methods.fedlc",
                    "datasets.digits", "datasets.synthetic_1_1", "partitions.dir0?1", "partitions.dir0?5",
                    "partitions.q2", "partitions.natural"]
    by_name = {s.name: s.body["params"] for s in stages(params, REPO)}
    assert by_name["aggregate-default"] == keys
    assert by_name["download"] == ["run.suites", "suites.default.settings", "datasets.digits", "datasets.synthetic_1_1"]
    assert "suites.default.seeds" in by_name["partition"] and "training.default" not in by_name["partition"]


def test_a_method_a_suite_names_that_methods_does_not_define_has_no_key() -> None:
    params = load_params(REPO / "params.yaml")
    assert "scaffold" in RAW["suites"]["methods"]["methods"] and "scaffold" not in RAW["methods"]
    keys = [key.path for key in suite_keys(params, "methods")]
    assert "methods.fedprox" in keys and not any(k.startswith("methods.scaffold") for k in keys)


def test_a_dotted_name_is_a_key_dvc_reads_as_that_name_alone(tmp_path) -> None:
    from dvc.dependency.param import read_param_file
    from dvc.fs import LocalFileSystem

    partitions = {"dir0.5": {"beta": 0.5}, "dir0_5": {"beta": 5}, "dir0.1": {"beta": 0.1}, "q2": {"alpha": 2}}
    params = Params({"partitions": partitions})  # param_key reads only the section's names
    keys = {name: param_key(params, "partitions", name).path for name in partitions}
    assert keys["dir0.1"] == "partitions.dir0?1" and keys["q2"] == "partitions.q2"
    assert keys["dir0.5"] == "partitions.dir0[!0-9A-Za-z_-]5"  # `?` would also match dir0_5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"partitions": partitions}))
    read = read_param_file(LocalFileSystem(), str(tmp_path / "params.yaml"), list(keys.values()), flatten=True)
    assert read == {keys[name]: spec for name, spec in partitions.items()}


def test_a_suite_with_a_dot_gets_a_stage_name_dvc_accepts_and_clashing_names_are_refused() -> None:
    suites = copy.deepcopy(RAW["suites"])
    assert "split_long_p0.2" in suites
    params = params_with(run={"suites": ["default", "split_long_p0.2"]})
    names = [s.name for s in stages(params, REPO)]
    assert names == ["download", "partition", "train-default", "train-split_long_p0_2", "aggregate-default",
                     "aggregate-split_long_p0_2", "compare-default", "compare-split_long_p0_2", "claims-default"]
    suites["split_long_p0_2"] = suites["split_long_p0.2"]
    training = {**copy.deepcopy(RAW["training"]), "split_long_p0_2": {"inherit": "split_long_p0.2"}}
    clash = load_params({**copy.deepcopy(RAW), "suites": suites, "training": training,
                         "run": {"suites": ["split_long_p0.2", "split_long_p0_2"]}})
    with pytest.raises(DvcFilesError, match="differ only by `.` and `_`.*rename one"):
        stages(clash, REPO)


def test_a_claims_file_about_suites_of_run_suites_gets_a_ledger_stage_and_one_about_others_none(
        tmp_path, monkeypatch) -> None:
    params = load_params(REPO / "params.yaml")
    ledger = next(s for s in stages(params, REPO) if s.name == "claims-default").body
    assert ledger["cmd"] == "snakemake --cores all results/claims/default.md"
    assert ledger["deps"][:2] == ["experiments/claims/default.yaml", "results/runs/default"]
    for used in ("reproduce/own_ledger.py", "reproduce/verdicts.py", "reproduce/policy.yaml", "reproduce/commands.py"):
        assert f"src/fedskew/{used}" in ledger["deps"], used
    for unused in ("reproduce/ledger.py", "reproduce/side_evidence.py", "engine/simulation.py", "report/tables.py"):
        assert f"src/fedskew/{unused}" not in ledger["deps"], unused  # the papers' ledger, training, the tables
    assert ledger["outs"] == [{"results/claims/default.md": {"cache": False}}]
    assert ledger["metrics"] == [{"results/claims/default.json": {"cache": False}}]

    # A claims file about `methods` (not in run.suites): its runs are outside DVC's stages, and so is its ledger.
    about_methods = tmp_path / "mine.yaml"
    about_methods.write_text("suite: methods\nclaims:\n  - {id: m-01, statement: FedProx beats FedAvg, word: beats,"
                             " subject: fedprox, against: [fedavg], columns: [digits / dir0.1]}\n")
    monkeypatch.setattr(own_claims, "claims_files", lambda folder: [about_methods])
    assert [s.name for s in stages(params, REPO) if s.phase == "claims"] == []
    about_default = tmp_path / "ours.yaml"
    about_default.write_text(about_methods.read_text().replace("suite: methods", "suite: default"))
    monkeypatch.setattr(own_claims, "claims_files", lambda folder: [about_default])
    assert [s.name for s in stages(params, REPO) if s.phase == "claims"] == ["claims-ours"]


# ---------------------------------------------------------------------------------------------------------------
# A researcher's experiments: their stages in experiments/dvc.yaml, the tracked dvc.yaml as it is without them

FOCAL = {  # a suite of one's own on data the default suite has already: FedAvg against a stronger FedProx
    "suites": {"focal": {"settings": [{"dataset": "digits", "partitions": ["dir0.1"]}],
                         "methods": ["fedavg", "fedprox_strong"], "seeds": [0, 1]}},
    "methods": {"fedprox_strong": {"algorithm": "fedprox", "mu": 0.1}},
    "training": {"focal": {"inherit": "default", "rounds": 2, "checkpoint_every": 2}},
}


def own_project(tmp_path, **experiments: dict):
    """A project for dvc-stages: the shipped params.yaml and claims file, the code (linked), the experiments."""
    root = tmp_path / "project"
    (root / "experiments" / "claims").mkdir(parents=True)
    (root / "src").symlink_to(REPO / "src")
    (root / "params.yaml").write_bytes((REPO / "params.yaml").read_bytes())
    (root / "experiments/claims/default.yaml").write_bytes((REPO / "experiments/claims/default.yaml").read_bytes())
    for name, body in experiments.items():
        (root / "experiments" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return root


def test_dvc_stages_with_an_experiment_leaves_dvc_yaml_unchanged_and_writes_experiments_dvc_yaml(tmp_path) -> None:
    root = own_project(tmp_path)
    assert dvcstages.write_stages(root).startswith("dvc.yaml written")
    shipped = (root / "dvc.yaml").read_bytes()

    (root / "experiments/focal.yaml").write_text(yaml.safe_dump(FOCAL, sort_keys=False))
    assert dvcstages.write_stages(root) == ("dvc.yaml is up to date; experiments/dvc.yaml written: stages "
                                            "train-focal, aggregate-focal, compare-focal")
    assert (root / "dvc.yaml").read_bytes() == shipped
    own = yaml.safe_load((root / "experiments/dvc.yaml").read_text())["stages"]
    assert all(body["wdir"] == ".." for body in own.values())  # run at the project root, its paths the project's
    assert own["train-focal"]["deps"][:2] == ["data/raw", "data/partitions"]  # dvc.yaml's download and partition
    assert own["aggregate-focal"]["metrics"] == [{"results/tables/focal.json": {"cache": False}}]
    # the stage file is not an experiment: the project reads as it did
    assert set(load_params(root / "params.yaml").origins.values()) == {"experiments/focal.yaml"}
    assert dvcstages.write_stages(root) == "dvc.yaml is up to date; experiments/dvc.yaml is up to date"

    (root / "experiments/focal.yaml").unlink()
    assert dvcstages.write_stages(root) == ("dvc.yaml is up to date; experiments/dvc.yaml removed (no suite of "
                                            "experiments/ has a stage)")
    assert (root / "dvc.yaml").read_bytes() == shipped and not (root / "experiments/dvc.yaml").exists()


def test_a_claims_file_about_an_experiments_suite_gets_its_ledger_stage_beside_that_suites_stages(tmp_path) -> None:
    root = own_project(tmp_path, focal=FOCAL)
    (root / "experiments/claims/mine.yaml").write_text(
        "suite: focal\nclaims:\n  - {id: f-01, statement: FedProx beats FedAvg, word: beats, subject: fedprox_strong,"
        " against: [fedavg], columns: [digits / dir0.1]}\n")
    files = {s.name: s.file for s in stages(load_params(root / "params.yaml"), root)}
    assert files["claims-mine"] == "experiments/dvc.yaml" and files["claims-default"] == "dvc.yaml"
    assert files["train-focal"] == "experiments/dvc.yaml" and files["train-default"] == "dvc.yaml"


def test_a_stage_name_or_output_in_both_files_is_refused_before_either_is_written(tmp_path) -> None:
    # params.yaml's split_long_p0.2 in run.suites, an experiment's split_long_p0_2: both would be train-split_long_p0_2
    suites = copy.deepcopy(RAW["suites"])
    raw = {**copy.deepcopy(RAW), "run": {"suites": ["default", "split_long_p0.2"]}}
    root = own_project(tmp_path, mine={"suites": {"split_long_p0_2": suites["split_long_p0.2"]},
                                       "training": {"split_long_p0_2": {"inherit": "split_long_p0.2"}}})
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(DvcFilesError, match=r"train-split_long_p0_2.*differ only by `.` and `_`.*rename one"):
        dvcstages.write_stages(root)
    assert not (root / "dvc.yaml").exists() and not (root / "experiments/dvc.yaml").exists()

    stage = dvcstages.Stage("other", "aggregate", ("focal",), {"outs": [{"results/tables/focal.md": {}}]},
                            dvcstages.EXPERIMENTS_FILE)
    with pytest.raises(DvcFilesError, match="results/tables/focal.md overlaps results/tables/focal.md"):
        dvcstages._refuse_clashes([*stages(load_params(own_project(tmp_path / "b", focal=FOCAL) / "params.yaml"),
                                           REPO), stage])


def test_an_experiments_dvc_yaml_that_dvc_stages_did_not_write_is_left_as_it_is(tmp_path) -> None:
    root = own_project(tmp_path, focal=FOCAL)
    mine = "stages:\n  plot:\n    cmd: python plot.py\n"
    (root / "experiments/dvc.yaml").write_text(mine)
    with pytest.raises(DvcFilesError, match=r"experiments/dvc.yaml was not written by `python -m fedskew "
                                            r"dvc-stages`.*move it elsewhere"):
        dvcstages.write_stages(root)
    assert (root / "experiments/dvc.yaml").read_text() == mine and not (root / "dvc.yaml").exists()
