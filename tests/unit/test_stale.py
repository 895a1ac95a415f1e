"""`fedskew stale`: which runs there are no longer match params.yaml and the code, why, and what they feed; and how
the reproduction leaves such runs out and says so in its cells."""

from __future__ import annotations

import argparse
import copy
import json

import pytest
import yaml

from fedskew import discovery, paths, stale
from fedskew.cli import main
from fedskew.config import load_params
from fedskew.packed.archive import ArchiveError, import_archives, ship
from fedskew.reproduce.layouts import CellSpec
from fedskew.reproduce.tables import read_cell
from fedskew.runfiles import write_run_files
from tests.helpers import REPO, TINY_PARAMS


@pytest.fixture
def raised_fedprox(monkeypatch):
    """FedProx at numerics version 2, as if its class set `version = 2`."""
    declared = {**discovery.declared_versions("method"), "fedprox": 2}
    real = discovery.declared_versions
    monkeypatch.setattr(discovery, "declared_versions", lambda kind: declared if kind == "method" else real(kind))


def test_every_committed_run_is_current():
    assert stale.stale_runs(load_params(REPO / "params.yaml"), root=REPO) == []


def test_a_raised_version_makes_exactly_that_methods_committed_runs_stale(raised_fedprox):
    params = load_params(REPO / "params.yaml")
    runs = stale.stale_runs(params, ["methods", "fedlc_t4_fedprox"], root=REPO)
    committed = [cfg for suite in ("methods", "fedlc_t4_fedprox") for cfg in params.runs([suite])
                 if cfg.method_spec["algorithm"] == "fedprox"]
    assert sorted((r.suite, r.dataset, r.partition, r.method, r.seed) for r in runs) == sorted(
        (c.suite, c.dataset, c.partition, c.method, c.seed) for c in committed)
    assert {r.cause for r in runs} == {"method fedprox: version 1 -> 2"}
    assert all(r.current_run_id == params.run(r.suite, r.dataset, r.partition, r.method, r.seed).run_id != r.run_id
               for r in runs)
    assert all(r.where.startswith("results/committed-runs/") for r in runs)
    fed = {t for r in runs for t in r.tables}
    assert "results/tables/methods.md" in fed and "results/papers/fedlc_t4.md" in fed  # the suite's, a paper's
    assert any(r.claims for r in runs)
    text = "\n".join(stale.report_lines(runs))
    assert f"{len(runs)} run(s) out of date, for 1 cause(s)" in text and "method fedprox: version 1 -> 2" in text


def test_the_command_prints_the_groups_and_the_json(raised_fedprox, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["stale", "--suite", "methods", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records and {r["method"] for r in records} == {"fedprox"}
    assert set(records[0]) >= {"suite", "dataset", "partition", "method", "seed", "run_id", "current_run_id", "where",
                               "cause", "tables", "claims"}
    assert main(["stale", "--suite", "default"]) == 0
    assert "no run is out of date" in capsys.readouterr().out  # the default suite keeps no runs in the tree


@pytest.fixture
def trained(tmp_path):
    """A project with one run of each of the tiny suite's methods written (no training: the files are what counts)."""
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"]["seeds"] = [0, 1]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for cfg in load_params(tmp_path / "params.yaml").runs(["tiny"]):
        write_run_files(cfg, [{"round": 1, "test_acc": 0.5}], {"status": "finished", "final_acc": 0.5}, tmp_path)
    return tmp_path, params


def _imported_elsewhere(params: dict) -> None:
    """The tiny suite with FedAvg and FedProx, as a suite of reproduce.imported (trained elsewhere); a copy of it,
    `here`, as the suite reproduce.suites trains."""
    params["suites"]["tiny"]["methods"] = ["fedavg", "fedprox"]
    params["suites"]["here"] = copy.deepcopy(params["suites"]["tiny"])
    params["training"]["here"] = copy.deepcopy(params["training"]["tiny"])
    params["reproduce"] = {"suites": ["here"], "imported": ["tiny"]}


def _rewrite(root, params):
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return load_params(root / "params.yaml")


def test_a_changed_setting_names_the_key_and_both_values(trained):
    root, params = trained
    params["training"]["tiny"]["lr"] = 0.1
    runs = stale.stale_runs(_rewrite(root, params), ["tiny"], root)
    assert len(runs) == 4 and {r.cause for r in runs} == {"training.lr: 0.05 -> 0.1"}
    assert all(r.where.endswith("/config.yaml") for r in runs)


def test_a_changed_hyperparameter_stales_only_its_methods_runs(trained):
    root, params = trained
    params["methods"]["fedlc"]["tau"] = 0.5
    runs = stale.stale_runs(_rewrite(root, params), ["tiny"], root)
    assert {r.method for r in runs} == {"fedlc"} and {r.cause for r in runs} == {"method_spec.tau: 1.0 -> 0.5"}


def test_a_run_params_yaml_no_longer_has(trained):
    root, params = trained
    params["suites"]["tiny"]["seeds"] = [0]
    runs = stale.stale_runs(_rewrite(root, params), ["tiny"], root)
    assert {(r.seed, r.cause, r.current_run_id) for r in runs} == {(1, "no longer a run of params.yaml", None)}


def test_native_kernels_are_a_cause_of_their_own(trained, monkeypatch):
    root, _ = trained
    monkeypatch.setenv("FEDSKEW_CPU_KERNELS", "native")
    runs = stale.stale_runs(load_params(root / "params.yaml"), ["tiny"], root)
    assert len(runs) == 4 and all("CPU kernels" in r.cause for r in runs)


def test_the_reproduction_leaves_an_out_of_date_archived_run_out_and_its_cell_says_so(trained, monkeypatch):
    """`packed import --skip-stale` (the workflow's import_suite) leaves the run out, names it in the mark, and the
    paper tables' cells read the current runs only, saying how many are out of date; without it, it is refused."""
    from fedskew.packed.commands import cmd_import

    root, params = trained
    _imported_elsewhere(params)
    shipped = _rewrite(root, params).runs(["tiny"])
    elsewhere = root / "elsewhere"
    for cfg in shipped:
        write_run_files(cfg, [{"round": 1, "test_acc": 0.5}], {"status": "finished", "final_acc": 0.5}, elsewhere)
    archives = ship(shipped, root / "results/imported/tiny", elsewhere)
    declared = {**discovery.declared_versions("method"), "fedprox": 2}  # then FedProx's version is raised
    real = discovery.declared_versions
    monkeypatch.setattr(discovery, "declared_versions", lambda kind: declared if kind == "method" else real(kind))
    now = load_params(root / "params.yaml")
    with pytest.raises(ArchiveError, match="params.yaml gives it"):
        import_archives(now, archives, root / "refused")
    mark = root / paths.IMPORTED.format(suite="tiny")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSKEW_TRACKING", "0")
    for cfg in shipped:  # what an earlier import had placed (the files written by the fixture) is cleared first
        for name in ("config.yaml", "history.csv", "metrics.json"):
            (root / cfg.path(paths.RUN_DIR) / name).unlink(missing_ok=True)
    cmd_import(now, argparse.Namespace(archive=[str(a) for a in archives], skip_stale=True, mark=str(mark)))
    left_out = json.loads(mark.read_text())["stale"]
    assert sorted(e["run"] for e in left_out) == sorted(cfg.path(paths.RUN_DIR).as_posix() for cfg in shipped
                                                        if cfg.method == "fedprox")
    fedprox = read_cell(now, CellSpec("tiny", "digits", "dir0.5", "fedprox"), "final_acc", set(), root)
    assert fedprox.not_run == "2 of its 2 runs out of date (tiny)" and fedprox.stale_seeds == {0, 1}
    fedavg = read_cell(now, CellSpec("tiny", "digits", "dir0.5", "fedavg"), "final_acc", set(), root)
    assert fedavg.not_run is None and fedavg.n == 2 and not fedavg.stale_seeds
    assert "2 out of date" not in fedavg.text()


def test_a_run_imported_before_its_version_was_raised_is_out_of_date_in_its_cell(trained, monkeypatch):
    """A run placed by an earlier import, under the id it had then, is not read: its cell counts it out of date."""
    root, params = trained
    _imported_elsewhere(params)
    for cfg in _rewrite(root, params).runs(["tiny"]):  # placed before FedProx's version was raised
        write_run_files(cfg, [{"round": 1, "test_acc": 0.5}], {"status": "finished", "final_acc": 0.5}, root)
    declared = {**discovery.declared_versions("method"), "fedprox": 2}
    real = discovery.declared_versions
    monkeypatch.setattr(discovery, "declared_versions", lambda kind: declared if kind == "method" else real(kind))
    now = load_params(root / "params.yaml")
    cell = read_cell(now, CellSpec("tiny", "digits", "dir0.5", "fedprox"), "final_acc", set(), root)
    assert cell.stale_seeds == {0, 1} and cell.not_run == "2 of its 2 runs out of date (tiny)"
    assert read_cell(now, CellSpec("tiny", "digits", "dir0.5", "fedavg"), "final_acc", set(), root).n == 2


def test_the_ledger_names_the_out_of_date_seeds_a_claim_leaves_out():
    from fedskew.reproduce.claim import load_claims
    from fedskew.reproduce.layouts import load_layouts
    from fedskew.reproduce.ledger import result_text
    from fedskew.reproduce.tables import OurCell
    from fedskew.reproduce.verdicts import evaluate_on_ours

    claim = next(c for c in load_claims() if c.kind == "gap")
    layout = load_layouts()[claim.table]
    cells = {(r, c): OurCell(layout.cell(r, c), seeds={0: 50.0, 1: 51.0},
                             stale_seeds={2} if r == claim.subject else set())
             for r in (*layout.table.rows, *layout.extra_rows) for c in layout.table.columns}
    result = evaluate_on_ours(claim, load_params(REPO / "params.yaml"), None, REPO, cells)
    assert result["stale"] == {claim.subject: [2]}
    assert result_text(result, 2).endswith(f"[out of date, left out until trained again: {claim.subject} seed 2]")
