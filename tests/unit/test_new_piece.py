"""`python -m fedskew new method NAME` (fedskew.newpiece): the package it writes is a working plugin, and what it
refuses (a bad name, a folder in the way, a failure midway) leaves nothing written."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import tomllib

import pytest
import yaml

from fedskew import newpiece, plugins
from fedskew.cli import main
from fedskew.config_errors import ConfigError
from tests.helpers import REPO

NAME = "fedmine_unit"  # no module of that name exists, so importing it finds the generated one
FILES = ["pyproject.toml", f"{NAME}/__init__.py", f"{NAME}/method.py", f"tests/test_{NAME}.py",
         f"experiments/{NAME}.yaml", "README.md"]


def _load(path: pathlib.Path, module: str):
    """The module at `path`, imported by file path (not installed, not on sys.path) as `module`."""
    spec = importlib.util.spec_from_file_location(module, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[module] = loaded  # where fedskew looks a class's module up (its docstring, the summary)
    spec.loader.exec_module(loaded)
    return loaded


@pytest.fixture
def generated(tmp_path):
    """A new method package written into tmp_path/pkg; its modules leave sys.modules with the test."""
    target = tmp_path / "pkg"
    written = newpiece.create("method", NAME, target)
    yield target, written
    for module in [m for m in sys.modules if NAME in m]:
        del sys.modules[module]


def test_writes_every_file_and_nothing_else(generated) -> None:
    target, written = generated
    assert written == FILES
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == sorted(FILES)
    for path in target.rglob("*"):  # every placeholder filled
        assert not path.is_file() or "{name}" not in path.read_text() and "{Class}" not in path.read_text()


def test_the_method_imports_from_its_file_as_a_fedavg_named_as_its_entry_point(generated) -> None:
    from fedskew.declarations import describe_method
    from fedskew.fl.fedavg import FedAvg

    target, _ = generated
    source = (target / NAME / "method.py").read_text()
    compile(source, "method.py", "exec")
    cls = _load(target / NAME / "method.py", f"{NAME}_by_path").FedmineUnit
    assert issubclass(cls, FedAvg) and cls.name == NAME and cls.defaults == {}

    pyproject = tomllib.loads((target / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "fedskew-fedmine-unit"
    assert pyproject["project"]["entry-points"]["fedskew.methods"] == {NAME: f"{NAME}.method:FedmineUnit"}
    assert pyproject["tool"]["setuptools"]["packages"] == [NAME]
    # what fedskew checks of an installed plugin's method, and the record its listing prints
    entry = plugins.Plugin("method", NAME, f"{NAME}.method:FedmineUnit", "fedskew-fedmine-unit", cls)
    assert plugins.method_problem(entry) is None
    assert describe_method(cls)["summary"].startswith("FedmineUnit: say here what the method changes")


def test_its_own_test_passes_one_round_as_fedavg(generated, monkeypatch) -> None:
    target, _ = generated
    monkeypatch.syspath_prepend(str(target))  # as its pyproject's pytest pythonpath does
    test = _load(target / "tests" / f"test_{NAME}.py", f"test_{NAME}")
    tests = sorted(name for name in dir(test) if name.startswith("test_"))
    assert tests == ["test_is_named_as_its_entry_point", "test_trains_one_round_as_fedavg_while_unchanged"]
    for name in tests:  # each asserts what it checks; a failure raises here
        getattr(test, name)()


def test_the_experiment_compares_it_with_fedavg_on_what_params_yaml_defines(generated) -> None:
    target, _ = generated
    experiment = yaml.safe_load((target / "experiments" / f"{NAME}.yaml").read_text())
    suite = experiment["suites"][NAME]
    assert suite["methods"] == ["fedavg", NAME]
    training = experiment["training"][NAME]
    assert training["inherit"] == "default" and training["checkpoint_every"] <= training["rounds"] <= 5
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for setting in suite["settings"]:
        assert setting["dataset"] in params["datasets"]
        assert set(setting["partitions"]) <= set(params["partitions"])


def test_the_command_needs_no_params_yaml_and_says_what_comes_next(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here
    assert main(["new", "method", NAME]) == 0
    out = capsys.readouterr().out
    assert sorted(p.relative_to(tmp_path / NAME).as_posix() for p in (tmp_path / NAME).rglob("*")
                  if p.is_file()) == sorted(FILES)
    assert f"wrote {NAME}/" in out and f"pip install -e {NAME}" in out
    assert f"cp {NAME}/experiments/{NAME}.yaml experiments/" in out and "python -m fedskew validate" in out


@pytest.mark.parametrize("name, says", [
    ("FedMine", "lower-case letters"), ("1fed", "starting with a letter"), ("fed-mine", "lower-case letters"),
    ("_fed", "starting with a letter"), ("class", "no Python keyword"), ("", "lower-case letters"),
    ("fedprox", "already a built-in method"), ("torch", "already an importable module"),
])
def test_bad_names_are_refused_in_one_line_and_nothing_is_written(tmp_path, name, says) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        newpiece.create("method", name, tmp_path / "pkg")
    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_in_the_way_is_refused_and_left_as_it_was(tmp_path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("a file")
    for target in (tmp_path / "pkg", tmp_path / "file"):
        with pytest.raises(ConfigError, match=f"{target.name} exists and is not .*give --dir a new or empty"):
            newpiece.create("method", NAME, target)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["file", "pkg", "pkg/notes.txt"]
    assert (tmp_path / "pkg" / "notes.txt").read_text() == "mine"


def test_the_current_folder_is_refused_even_empty(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # renaming onto it would leave the shell in a deleted folder
    with pytest.raises(ConfigError, match="is the current folder; give --dir a new folder inside it"):
        newpiece.create("method", NAME, pathlib.Path("."))
    assert list(tmp_path.iterdir()) == []


def test_an_empty_folder_is_filled(tmp_path) -> None:
    (tmp_path / "pkg").mkdir()
    assert newpiece.create("method", NAME, tmp_path / "pkg") == FILES
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path, monkeypatch) -> None:
    real, calls = pathlib.Path.write_text, []

    def failing(self, *args, **kwargs):  # the third file cannot be written (a full disk, say)
        calls.append(self)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", failing)
    with pytest.raises(ConfigError, match="cannot write .*pkg: No space left on device; nothing was written"):
        newpiece.create("method", NAME, tmp_path / "pkg")
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_on_the_command_line_is_one_line_with_exit_code_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new", "method", "FedMine"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedskew new: 'FedMine' cannot name a method package") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_class_names_and_the_packaged_templates() -> None:
    assert newpiece.class_name("fedfocal") == "Fedfocal" and newpiece.class_name("my_method2") == "MyMethod2"
    templates = REPO / "src/fedskew/templates/method"
    assert sorted(p.name for p in templates.iterdir()) == sorted(newpiece.METHOD_FILES.values())
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "templates/**/*" in pyproject["tool"]["setuptools"]["package-data"]["fedskew"]


# --- `python -m fedskew new method NAME --kind server` ---------------------------------------------------------

SERVER = "fedmom_unit"  # no module of that name exists either


@pytest.fixture
def server_package(tmp_path):
    """A new server method's package written into tmp_path/pkg; its modules leave sys.modules with the test."""
    target = tmp_path / "pkg"
    written = newpiece.create("method", SERVER, target, "server")
    yield target, written
    for module in [m for m in sys.modules if SERVER in m]:
        del sys.modules[module]


def test_a_server_method_is_a_methods_package_whose_fold_keeps_a_state(server_package) -> None:
    from fedskew.fl.base import TrainingSettings
    from fedskew.fl.fedavg import FedAvg

    target, written = server_package
    assert written == [path.replace(NAME, SERVER) for path in FILES]
    as_loss = newpiece.rendered("method", SERVER)  # the files a method's own part does not change
    for shared in ("pyproject.toml", f"{SERVER}/__init__.py", f"experiments/{SERVER}.yaml"):
        assert (target / shared).read_text() == as_loss[shared]
    for path in target.rglob("*"):
        assert not path.is_file() or "{name}" not in path.read_text() and "{Class}" not in path.read_text()
    cls = _load(target / SERVER / "method.py", f"{SERVER}_by_path").FedmomUnit
    assert issubclass(cls, FedAvg) and cls.name == SERVER and "begin_aggregate" in vars(cls)
    assert cls.defaults == {"server_lr": 1.0, "server_momentum": 0.0}
    entry = plugins.Plugin("method", SERVER, f"{SERVER}.method:FedmomUnit", "fedskew-fedmom-unit", cls)
    assert plugins.method_problem(entry) is None
    assert cls(TrainingSettings(1, 8, 0.1, 0.0, 0.0), 2, 3).state_dict() == {"velocity": {}}


def test_a_server_methods_own_tests_pass_resuming_bit_for_bit(server_package, monkeypatch, tmp_path) -> None:
    target, _ = server_package
    monkeypatch.syspath_prepend(str(target))
    test = _load(target / "tests" / f"test_{SERVER}.py", f"test_{SERVER}")
    assert sorted(name for name in dir(test) if name.startswith("test_")) == [
        "test_a_run_stopped_halfway_resumes_from_its_checkpoint_file_bit_for_bit",
        "test_is_named_as_its_entry_point", "test_trains_as_fedavg_up_to_rounding_while_unchanged"]
    test.test_is_named_as_its_entry_point()  # each asserts what it checks; a failure raises here
    test.test_a_run_stopped_halfway_resumes_from_its_checkpoint_file_bit_for_bit(tmp_path / "checkpoint")
    test.test_trains_as_fedavg_up_to_rounding_while_unchanged()


def test_the_command_writes_a_server_method_from_its_packaged_templates(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new", "method", SERVER, "--kind", "server"]) == 0
    assert f"wrote {SERVER}/" in capsys.readouterr().out
    assert "class ServerFold(Fold):" in (tmp_path / SERVER / SERVER / "method.py").read_text()
    templates = REPO / "src/fedskew/templates/server"
    assert sorted(p.name for p in templates.iterdir()) == sorted(newpiece.SERVER_TEMPLATES)


@pytest.mark.parametrize("kind, method_kind, says", [
    ("partition", "server", "--kind server is for a method (its loss or its server update); a partition package"),
    ("method", "client", "--kind 'client' is not a kind of method; choose loss or server"),
])
def test_a_kind_of_no_method_is_refused_in_one_line_and_nothing_is_written(tmp_path, kind, method_kind, says):
    with pytest.raises(ConfigError) as refused:
        newpiece.create(kind, "fedmom_other", tmp_path / "pkg", method_kind)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


# --- `python -m fedskew new partition NAME` ---------------------------------------------------------------------

SCHEME = "skew_unit"  # no module of that name exists either
SCHEME_FILES = ["pyproject.toml", f"{SCHEME}/__init__.py", f"{SCHEME}/scheme.py", f"tests/test_{SCHEME}.py",
                f"experiments/{SCHEME}.yaml", "README.md"]


def _package(tmp_path, kind: str, name: str):
    """A new package of `kind` written into tmp_path/pkg, (folder, files written); its modules leave sys.modules
    with the test."""
    target = tmp_path / "pkg"
    written = newpiece.create(kind, name, target)
    yield target, written
    for module in [m for m in sys.modules if name in m]:
        del sys.modules[module]


def _installed_outputs(target, tmp_path, name: str, commands: tuple[str, ...]) -> dict[str, object]:
    """The package installed as pip installs it (into a folder of its own), its experiment copied beside the
    shipped params.yaml: each `python -m fedskew <command>`'s completed process, by command."""
    import os
    import shutil
    import subprocess

    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target",
                           str(tmp_path / "site"), str(target)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "project"
    (root / "experiments").mkdir(parents=True)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    shutil.copy(target / "experiments" / f"{name}.yaml", root / "experiments")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(tmp_path / "site")])}
    return {command: subprocess.run([sys.executable, "-m", "fedskew", command], cwd=root, env=env,
                                    capture_output=True, text=True, timeout=300) for command in commands}


@pytest.fixture
def scheme_package(tmp_path):
    yield from _package(tmp_path, "partition", SCHEME)


def test_a_scheme_package_has_every_file_and_its_scheme_is_declared_as_its_entry_point(scheme_package) -> None:
    from fedskew.data.partitions import Scheme
    from fedskew.data.partitions.registry import scheme_problem

    target, written = scheme_package
    assert written == SCHEME_FILES
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == sorted(SCHEME_FILES)
    for path in target.rglob("*"):
        assert not path.is_file() or "{name}" not in path.read_text() and "{Class}" not in path.read_text()
    cls = _load(target / SCHEME / "scheme.py", f"{SCHEME}_by_path").SkewUnit
    assert issubclass(cls, Scheme) and cls.name == SCHEME and scheme_problem(cls, SCHEME) is None
    assert list(cls.parameters) == ["clients"] and cls.defaults == {} and cls.version == 1
    pyproject = tomllib.loads((target / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "fedskew-skew-unit"
    assert pyproject["project"]["entry-points"]["fedskew.partitions"] == {SCHEME: f"{SCHEME}.scheme:SkewUnit"}
    assert pyproject["tool"]["setuptools"]["packages"] == [SCHEME]


def test_a_scheme_packages_own_tests_pass_drawing_as_iid(scheme_package, monkeypatch) -> None:
    target, _ = scheme_package
    monkeypatch.syspath_prepend(str(target))
    test = _load(target / "tests" / f"test_{SCHEME}.py", f"test_{SCHEME}")
    tests = [getattr(test, name) for name in dir(test) if name.startswith("test_")]
    assert len(tests) == 4
    for case in tests:
        case()


def test_a_scheme_packages_experiment_defines_its_partition_beside_iid(scheme_package) -> None:
    target, _ = scheme_package
    experiment = yaml.safe_load((target / "experiments" / f"{SCHEME}.yaml").read_text())
    assert experiment["partitions"] == {SCHEME: {"scheme": SCHEME, "clients": 10}}
    suite = experiment["suites"][SCHEME]
    assert suite["methods"] == ["fedavg"]
    assert suite["settings"] == [{"dataset": "digits", "partitions": ["iid", SCHEME]}]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert "digits" in params["datasets"] and params["partitions"]["iid"] == {"scheme": "iid", "clients": 10}
    training = experiment["training"][SCHEME]
    assert training["inherit"] in params["training"] and training["checkpoint_every"] <= training["rounds"] <= 5


def test_an_installed_scheme_package_validates_with_its_experiment(scheme_package, tmp_path) -> None:
    target, _ = scheme_package
    out = _installed_outputs(target, tmp_path, SCHEME, ("validate", "partitions"))
    assert out["validate"].returncode == 0, out["validate"].stderr[-3000:]
    assert "and 1 experiment file(s) valid" in out["validate"].stdout
    assert out["partitions"].returncode == 0, out["partitions"].stderr[-3000:]
    assert f"{SCHEME:16s}{SCHEME:20s}clients=10 (scheme of plugin fedskew-skew-unit)" in out["partitions"].stdout


@pytest.mark.parametrize("name, says", [
    ("dirichlet", "already a built-in partition scheme"), ("Skew", "cannot name a partition package"),
])
def test_a_scheme_name_taken_or_malformed_is_refused_and_nothing_is_written(tmp_path, name, says) -> None:
    with pytest.raises(ConfigError, match=says):
        newpiece.create("partition", name, tmp_path / "pkg")
    assert list(tmp_path.iterdir()) == []


def test_the_command_writes_a_scheme_package_and_its_templates_are_packaged(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new", "partition", SCHEME]) == 0
    assert f"wrote {SCHEME}/" in capsys.readouterr().out
    assert sorted(p.relative_to(tmp_path / SCHEME).as_posix() for p in (tmp_path / SCHEME).rglob("*")
                  if p.is_file()) == sorted(SCHEME_FILES)
    templates = REPO / "src/fedskew/templates/partition"
    assert sorted(p.name for p in templates.iterdir()) == sorted(newpiece.PARTITION_FILES.values())
    with pytest.raises(ConfigError, match="it writes a method or a dataset or a partition package only"):
        newpiece.create("model", "mine", tmp_path / "other")


# --- `python -m fedskew new dataset NAME` -----------------------------------------------------------------------

SOURCE = "blobs_unit"  # no module of that name exists either
SOURCE_FILES = ["pyproject.toml", f"{SOURCE}/__init__.py", f"{SOURCE}/source.py", f"tests/test_{SOURCE}.py",
                f"experiments/{SOURCE}.yaml", "README.md"]


@pytest.fixture
def source_package(tmp_path):
    yield from _package(tmp_path, "dataset", SOURCE)


def test_a_source_package_has_every_file_and_its_source_is_declared_as_its_entry_point(source_package) -> None:
    from fedskew import plugins
    from fedskew.data.datasets.base import GeneratedSource

    target, written = source_package
    assert written == SOURCE_FILES
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == sorted(SOURCE_FILES)
    cls = _load(target / SOURCE / "source.py", f"{SOURCE}_by_path").BlobsUnit
    assert issubclass(cls, GeneratedSource) and cls.name == SOURCE
    plugin = plugins.Plugin("dataset", SOURCE, f"{SOURCE}.source:BlobsUnit", "fedskew-blobs-unit", cls)
    assert plugins.source_problem(plugin) is None and cls.defaults() == {"samples": 1000, "seed": 0}
    pyproject = tomllib.loads((target / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["fedskew.datasets"] == {SOURCE: f"{SOURCE}.source:BlobsUnit"}


def test_a_source_packages_own_tests_pass(source_package, monkeypatch) -> None:
    target, _ = source_package
    monkeypatch.syspath_prepend(str(target))
    test = _load(target / "tests" / f"test_{SOURCE}.py", f"test_{SOURCE}")
    tests = [getattr(test, name) for name in dir(test) if name.startswith("test_")]
    assert len(tests) == 3
    for case in tests:
        case()


def test_an_installed_source_package_validates_with_its_experiment(source_package, tmp_path) -> None:
    target, _ = source_package
    out = _installed_outputs(target, tmp_path, SOURCE, ("validate", "datasets"))
    assert out["validate"].returncode == 0, out["validate"].stderr[-3000:]
    assert "and 1 experiment file(s) valid" in out["validate"].stdout
    assert out["datasets"].returncode == 0, out["datasets"].stderr[-3000:]
    assert any(line.split()[:2] == [SOURCE, SOURCE] for line in out["datasets"].stdout.splitlines())


def test_a_source_name_taken_is_refused_and_nothing_is_written(tmp_path) -> None:
    with pytest.raises(ConfigError, match="already a built-in dataset source"):
        newpiece.create("dataset", "mnist", tmp_path / "pkg")
    assert list(tmp_path.iterdir()) == []
