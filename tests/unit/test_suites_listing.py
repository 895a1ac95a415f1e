"""`python -m fedskew suites` (fedskew.listings.cmd_suites): every suite of params.yaml with the paper tables it
fills, which build takes it, its runs and their cost as `fedskew cost` counts them; `--paper`, `--suite`."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from fedskew import listings
from fedskew.cli import main
from fedskew.config import load_params
from fedskew.reproduce import cost
from fedskew.reproduce.layouts import LAYOUTS_DIR, load_layouts
from tests.helpers import REPO

PARAMS = load_params(REPO / "params.yaml")


def _fake_forward_flops(model: str, dataset_spec_items: tuple) -> int:
    """A stand-in for torch's FLOP count, different per model and dataset: the listing and `cost` must agree
    whatever a sample costs, and without it neither imports torch."""
    return 1000 * len(model) + 7 * len(str(dataset_spec_items))


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.fixture
def fake_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost, "forward_flops", _fake_forward_flops)


def _listing(capsys: pytest.CaptureFixture, *args: str) -> dict[str, dict[str, str]]:
    """`fedskew suites ARGS`'s rows, {suite: {column: cell}}: cells are apart by two spaces or more."""
    assert main(["suites", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1:lines.index("")]]
    assert all(len(row) == len(header) for row in rows), rows
    return {row[0]: dict(zip(header, row)) for row in rows}


def _papers() -> dict[str, list[str]]:
    """{paper key: its table ids}, read from the layout files themselves."""
    return {path.stem: list(yaml.safe_load(path.read_text())) for path in sorted(LAYOUTS_DIR.glob("*.yaml"))}


def test_the_listing_names_every_suite_of_params_yaml_in_order(in_repo, capsys):
    assert list(_listing(capsys, "--no-cost")) == list(PARAMS.raw["suites"])


def test_runs_are_the_runs_of_each_suite(in_repo, capsys):
    rows = _listing(capsys, "--no-cost")
    for suite, row in rows.items():
        body = PARAMS.raw["suites"][suite]
        assert int(row["runs"]) == len(PARAMS.runs([suite])), suite
        assert int(row["methods"]) == len(body["methods"])
        assert int(row["partitions"]) == len({p for s in body["settings"] for p in s["partitions"]})
        assert row["datasets"].split(", ") == list(dict.fromkeys(s["dataset"] for s in body["settings"]))


def test_built_by_marks_run_reproduce_and_imported_suites(in_repo, capsys):
    rows = _listing(capsys, "--no-cost")
    for suite, row in rows.items():
        marks = set(row["built by"].split(", ")) - {"—"}
        assert ("run" in marks) == (suite in PARAMS.run_suites), suite
        assert ("experiment" in marks) == (suite in PARAMS.experiment_suites), suite
        assert ("reproduce" in marks) == (suite in PARAMS.reproduce_suites), suite
        assert ("imported" in marks) == (suite in PARAMS.imported_suites), suite
        assert marks or row["built by"] == "—"
    assert rows["default"]["built by"] == "run" and rows["feded_mnist"]["built by"] == "imported"


def test_a_suite_that_fills_no_paper_table_says_so(in_repo, capsys):
    rows = _listing(capsys, "--no-cost")
    assert rows["default"]["paper tables"] == "—"
    assert rows["methods"]["paper tables"] == "— (proxy for feded, fedlc, flfcr)"  # offline evidence, no cell
    assert rows["fedlc_table"]["paper tables"] == "fedlc_t1-t2"
    assert rows["scala_table"]["paper tables"] == "scala_t1-t8"


def test_table_ids_are_shortened_to_ranges():
    assert listings.tables_text({"fedlc_t2", "fedlc_t1", "fedlc_t4", "scala_t3"}) == "fedlc_t1-t2, fedlc_t4, scala_t3"
    assert listings.tables_text({"feded_t7", "feded_t5", "feded_t6"}) == "feded_t5-t7"
    assert listings.tables_text(set()) == "—"


@pytest.mark.parametrize("paper", sorted(_papers()))
def test_paper_keeps_exactly_the_suites_its_layouts_read(in_repo, capsys, paper):
    tables = _papers()[paper]
    expected = {cfg.suite for table_id in tables for cfg in cost.table_runs(PARAMS, table_id).values()}
    expected |= {proxy["suite"] for table_id in tables for proxy in load_layouts()[table_id].proxies}
    listed = _listing(capsys, "--no-cost", "--paper", paper)
    assert set(listed) == expected and expected
    assert list(listed) == [suite for suite in PARAMS.raw["suites"] if suite in expected]  # params.yaml's order


def test_paper_ignores_case_and_punctuation(in_repo, capsys):
    assert _listing(capsys, "--no-cost", "--paper", "FL-FCR") == _listing(capsys, "--no-cost", "--paper", "flfcr")
    assert "fedlc_t7" not in _listing(capsys, "--no-cost", "--paper", "scala")


def test_an_unknown_paper_is_a_one_line_error_with_the_known_ones(in_repo, capsys):
    assert main(["suites", "--paper", "fedcl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'fedlc'?" in err
    assert err.rstrip().endswith(f"known: {', '.join(sorted(_papers()))}")


def test_an_unknown_suite_is_a_one_line_error(in_repo, capsys):
    assert main(["suites", "--suite", "defualt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'default'?" in err


def _covering_suites(table_id: str) -> set[str] | None:
    """The suites whose runs are exactly the table's runs (each suite serves this table only), else None."""
    runs = cost.table_runs(PARAMS, table_id)
    suites = {cfg.suite for cfg in runs.values()}
    theirs = {cfg.run_id for suite in suites for cfg in PARAMS.runs([suite])}
    return suites if suites and theirs == set(runs) else None


def test_suite_costs_add_up_to_the_cost_of_the_tables_they_fill_alone(fake_flops):
    covered = {table_id: _covering_suites(table_id) for table_id in load_layouts()}
    covered = {table_id: suites for table_id, suites in covered.items() if suites}
    assert {"fedlc_t3", "fedlc_t4", "fedlc_t5", "fedlc_t7"} <= set(covered)
    for table_id, suites in covered.items():
        table = cost.table_cost(PARAMS, table_id)
        of_suites = [listings.suite_cost(PARAMS, suite) for suite in suites]
        for key in ("runs", "pflop", "gpu_hours", "cpu_runs", "cpu_hours"):
            assert sum(c[key] for c in of_suites) == pytest.approx(table[key]), (table_id, key)


def test_the_listing_prints_the_cost_table_s_numbers(in_repo, capsys, fake_flops):
    rows = _listing(capsys)
    cells = [line.split(" | ") for line in cost.cost_markdown(PARAMS).splitlines()]
    by_table = {row[0].lstrip("| "): row for row in cells}
    for suite, table_id in (("fedlc_t7", "fedlc_t7"), ("fedlc_imagenet_table", "fedlc_t3")):  # one suite, whole
        assert [rows[suite]["runs"], rows[suite]["PFLOP"], rows[suite]["GPU-h"]] == by_table[table_id][1:4]
    # feded_t1's runs with a measured CPU rate are exactly feded_mnist's: the same CPU-hours
    measured = [cfg for cfg in cost.table_runs(PARAMS, "feded_t1").values()
                if (cfg.train.model, cfg.dataset_spec["source"]) in cost.CPU_RATES]
    assert {cfg.suite for cfg in measured} == {"feded_mnist"} and len(measured) == len(PARAMS.runs(["feded_mnist"]))
    assert rows["feded_mnist"]["CPU-h (runs)"].split()[0] == by_table["feded_t1"][4].split()[0]
    assert rows["feded_table"]["CPU-h (runs)"] == "—"


def test_one_suite_in_full_with_its_real_cost(in_repo, capsys):
    assert main(["suites", "--suite", "fedlc_t7"]) == 0
    out = capsys.readouterr().out
    table = cost.table_cost(PARAMS, "fedlc_t7")  # fedlc_t7 fills fedlc_t7 alone (see above)
    body = PARAMS.raw["suites"]["fedlc_t7"]
    assert out.startswith(f"fedlc_t7: {body['description'][:40]}")
    assert f"compute:      {table['pflop']:.3g} PFLOP" in out and f"GPU-hours:    {table['gpu_hours']:.3g} at" in out
    assert "paper tables: fedlc_t7\n" in out and f"runs:         {len(PARAMS.runs(['fedlc_t7']))}\n" in out
    assert all(method in out for method in body["methods"])


def test_without_cost_the_listing_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedskew", "suites", "--no-cost"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not {module for module in imported if module.split(".")[0] in ("torch", "mlflow")}


def test_one_suite_in_full_names_the_models_and_sources_no_cpu_rate_is_measured_for(in_repo, capsys):
    assert main(["suites", "--suite", "default"]) == 0  # the digits CNN and Synthetic's logistic regression
    assert ("  CPU-hours:    — (no rate is measured for cnn on digits, logreg on synthetic: benchmarks/cpu_rate.py "
            "measures one)\n") in capsys.readouterr().out
    assert main(["suites", "--suite", "feded_mnist"]) == 0  # every run of FedED's DNN on MNIST has its rate
    assert "runs, at the rate measured for them\n" in capsys.readouterr().out
