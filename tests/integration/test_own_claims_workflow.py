"""A ledger of one's own through the `snakemake` command: experiments/claims/<name>.yaml in a scratch project."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from tests.helpers import changed, make_copy, planned, run, venv_bin

pytestmark = pytest.mark.slow

CLAIMS = {
    "suite": "tiny",
    "protocols": {"2 local epochs": "tiny_e2"},
    "claims": [
        {"id": "mine-01", "statement": "FedLC beats FedAvg", "word": "beats", "subject": "fedlc",
         "against": ["fedavg"], "columns": ["digits / dir0.5"]},
        {"id": "mine-02", "statement": "FedAvg is significantly better than FedLC", "word": "significantly",
         "subject": "fedavg", "against": ["fedlc"], "columns": ["digits / dir0.5"]},
    ],
}


def test_all_builds_the_ledger_of_each_claims_file_and_a_broken_one_stops_it(tmp_path, tiny_params) -> None:
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    tiny_params["suites"]["tiny_e2"] = copy.deepcopy(tiny_params["suites"]["tiny"])  # not in run.suites
    tiny_params["training"]["tiny_e2"] = {**tiny_params["training"]["tiny"], "local_epochs": 2}
    root = make_copy(tmp_path, tiny_params)
    claims = root / "experiments/claims/mine.yaml"
    claims.parent.mkdir(parents=True)
    claims.write_text(yaml.safe_dump(CLAIMS, sort_keys=False))

    result = run([venv_bin("snakemake"), "--cores", "2"], root, FEDSKEW_TRACKING="0")
    assert result.returncode == 0, result.stderr[-4000:]
    # the protocol's suite is trained for the ledger, on the grid points the claims read
    trained = set(re.findall(r"wildcards: suite=([^,\n]+), dataset", result.stdout + result.stderr))
    assert trained == {"tiny", "tiny_e2"}
    page = (root / "results/claims/mine.md").read_text()
    twin = json.loads((root / "results/claims/mine.json").read_text())
    assert page.startswith("# Claims ledger: `experiments/claims/mine.yaml`") and "**2 claims: " in page
    assert "| mine-01 (`tiny`) | beats | FedLC beats FedAvg |" in page
    assert "| mine-01 | 2 local epochs |" in page  # judged under the protocol too
    assert "## Does the verdict change at half or double the threshold?" in page  # mine-02's 1 point
    assert [c["id"] for c in twin["claims"]] == ["mine-01", "mine-02"] and twin["suites"] == ["tiny", "tiny_e2"]
    assert list(twin["claims"][0]["ours"]) == ["main protocol", "2 local epochs"]
    for record in twin["claims"]:  # an inconclusive claim says the seeds that would decide it
        assert ("seeds_to_decide" in record) == (record["verdict"] == "inconclusive")

    again = run([venv_bin("snakemake"), "--cores", "2", "-n"], root)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # the claims file is an input of the ledger, and only of it
    ledger = {"results/claims/mine.md", "results/claims/mine.json"}
    with changed(claims):
        assert planned(root) == {"own_claims": ledger}

    # a claims file that does not fit stops the workflow before any job, naming the file, the claim and the fix
    before = page
    broken = copy.deepcopy(CLAIMS)
    broken["claims"][0]["subject"] = "fedlcc"
    claims.write_text(yaml.safe_dump(broken, sort_keys=False))
    result = run([venv_bin("snakemake"), "--cores", "2"], root, FEDSKEW_TRACKING="0")
    assert result.returncode != 0
    assert "experiments/claims/mine.yaml is invalid" in result.stderr
    assert "claim mine-01: methods ['fedlcc'] not in suite 'tiny' (did you mean 'fedlc'?)" in result.stderr
    assert (root / "results/claims/mine.md").read_text() == before
