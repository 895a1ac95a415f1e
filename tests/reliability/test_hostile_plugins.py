"""A plugin cannot end fedskew silently, nor give it a number params.yaml could not.

A plugin is code of the researcher's own (or of someone else's package) that fedskew imports, so whatever it does
on import is caught: `SystemExit` (an `exit()`, or argparse reading fedskew's command line) and `GeneratorExit` as
any exception, refused in one line naming the entry point and its distribution (exit 2); Ctrl-C still stops the
command (exit 130), its line naming the plugin that was importing. A `SystemExit` that a plugin's code raises later
(a scheme's check while validating, a method's hook while training) fails the command too, naming the file and the
line; in the Snakefile as well, where Snakemake would otherwise end with code 0 and build nothing. A job that exits
0 without writing its outputs fails in Snakemake (MissingOutputException). What a plugin prints on import goes to
stderr, so that `--json` stays JSON.

The numbers a piece declares (a method's hyperparameters, a dataset source's options, a partition scheme's
parameters) are checked as params.yaml's are: a default or bound that is NaN or infinite, bounds that leave no
value, a default outside its own bounds, each refused when the class is made or the plugin described, in the same
one line. Every built-in declaration passes those checks.

The broken packages are written as pip installs them (their module and a .dist-info folder with entry_points.txt)
into a folder put on the commands' PYTHONPATH: each case costs one command, no install.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedskew import plugins
from fedskew.catalog import InputNeeds, Model
from fedskew.data.partitions.parameters import Parameter
from fedskew.declarations import Hyperparameter
from fedskew.job import Terminated
from tests.helpers import REPO, TINY_PARAMS, isolated_env, make_copy, single_setting, venv_bin

# What each package's module does at import, as (module text, exit code of a command, what the line says).
AT_IMPORT = {
    "exits with 0": ("raise SystemExit(0)\n", 2, "its module exited (SystemExit(0)) as it was imported"),
    "exits with 2": ("import sys\nsys.exit(2)\n", 2, "its module exited (SystemExit(2)) as it was imported"),
    "parses the command line": (
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--gamma', type=float)\n"
        "OPTIONS = parser.parse_args()\n", 2, "exited (SystemExit(2)) as it was imported"),
    "is interrupted": ("raise KeyboardInterrupt\n", 130, "interrupted while importing"),
}
WHERE = "entry point 'hostile' = 'hostile:Hostile' in group fedskew.methods of distribution 'fedskew-hostile'"


def installed(site: Path, modules: dict[str, str], entry_points: str, distribution: str = "fedskew-hostile") -> Path:
    """`distribution` as pip installs it into `site`: its modules and a .dist-info naming its entry points
    (`entry_points`: the text of entry_points.txt)."""
    site.mkdir(exist_ok=True)
    for name, text in modules.items():
        (site / name).write_text(text)
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


def hostile_method(site: Path, text: str) -> Path:
    return installed(site, {"hostile.py": text}, "[fedskew.methods]\nhostile = hostile:Hostile\n")


def tiny_project(root: Path, params: dict | None = None) -> Path:
    """A folder holding the tiny params.yaml (one setting, one seed): enough for every command but a build."""
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(params or single_setting(copy.deepcopy(TINY_PARAMS)),
                                                     sort_keys=False))
    return root


def fedskew(root: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m fedskew <args>` in `root`, with fedskew's code and the packages of `site` on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(site)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def snakemake(root: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    """Snakemake in the copied project `root`, the packages of `site` on its path (and its jobs')."""
    env = isolated_env(root)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(site)])
    return subprocess.run([venv_bin("snakemake"), "--cores", "1", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def line_of(text: str, code: str) -> int:
    """The number of the line of `text` that holds `code`."""
    return next(number for number, line in enumerate(text.splitlines(), 1) if code in line)


def one_line(done: subprocess.CompletedProcess, command: str) -> str:
    """The one line a refused command printed (nothing on stdout, one line on stderr that names the command)."""
    assert done.stdout == "", done.stdout[-2000:]
    assert done.stderr.startswith(f"fedskew {command}: ") and done.stderr.count("\n") == 1, done.stderr[-3000:]
    return done.stderr


# --- a plugin that ends the process on import ---------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(AT_IMPORT))
def test_a_plugin_that_exits_or_is_interrupted_on_import_stops_every_command_in_one_line_naming_it(case,
                                                                                                  tmp_path) -> None:
    text, code, says = AT_IMPORT[case]
    site = hostile_method(tmp_path / "site", text)
    root = tiny_project(tmp_path / "project")
    for command in (["validate"], ["methods"], ["compare", "--suite", "tiny", "--json"], ["run", "--cores", "1"]):
        done = fedskew(root, site, *command)
        assert done.returncode == code, (command, done.stderr[-3000:])
        line = one_line(done, command[0])
        assert WHERE in line and says in line, line
    assert sorted(path.name for path in root.iterdir()) == ["params.yaml"]  # nothing was built, nor begun


def test_argparse_s_complaint_is_quoted_in_the_one_line(tmp_path) -> None:
    site = hostile_method(tmp_path / "site", AT_IMPORT["parses the command line"][0])
    line = one_line(fedskew(tiny_project(tmp_path / "project"), site, "validate"), "validate")
    assert "(it printed '__main__.py: error: unrecognized arguments: validate')" in line, line


@pytest.mark.parametrize("case", ["exits with 0", "parses the command line"])
def test_snakemake_refuses_to_plan_with_a_plugin_that_exits_on_import(case, tmp_path) -> None:
    site = hostile_method(tmp_path / "site", AT_IMPORT[case][0])
    root = make_copy(tmp_path, single_setting(copy.deepcopy(TINY_PARAMS)))
    done = snakemake(root, site, "-n")
    said = done.stdout + done.stderr  # Snakemake writes its errors to either, by version
    assert done.returncode == 1, said[-3000:]
    assert f"WorkflowError in file \"{root}/workflow/Snakefile\"" in said and WHERE in said, said[-3000:]


def test_what_a_plugin_prints_on_import_goes_to_stderr_and_json_output_stays_json(tmp_path) -> None:
    chatty = ('"""FedAvg, greeting as it is imported."""\nimport sys\n\nfrom fedskew.fl.fedavg import FedAvg\n\n'
              'print("hello from the plugin")\nsys.stdout.write("{not json\\n")\n\n\nclass Hostile(FedAvg):\n'
              '    """FedAvg."""\n\n    name = "hostile"\n')
    site = hostile_method(tmp_path / "site", chatty)
    done = fedskew(tiny_project(tmp_path / "project"), site, "stale", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == []
    assert "hello from the plugin\n{not json\n" in done.stderr


# --- in process: what loading catches, and what it lets through -------------------------------------------------

@pytest.fixture
def on_path(monkeypatch):
    """Put a site folder on sys.path for plugins.loaded, and forget what was loaded, before and after."""
    def put(site: Path) -> None:
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        plugins.loaded.cache_clear()

    yield put
    plugins.loaded.cache_clear()
    sys.modules.pop("hostile", None)
    importlib.invalidate_caches()


@pytest.mark.parametrize("raised", ["GeneratorExit", "type('Custom', (BaseException,), {})", "SystemExit('bye')"])
def test_whatever_else_a_plugin_raises_on_import_is_a_plugin_error(raised, tmp_path, on_path) -> None:
    on_path(hostile_method(tmp_path / "site", f"raise {raised}\n"))
    with pytest.raises(plugins.PluginError, match=f"^{re.escape(WHERE)} failed to load: "):
        plugins.loaded("method")


@pytest.mark.parametrize("text, stop, says", [
    ("raise KeyboardInterrupt\n", KeyboardInterrupt, "interrupted"),
    ("from fedskew.job import Terminated\nraise Terminated('stopped by signal SIGTERM')\n", Terminated,
     "stopped by signal SIGTERM"),
])
def test_ctrl_c_or_sigterm_on_import_still_stops_the_command_saying_which_plugin_was_importing(text, stop, says,
                                                                                              tmp_path, on_path) -> None:
    on_path(hostile_method(tmp_path / "site", text))
    with pytest.raises(stop) as stopped:
        plugins.loaded("method")
    assert str(stopped.value) == f"{says} while importing {WHERE}"


# --- a plugin that exits while a command runs its code ------------------------------------------------------------

EXITING_SCHEME = '''"""IID, but its check (which validation runs) and its draw end the process."""
import os
import sys

from fedskew.data.partitions import Scheme
from fedskew.data.partitions.iid import Iid


class Hostile(Scheme):
    name = "hostile"
    parameters = dict(Iid.parameters)

    @classmethod
    def check(cls, p, n, num_classes, class_counts, ctx):
        if os.environ.get("EXIT_IN_CHECK"):
            sys.exit(0)

    @staticmethod
    def sample(labels, num_classes, params, rng, natural_groups=None, dataset=""):
        os._exit(0)  # no exception to catch: the job ends with code 0 and writes nothing
'''


def scheme_project(tmp_path: Path) -> tuple[Path, Path]:
    """The copied tiny project drawing its one partition with the exiting scheme, and the scheme's site."""
    site = installed(tmp_path / "site", {"hostile.py": EXITING_SCHEME}, "[fedskew.partitions]\nhostile = "
                     "hostile:Hostile\n")
    params = single_setting(copy.deepcopy(TINY_PARAMS))
    params["partitions"] = {"h": {"scheme": "hostile", "clients": 4}}
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["h"]
    return make_copy(tmp_path, params), site


def test_a_plugin_exiting_during_validation_fails_it_naming_the_file_and_line(tmp_path, monkeypatch) -> None:
    root, site = scheme_project(tmp_path)
    monkeypatch.setenv("EXIT_IN_CHECK", "1")
    line = one_line(fedskew(root, site, "validate"), "validate")
    assert line.startswith("fedskew validate: entry point 'hostile' = 'hostile:Hostile' in group fedskew.partitions "
                           "of distribution 'fedskew-hostile': its code ended the command with SystemExit(0) at "
                           f"{site / 'hostile.py'}:{line_of(EXITING_SCHEME, 'sys.exit(0)')}; "), line
    done = snakemake(root, site, "-n")  # the same check as the Snakefile validates: a WorkflowError, not exit 0
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "its code ended the command with SystemExit(0)" in said, said[-3000:]


def test_a_job_that_ends_with_code_0_without_its_outputs_fails_the_build(tmp_path) -> None:
    root, site = scheme_project(tmp_path)
    done = snakemake(root, site, "--latency-wait", "1", "data/partitions/digits/h/seed0.npz")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert "MissingOutputException in rule partition" in said, said[-3000:]
    assert not (root / "data/partitions/digits/h").exists() or not any((root / "data/partitions/digits/h").iterdir())


@pytest.mark.slow  # about 10 s: the training job imports torch
def test_a_training_job_whose_method_exits_fails_naming_it_and_writes_no_run(tmp_path) -> None:
    text = ('"""FedAvg that exits as training begins."""\nimport sys\n\nfrom fedskew.fl.fedavg import FedAvg\n\n\n'
            'class Hostile(FedAvg):\n    """FedAvg."""\n\n    name = "hostile"\n\n'
            '    def adapt_model(self, model):\n        sys.exit(0)\n')
    site = hostile_method(tmp_path / "site", text)
    params = single_setting(copy.deepcopy(TINY_PARAMS))
    params["methods"]["h"] = {"algorithm": "hostile"}
    params["suites"]["tiny"]["methods"] = ["h"]
    root = make_copy(tmp_path, params)
    for command in ("download digits", "partition --dataset digits --partition dir0.5 --seed 0"):
        assert fedskew(root, site, *command.split()).returncode == 0
    done = fedskew(root, site, "train", "--suite", "tiny", "--dataset", "digits", "--partition", "dir0.5",
                   "--method", "h", "--seed", "0")
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"fedskew train: {WHERE}: its code ended the command with SystemExit(0) at "
                           f"{site / 'hostile.py'}:{line_of(text, 'sys.exit(0)')}; "), last
    assert not (root / "results/runs").exists() or not list((root / "results/runs").rglob("metrics.json"))


# --- the numbers a piece declares ---------------------------------------------------------------------------------

NAN, INF = math.nan, math.inf
BAD_NUMBERS = [
    (dict(default=NAN), "the default nan is not a finite number"),
    (dict(default=INF, minimum=0), "the default inf is not a finite number"),
    (dict(default=-INF), "the default -inf is not a finite number"),
    (dict(default=1.0, minimum=NAN), "minimum=nan is not a finite number"),
    (dict(default=1.0, maximum=INF), "maximum=inf is not a finite number"),
    (dict(default=1.0, exclusive_minimum="0"), "exclusive_minimum='0' is not a finite number"),
    (dict(default=1.0, minimum=2, maximum=1), "minimum=2 and maximum=1 leave no value between them"),
    (dict(default=1.0, minimum=1, exclusive_maximum=1), "minimum=1 and exclusive_maximum=1 leave no value"),
    (dict(default=5.0, minimum=0, maximum=1), "the default 5.0 breaks its own maximum=1"),
    (dict(default=0.0, exclusive_minimum=0), "the default 0.0 breaks its own exclusive_minimum=0"),
]


@pytest.mark.parametrize("declared, says", BAD_NUMBERS)
def test_a_hyperparameter_whose_numbers_cannot_be_used_says_why(declared, says) -> None:
    bounds = {key: value for key, value in declared.items() if key != "default"}
    assert Hyperparameter(declared["default"], **bounds).problem().startswith(says)


@pytest.mark.parametrize("declared, says", BAD_NUMBERS)
def test_a_partition_parameter_whose_numbers_cannot_be_used_says_why(declared, says) -> None:
    bounds = {key: value for key, value in declared.items() if key != "default"}
    assert Parameter(float, declared["default"], **bounds).problem().startswith(says)


def test_every_built_in_declaration_passes_the_same_checks() -> None:
    from fedskew.algorithms import BUILT_IN as METHODS
    from fedskew.data.datasets import built_in_sources
    from fedskew.data.partitions.registry import BUILT_IN as SCHEMES
    from fedskew.models import BUILT_IN as MODELS

    declared = {**{f"method {name}: {key}": h for name, cls in METHODS.items()
                   for key, h in cls.hyperparameters.items()},
                **{f"source {name}: {key}": o for name, cls in built_in_sources().items()
                   for key, o in cls.options.items()},
                **{f"scheme {name}: {key}": p for name, cls in SCHEMES.items() for key, p in cls.parameters.items()}}
    assert len(declared) > 50
    assert {what: d.problem() for what, d in declared.items()} == dict.fromkeys(declared)
    assert {name: model.problem() for name, model in MODELS.items()} == dict.fromkeys(MODELS)


@pytest.mark.parametrize("needs, says", [
    (InputNeeds(image=True, min_side=NAN), "its needs' min_side is nan; write a whole number, 1 or more"),
    (InputNeeds(shapes=((3, 32.0, 32),)), "its needs' shapes are ((3, 32.0, 32),); write (channels, height, width)"),
])
def test_a_model_declaration_whose_input_sizes_are_not_whole_numbers_says_why(needs, says) -> None:
    assert Model(lambda info: None, needs).problem().startswith(says)


def test_a_plugin_method_whose_default_is_nan_is_refused_naming_its_entry_point(tmp_path) -> None:
    text = ('"""FedAvg with a gamma of NaN."""\nfrom fedskew.declarations import Hyperparameter\n'
            'from fedskew.fl.fedavg import FedAvg\n\n\nclass Hostile(FedAvg):\n    """FedAvg."""\n\n'
            '    name = "hostile"\n    hyperparameters = {"gamma": Hyperparameter(float("nan"), minimum=0)}\n')
    site = hostile_method(tmp_path / "site", text)
    for command in ("validate", "methods"):
        done = fedskew(tiny_project(tmp_path / command), site, command)
        assert done.returncode == 2, done.stderr[-3000:]
        assert one_line(done, command) == (
            f"fedskew {command}: {WHERE} failed to load: TypeError: hostile.Hostile: hyperparameter 'gamma': the "
            "default nan is not a finite number; give a finite one; fix the package, or uninstall it (pip uninstall "
            "fedskew-hostile)\n")


class _Described:
    """A class with what a method and a dataset source declare (plugins.METHOD_ATTRIBUTES, SOURCE_ATTRIBUTES)."""

    name, family, panel, sgd_only, switches, version = "hostile", "federated", "plain", "", (), 1
    input_shape, num_classes, natural_partition, arrives = (4,), 2, False, "embedded"
    hyperparameters = {"gamma": Hyperparameter(2.0, minimum=0)}
    options = {"size": Hyperparameter(10, minimum=1, maximum=100)}
    source_files, materialise = staticmethod(list), None


@pytest.mark.parametrize("kind, attribute, key, problem", [
    ("method", "hyperparameters", "gamma", "hyperparameter 'gamma': the default nan is not a finite number"),
    ("dataset", "options", "size", "option 'size': the default nan is not a finite number"),
])
def test_declarations_changed_after_the_class_was_made_are_checked_when_the_plugin_is_described(
        kind, attribute, key, problem) -> None:
    cls = type("Hostile", (_Described,), {"name": "hostile"})
    check = plugins.method_problem if kind == "method" else plugins.source_problem
    plugin = plugins.Plugin(kind, "hostile", "hostile:Hostile", "fedskew-hostile", cls)
    assert check(plugin) is None
    setattr(cls, attribute, {key: Hyperparameter(NAN)})  # after the class was made: no __init_subclass__ checks it
    assert check(plugin).startswith(problem)
