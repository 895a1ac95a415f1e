"""Every number a user gives is checked where it enters, and every number fedskew writes as JSON is strict.

- A command-line number (a threshold, a seed, a thread, worker or round count, a port, a size, a time limit) that
  is not finite or not in its range is refused by the parser with one line naming the option, exit 2: `compare
  --threshold nan|inf|-1` no longer judges a claim against a margin that means nothing.
- `--cores` above what this machine gives fedskew is capped, with one line saying so.
- A suite with too many seeds or runs, or suites with too many runs together, is refused at validation with the
  count, from the lists' lengths, before anything is expanded: a million seeds in well under a second (they used
  to end in a MemoryError after 14 minutes).
- Every json.dump(s) of fedskew that writes a file or prints passes allow_nan=False (a bare NaN is no JSON); the
  few that do not are named below with why.
"""

from __future__ import annotations

import ast
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedskew import arguments
from fedskew.cli import build_parser, main
from fedskew.config import ConfigError, load_params
from fedskew.config_checks import MAX_RUNS, MAX_SEEDS
from tests.helpers import REPO, TINY_PARAMS, isolated_env

# --- numbers on the command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "why"), [
    ("nan", "'nan' is not a finite number: give one from 0 to 100"),
    ("inf", "'inf' is not a finite number: give one from 0 to 100"),
    ("-inf", "'-inf' is not a finite number: give one from 0 to 100"),
    ("-1", "-1 is out of range: give a number from 0 to 100"),
    ("100.5", "100.5 is out of range: give a number from 0 to 100"),
    ("two", "'two' is not a number: give one from 0 to 100"),
])
def test_compare_refuses_a_threshold_that_is_not_a_finite_margin_from_0_to_100_points(value, why, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--suite", "tiny", f"--threshold={value}"])   # "=": argparse reads "-inf" as an option
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --threshold: {why}" in err.splitlines()[-1]


def test_a_threshold_in_range_is_taken_as_given() -> None:
    for value in ("0", "0.5", "100"):
        assert build_parser().parse_args(["compare", "--suite", "tiny", "--threshold", value]).threshold == float(value)


BAD_NUMBERS = [
    (["partition", "--dataset", "digits", "--partition", "q2", "--seed"], "-1", "--seed",
     "-1 is out of range: give a whole number from 0 to 4294967295"),
    (["train", "--suite", "s", "--dataset", "d", "--partition", "p", "--method", "m", "--seed"], "4294967296",
     "--seed", "4294967296 is out of range"),
    (["train", "--suite", "s", "--dataset", "d", "--partition", "p", "--method", "m", "--seed", "0", "--threads"],
     "0", "--threads", "0 is out of range: give a whole number from 1 to 1024"),
    (["verify", "--suite", "tiny", "--seed"], "1.5", "--seed", "'1.5' is not a whole number"),
    (["ui", "--port"], "70000", "--port", "70000 is out of range: give a whole number from 1 to 65535"),
    (["packed", "run", "--suite", "tiny", "--workers"], "0", "--workers", "0 is out of range"),
    (["packed", "run", "--suite", "tiny", "--time-limit"], "nan", "--time-limit",
     "'nan' is not a finite number: give one above 0"),
    (["packed", "run", "--suite", "tiny", "--time-limit"], "inf", "--time-limit", "'inf' is not a finite number"),
    (["packed", "run", "--suite", "tiny", "--time-limit"], "-5", "--time-limit", "-5 is out of range"),
    (["packed", "run", "--suite", "tiny", "--threads"], "-2", "--threads", "-2 is out of range"),
    (["packed", "run", "--suite", "tiny", "--max-rounds"], "0", "--max-rounds",
     "0 is out of range: give a whole number from 1 to 100000"),
    (["packed", "status", "--suite", "tiny", "--seed"], "-1", "--seed", "-1 is out of range"),
    (["packed", "ship", "--suite", "tiny", "--out", "x", "--max-mb"], "nan", "--max-mb",
     "'nan' is not a finite number: give one above 0 to 16"),
    (["packed", "ship", "--suite", "tiny", "--out", "x", "--max-mb"], "17", "--max-mb",
     "17 is out of range: give a number above 0 to 16"),
    (["packed", "ship", "--suite", "tiny", "--out", "x", "--max-mb"], "0", "--max-mb", "0 is out of range"),
    (["run", "--cores"], "0", "--cores", "'0' is not a number of cores: give a positive integer, or all"),
]


@pytest.mark.parametrize(("command", "value", "option", "why"), BAD_NUMBERS,
                         ids=[f"{' '.join(c[:2])} {o} {v}" for c, v, o, _ in BAD_NUMBERS])
def test_every_numeric_option_refuses_what_is_not_a_finite_number_in_its_range(command, value, option, why,
                                                                               capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args([*command, value])
    assert stopped.value.code == 2
    assert f"argument {option}: {why}" in capsys.readouterr().err.splitlines()[-1]



@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc"])
def test_the_tracking_flush_interval_from_the_environment_is_a_finite_number_of_seconds(value, monkeypatch) -> None:
    from fedskew import job

    monkeypatch.setenv("FEDSKEW_TRACKING_FLUSH_S", value)
    with pytest.raises(ConfigError, match=f"FEDSKEW_TRACKING_FLUSH_S={value}: .*above 0 to 3600"):
        job._flush_every_s()
    monkeypatch.setenv("FEDSKEW_TRACKING_FLUSH_S", "2.5")
    assert job._flush_every_s() == 2.5

# --- cores ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["run"], ["reproduce"], ["verify", "--suite", "tiny"]])
def test_cores_above_the_machines_are_capped_with_one_line_saying_so(command, capsys) -> None:
    available = arguments.usable_cores()
    assert build_parser().parse_args([*command, "--cores", "100000"]).cores == str(available)
    assert capsys.readouterr().err == (f"fedskew: --cores 100000 is more than the {available} core(s) this machine "
                                       f"gives fedskew; using {available}\n")
    for kept in ("all", str(available)):
        assert build_parser().parse_args([*command, "--cores", kept]).cores == kept
    assert capsys.readouterr().err == ""


# --- grids ------------------------------------------------------------------------------------------------------------


def _tiny(**suite) -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"].update(suite)
    return params


def test_a_million_seeds_are_refused_with_their_count_in_well_under_a_second() -> None:
    params = _tiny(seeds=list(range(10**6)))
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"suites\.tiny\.seeds: 1000000 seeds; at most {MAX_SEEDS}"):
        load_params(params)
    assert time.perf_counter() - started < 0.5


def test_a_suite_with_too_many_runs_is_refused_with_its_count() -> None:
    params = _tiny(seeds=list(range(MAX_SEEDS)))
    params["methods"].update({f"fedavg{i}": {"algorithm": "fedavg"} for i in range(60)})
    params["suites"]["tiny"]["methods"] = list(params["methods"])   # 2 partitions x 63 methods x 1000 seeds
    with pytest.raises(ConfigError, match=r"suites\.tiny: 2 dataset/partition pair\(s\) x 63 method\(s\) x 1000 "
                                          rf"seed\(s\) = 126000 runs; at most {MAX_RUNS}"):
        load_params(params)


def test_suites_with_too_many_runs_together_are_refused_with_the_count() -> None:
    params = _tiny(seeds=list(range(MAX_SEEDS)))
    params["methods"].update({f"fedavg{i}": {"algorithm": "fedavg"} for i in range(27)})
    params["suites"]["tiny"]["methods"] = list(params["methods"])   # 2 x 30 x 1000: 60000 runs, within the bound
    for name in ("again", "more"):
        params["suites"][name] = copy.deepcopy(params["suites"]["tiny"])
        params["training"][name] = params["training"]["tiny"]
    with pytest.raises(ConfigError, match=rf"suites: 180000 runs in the 3 suites together; at most {MAX_RUNS}"):
        load_params(params)


def test_the_bounds_leave_ample_room_for_the_shipped_suites() -> None:
    params = load_params(REPO / "params.yaml")
    suites = params.raw["suites"]
    assert max(len(body["seeds"]) for body in suites.values()) * 100 <= MAX_SEEDS
    assert max(len(params.suite_runs(name)) for name in suites) * 50 <= MAX_RUNS   # fedlc_table: 1100 runs
    assert len(params.runs(list(suites))) * 10 <= MAX_RUNS                          # 5528 in all


def test_validate_refuses_a_params_file_with_too_many_seeds_naming_the_count(tmp_path) -> None:
    params = _tiny(seeds=list(range(100_000)))
    (tmp_path / "params.yaml").write_text(json.dumps(params))   # JSON is YAML: 0.7 MB
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedskew", "validate"], cwd=tmp_path, env=isolated_env(REPO),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"suites.tiny.seeds: 100000 seeds; at most {MAX_SEEDS}" in done.stderr
    assert "Traceback" not in done.stderr and time.perf_counter() - started < 60


# --- strict JSON ------------------------------------------------------------------------------------------------------

# The json.dump(s) calls that may write NaN, by module and function, each with why: none writes a file of fedskew's
# or prints; each hashes, names a bad value in a message, or talks to MLflow or the tracking worker.
NOT_STRICT = {
    ("config.py", "hash_identity"): "a run id: the hash of a validated configuration, which holds no NaN",
    ("runfiles.py", "_canonical"): "the hash metrics.json records: a crafted file's NaN must hash as written, so "
                                   "that the reader refuses it by its number",
    ("config_errors.py", "short_value"): "names a bad value (a NaN too) in a message",
    ("config_schema.py", "_twice"): "compares list items to name one listed twice",
    ("data/files.py", "digest_of"): "the hash of a dataset spec",
    ("data/partitions/store.py", "_canonical_json"): "the hash of a partition",
    ("derived.py", "_value"): "a bool in a table cell",
    ("stale.py", "_show"): "a value in a line of text",
    ("params_cache.py", "code_digest"): "the key of a validated configuration",
    ("params_cache.py", "plugin_entries"): "sorts entry points",
    ("params_cache.py", "key"): "the key of a validated configuration",
    ("plugin_code.py", "identity"): "the hash of a plugin package's code",
    ("plugin_code.py", "module_digest"): "the hash of a module's syntax tree (a literal 1e999 is inf)",
    ("tracking/runs.py", "flatten_params"): "MLflow's parameters: strings, not a file",
    ("tracking/runs.py", "_dataset_input"): "MLflow's dataset record of a source URI",
    ("tracking/worker.py", "send"): "the pipe to the tracking worker: a history row's NaN must reach it as it is",
    ("tracking/worker.py", "reply"): "the tracking worker's replies on its pipe",
}


def _json_dumps_calls(path: Path) -> list[tuple[str, int, bool]]:
    """(enclosing function, line, strict) of each json.dump / json.dumps call in a source file."""
    found = []

    def walk(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr in ("dump", "dumps") and isinstance(child.func.value, ast.Name)
                    and child.func.value.id == "json"):
                strict = any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
                             for k in child.keywords)
                found.append((inner, child.lineno, strict))
            walk(child, inner)

    walk(ast.parse(path.read_text()), "<module>")
    return found


def test_every_json_fedskew_writes_or_prints_refuses_nan() -> None:
    package = REPO / "src" / "fedskew"
    lenient = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        for function, line, strict in _json_dumps_calls(path):
            if not strict and (module, function) not in NOT_STRICT:
                lenient[f"{module}:{line}"] = function
    assert lenient == {}, "pass allow_nan=False (or name the call in NOT_STRICT with why)"


def test_a_comparison_holding_a_nan_is_refused_not_written_as_bare_nan(monkeypatch, tmp_path) -> None:
    from fedskew.report import compare as compare_module

    monkeypatch.setattr(compare_module, "compare", lambda *args, **kwargs: [_comparison_with_a_nan()])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(json.dumps(TINY_PARAMS))
    for command in (["compare", "--suite", "tiny", "--json"], ["compare", "--suite", "tiny", "--write"]):
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            main(command)
    assert not (tmp_path / "results").exists()   # the JSON is made before any file is written


def _comparison_with_a_nan():
    from fedskew.report.compare import Comparison

    return Comparison("tiny", "digits", "q2", "fedlc", "fedavg", (0, 1), (float("nan"), 1.0), None, 0.0,
                      {"beats": "inconclusive", "at least as good": "inconclusive"}, {})
