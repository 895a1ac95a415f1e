"""The reproduction targets through the `snakemake` command: they train only `reproduce.suites`."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import yaml

from fedskew import paths
from fedskew.config import load_params
from fedskew.packed.archive import ship
from fedskew.reproduce.paper_tables import paper_table_ids
from fedskew.runfiles import write_run_files
from tests.helpers import REPO, changed, jobs, make_copy, planned, run, venv_bin

pytestmark = pytest.mark.slow


def test_the_shipped_ledger_target_plans_training_of_reproduce_suites_only(tmp_path) -> None:
    root = make_copy(tmp_path, {})
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    result = run([venv_bin("snakemake"), "-n", "results/claims.md"], root)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = result.stdout
    trained = set(re.findall(r"wildcards: suite=([^,\n]+), dataset", plan))
    reproduce = yaml.safe_load((REPO / "params.yaml").read_text())["reproduce"]
    assert trained and trained <= set(reproduce["suites"])  # never a download-and-GPU suite such as fedlc_table
    imported = set(re.findall(r"rule import_suite:\n(?:.*\n)*?\s+wildcards: suite=(\S+)", plan))
    assert imported == set(reproduce.get("imported", []))  # their committed archives, imported, not trained
    assert plan.count("rule paper_table:") == len(paper_table_ids()) == 25

    # aggregate reads all three files of each run, and of the transcriptions only those of the paper tables
    # that print its suite (the values its dot plots mark): the default suite's none
    inputs = {job["wildcards"]["suite"]: set(job["input"]) for job in jobs(root, "results/tables/fedlc_t4_synthetic.md",
                                                                            "results/tables/default.md")
              if job["rule_name"] == "aggregate"}
    transcriptions = root / "src/fedskew/reproduce"
    assert {p for p in inputs["fedlc_t4_synthetic"] if p.startswith(str(root / "src"))} == {
        str(transcriptions / "papers/fedlc_t4.yaml"), str(transcriptions / "layouts/fedlc.yaml")}
    runs = load_params(root / "params.yaml").runs(["default"])
    assert inputs["default"] == {str(cfg.path(name)) for cfg in runs  # and its partition's summary (per-client outcomes)
                                 for name in (paths.RUN_METRICS, paths.RUN_HISTORY, paths.RUN_CONFIG,
                                              paths.PARTITION_JSON)}


def test_ledger_and_paper_tables_build_from_a_tiny_suite(tmp_path, tiny_params) -> None:
    # A suite the layouts do not name: every cell reads "not run", every claim "not run here",
    # and the targets still build (no download, no error) after training what reproduce lists.
    # A second suite, trained elsewhere, arrives as a committed archive (reproduce.imported) and is
    # imported into results/runs/ before the tables, never trained here.
    tiny_params["suites"]["tiny"]["seeds"] = [0]
    tiny_params["suites"]["elsewhere"] = copy.deepcopy(tiny_params["suites"]["tiny"])
    tiny_params["training"]["elsewhere"] = copy.deepcopy(tiny_params["training"]["tiny"])
    tiny_params["reproduce"] = {"suites": ["tiny"], "imported": ["elsewhere"]}
    root = make_copy(tmp_path, tiny_params)
    elsewhere = load_params(root / "params.yaml").runs(["elsewhere"])
    trained_there = tmp_path / "gpu-machine"
    for cfg in elsewhere:
        write_run_files(cfg, [{"round": 1, "test_acc": 0.5, "test_loss": 1.0}],
                        {"status": "finished", "final_acc": 0.5, "final_loss": 1.0}, trained_there)
    ship(elsewhere, root / "results/imported/elsewhere", trained_there)
    result = run([venv_bin("snakemake"), "--cores", "2", "results/claims.md"], root, FEDSKEW_TRACKING="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (root / "results/runs/tiny/digits/q2/fedlc/seed0/metrics.json").exists()
    assert (root / "results/runs/elsewhere/IMPORTED").exists()
    for cfg in elsewhere:  # the archive's bytes, placed as they were
        for name in ("config.yaml", "history.csv", "metrics.json"):
            here, there = (r / cfg.path(paths.RUN_DIR) / name for r in (root, trained_there))
            assert here.read_bytes() == there.read_bytes()
    trained = set(re.findall(r"wildcards: suite=([^,\n]+), dataset", result.stdout + result.stderr))
    assert trained == {"tiny"}  # the imported suite is never trained here
    for table in paper_table_ids():
        assert (root / f"results/papers/{table}.md").exists(), table
    ledger = json.loads((root / "results/claims.json").read_text())
    assert len(ledger["claims"]) >= 40
    assert {c["verdict"] for c in ledger["claims"]} == {"not run here"}
    page = (root / "results/claims.md").read_text()
    assert f"**{len(ledger['claims'])} claims: 0 reproduced, 0 partly, 0 not reproduced" in page
    t4 = (root / "results/papers/fedlc_t4.md").read_text()
    assert "not run: fedlc_t4_synthetic is not in reproduce.suites" in t4 and "paper 75.46 ± 0.52" in t4

    # Each rule's inputs are the transcriptions it reads: a change to one re-runs those rules, and only them.
    assert planned(root, "results/claims.md") == {}
    reproduce = root / "src/fedskew/reproduce"
    ledger = {"results/claims.md", "results/claims.json"}

    def pages(tables):
        return {paths.PAPER_TABLE.format(table=t, ext=ext) for t in tables for ext in ("md", "json")}

    with changed(reproduce / "papers/fedlc_t4.yaml"):
        assert planned(root, "results/claims.md") == {"paper_table": pages(["fedlc_t4"]), "claims": ledger}
    with changed(reproduce / "layouts/flfcr.yaml"):  # lays out FL-FCR's tables, and only those
        flfcr = yaml.safe_load((reproduce / "layouts/flfcr.yaml").read_text())
        assert planned(root, "results/claims.md") == {"paper_table": pages(flfcr), "claims": ledger}
    for source in ("claims/scala.yaml", "policy.yaml"):
        with changed(reproduce / source):
            assert planned(root, "results/claims.md") == {"claims": ledger}, source
    assert planned(root, "results/claims.md") == {}
