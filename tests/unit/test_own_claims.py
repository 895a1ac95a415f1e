"""Claims of one's own (fedskew.reproduce.own_claims, own_ledger): a claims file about a tiny fake suite, checked,
judged and written, against hand-worked intervals.

The run files are written with chosen final accuracies (fedskew.runfiles, as a training job writes them), so
every verdict is worked by hand from the per-seed differences and t(0.975, 2) = 4.3027, t(0.975, 3) = 3.1824.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from fedskew.cli import main
from fedskew.config import ConfigError, load_params
from fedskew.reproduce.own_claims import load_own_claims
from fedskew.reproduce.own_ledger import evaluate_own, write_own_ledger
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_RUN, PARTLY, REPRODUCED
from fedskew.runfiles import write_run_files
from tests.helpers import TINY_PARAMS

# final test accuracy (fraction) per seed 0, 1, 2, by suite, partition and method
ACCURACY = {
    ("mine", "dir0.5"): {"fedavg": [0.80, 0.70, 0.75], "fedprox": [0.82, 0.725, 0.77], "fedlc": [0.70, 0.72, 0.60]},
    ("mine", "q2"): {"fedavg": [0.60, 0.62, 0.61], "fedprox": [0.61, 0.64, 0.62], "fedlc": [0.50, 0.52, 0.51]},
    ("mine_e2", "dir0.5"): {"fedavg": [0.81, 0.71, 0.76], "fedlc": [0.85, 0.75, 0.80]},
}
CLAIMS = {
    "suite": "mine",
    "protocols": {"2 local epochs": "mine_e2"},
    "claims": [
        {"id": "c1", "statement": "FedProx beats FedAvg everywhere", "word": "beats", "subject": "fedprox",
         "against": ["fedavg"], "columns": ["digits / dir0.5", "digits / q2"]},
        {"id": "c2", "statement": "FedLC beats FedAvg on Dirichlet 0.5", "word": "beats", "subject": "fedlc",
         "against": ["fedavg"], "columns": ["digits / dir0.5"]},
        {"id": "c3", "statement": "FedProx beats FedAvg on q2", "word": "beats", "subject": "fedprox",
         "against": ["fedavg"], "columns": ["digits / q2"], "protocols": {}},
        {"id": "c4", "statement": "Most methods lose accuracy from Dirichlet 0.5 to q2",
         "word": "decreases / increases as X grows", "quantifier": "most", "order": ["digits / dir0.5", "digits / q2"],
         "for_each": ["fedavg", "fedlc"], "direction": "decreasing", "protocols": {}},
        {"id": "c5", "statement": "FedAvg is significantly better than FedLC on q2", "word": "significantly",
         "subject": "fedavg", "against": ["fedlc"], "columns": ["digits / q2"], "note": "a note of mine"},
    ],
}


def _project(tmp_path, monkeypatch, claims: dict | None = None):
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"] = {
        "mine": {"settings": [{"dataset": "digits", "partitions": ["dir0.5", "q2"]}],
                 "methods": ["fedavg", "fedprox", "fedlc"], "seeds": [0, 1, 2]},
        "mine_e2": {"settings": [{"dataset": "digits", "partitions": ["dir0.5"]}], "methods": ["fedavg", "fedlc"],
                    "seeds": [0, 1, 2]},
    }
    params["run"] = {"suites": ["mine"]}
    params["training"] = {"mine": TINY_PARAMS["training"]["tiny"],
                          "mine_e2": {**TINY_PARAMS["training"]["tiny"], "local_epochs": 2}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    loaded = load_params(tmp_path / "params.yaml")
    for suite in ("mine", "mine_e2"):
        for cfg in loaded.suite_runs(suite):
            value = ACCURACY[(suite, cfg.partition)][cfg.method][cfg.seed]
            write_run_files(cfg, [{"round": 4, "test_acc": value}],
                            {"status": "finished", "final_acc": value, "final_round": 4}, tmp_path)
    path = tmp_path / "experiments/claims/mine.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(claims or CLAIMS, sort_keys=False))
    return loaded, path


def _interval(differences: list[float]) -> tuple[float, float, float]:
    mean = sum(differences) / len(differences)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    half = 4.302653 * sd / math.sqrt(len(differences))
    return mean, mean - half, mean + half


def test_a_suites_grid_is_the_claims_table_and_another_suite_a_protocol(tmp_path, monkeypatch) -> None:
    params, path = _project(tmp_path, monkeypatch)
    own = load_own_claims(path.relative_to(tmp_path), params)
    assert own.name == "mine" and own.suites == ["mine", "mine_e2"]
    layout = own.layouts["c1"]
    assert layout.table.rows == ("fedavg", "fedprox", "fedlc")
    assert layout.table.columns == ("digits / dir0.5", "digits / q2")
    assert list(layout.protocols) == ["2 local epochs"] and own.layouts["c3"].protocols == {}
    # the protocol moves each cell to the other suite; a cell that suite does not run is not part of it
    assert layout.cell("fedlc", "digits / dir0.5", "2 local epochs").suite == "mine_e2"
    assert sorted({(c.suite, c.partition) for c in own.runs(params)}) == [
        ("mine", "dir0.5"), ("mine", "q2"), ("mine_e2", "dir0.5")]


def test_each_claim_is_judged_by_the_papers_rules_on_the_suites_runs(tmp_path, monkeypatch) -> None:
    params, path = _project(tmp_path, monkeypatch)
    records = {r["id"]: r for r in evaluate_own(load_own_claims(path, params), params)}
    # c1: dir0.5 +2, +2.5, +2 (the whole interval above 0); q2 +1, +2, +1: [-0.10, +2.77] straddles 0 -> partly
    c1 = records["c1"]["ours"]["main protocol"]
    assert [p["verdict"] for p in c1["parts"]] == [REPRODUCED, INCONCLUSIVE] and c1["verdict"] == PARTLY
    mean, low, high = _interval([1.0, 2.0, 1.0])
    assert (c1["parts"][1]["effect"]["mean"], c1["parts"][1]["effect"]["low"]) == pytest.approx((mean, low))
    assert records["c1"]["ours"]["2 local epochs"]["verdict"] == NOT_RUN  # mine_e2 runs no fedprox
    # c2: -10, +2, -15 straddles 0 in the main protocol; +4 on every seed under 2 local epochs: the protocol decides
    c2 = records["c2"]
    assert c2["ours"]["main protocol"]["verdict"] == INCONCLUSIVE
    assert c2["ours"]["2 local epochs"]["verdict"] == REPRODUCED and c2["verdict"] == REPRODUCED
    assert "seeds_to_decide" not in c2
    # c5: +10 on every seed against "significantly" (1 point): reproduced at 0.5x and 2x the threshold too
    assert records["c5"]["verdict"] == REPRODUCED
    assert records["c5"]["threshold_sensitivity"] == {"0.5": {"ours": REPRODUCED}, "2.0": {"ours": REPRODUCED}}


def test_an_inconclusive_claim_says_the_seeds_that_would_decide_it(tmp_path, monkeypatch) -> None:
    params, path = _project(tmp_path, monkeypatch)
    records = {r["id"]: r for r in evaluate_own(load_own_claims(path, params), params)}
    # c3: q2's +1, +2, +1 (mean 4/3, sd 0.577): half-width 3 seeds 4.3027 · 0.577 / √3 = 1.43 > 4/3,
    # 4 seeds 3.1824 · 0.577 / 2 = 0.92 < 4/3: 4 seeds, toward reproduced; each of 2 cells needs one more run
    c3 = records["c3"]
    assert c3["verdict"] == INCONCLUSIVE
    seeds = c3["seeds_to_decide"]
    assert (seeds["protocol"], seeds["seeds"], seeds["more"], seeds["toward"]) == ("main protocol", 4, 1, REPRODUCED)
    assert seeds["by"] == "digits / q2 vs fedavg" and seeds["estimate"] is True
    assert [p["label"] for p in seeds["parts"]] == ["digits / q2"]
    assert (seeds["cost"]["runs"], seeds["cost"]["cells"]) == (2, 2)
    # c4 under "most": FedLC's 20, 20, 9 points lost is reproduced, FedAvg's 20, 8, 14 (mean 14, sd 6) is not yet:
    # 4 seeds (3.1824 · 6 / 2 = 9.5 < 14) decide FedAvg's line, and with it the majority
    c4 = records["c4"]
    assert [line["verdict"] for line in c4["ours"]["main protocol"]["lines"]] == [INCONCLUSIVE, REPRODUCED]
    assert (c4["seeds_to_decide"]["seeds"], c4["seeds_to_decide"]["toward"]) == (4, REPRODUCED)
    assert c4["seeds_to_decide"]["by"] == "fedavg, net change"


def test_the_ledger_and_its_twin_are_written_through_the_command(tmp_path, monkeypatch, capsys) -> None:
    _project(tmp_path, monkeypatch)
    assert main(["claims", "--file", "experiments/claims/mine.yaml"]) == 0
    page = (tmp_path / "results/claims/mine.md").read_text()
    twin = json.loads((tmp_path / "results/claims/mine.json").read_text())
    assert page.startswith("# Claims ledger: `experiments/claims/mine.yaml`")
    assert "**5 claims: 2 reproduced, 1 partly, 0 not reproduced, 2 inconclusive, 0 not run here.**" in page
    assert "| c3 | main protocol | ≈ 4 seeds (1 more; digits / q2 vs fedavg), toward reproduced |" in page
    assert "## Each claim under every protocol" in page and "| c2 | 2 local epochs | reproduced |" in page
    assert "- **c5**: a note of mine" in page and "**Proxies**" not in page
    assert "hangs on the protocol: reproduced under *2 local epochs*; inconclusive under *main protocol*" in page
    assert [r["id"] for r in twin["claims"]] == ["c1", "c2", "c3", "c4", "c5"]
    assert twin["claims"][2]["seeds_to_decide"]["seeds"] == 4 and "c2" in twin["hangs_on"]


@pytest.mark.parametrize("change, says", [
    (lambda c: c["claims"][0].update(subject="fedproxx"),
     "claim c1: methods ['fedproxx'] not in suite 'mine' (did you mean 'fedprox'?); they are: fedavg, fedprox, fedlc"),
    (lambda c: c["claims"][1].update(columns=["digits/dir0.5"]),
     "claim c2: settings ['digits/dir0.5'] not in suite 'mine' (did you mean 'digits / dir0.5'?)"),
    (lambda c: c.update(suite="mien"), "suite 'mien' is not a suite of params.yaml or experiments/ (did you mean"),
    (lambda c: c["claims"][2].update(suite="other"), "claim c3: suite 'other' is not a suite"),
    (lambda c: c["claims"][0].update(word="beat"), "claim c1: word 'beat' is not in policy.yaml (did you mean 'beats'?)"),
    (lambda c: c["claims"][0].pop("word"), "claim c1: it names no word: write `word:`, one of: beats"),
    (lambda c: c["claims"][0].update(agianst=["fedavg"]), "claim c1: `agianst` is not a key of a claim (did you mean"),
    (lambda c: c["claims"][0].update(against="fedavg"), "claim c1: against must be a list of labels, got 'fedavg'"),
    (lambda c: c["claims"][0].update(kind="trend"), "claim c1: word 'beats' is a gap word, the claim a trend"),
    (lambda c: c["claims"][1].update(id="c1"), "claim c1: the id is given twice"),
    (lambda c: c["claims"][0].pop("id"), "claim #1: it has no id: write `id: mine-01`"),
    (lambda c: c.update(protocols={"e2": "mine_e3"}), "protocol 'e2': suite 'mine_e3' is not a suite"),
    (lambda c: c.update(protocols={"itself": "mine"}), "protocol 'itself' is suite 'mine' itself"),
    (lambda c: c.update(claims=[]), "it lists no claims"),
    (lambda c: c.update(metrc="final_loss"), "`metrc` is not a key of a claims file (did you mean 'metric'?)"),
])
def test_a_claims_file_that_does_not_fit_is_refused_naming_the_file_and_writing_nothing(
        tmp_path, monkeypatch, capsys, change, says) -> None:
    claims = copy.deepcopy(CLAIMS)
    change(claims)
    params, path = _project(tmp_path, monkeypatch, claims)
    with pytest.raises(ConfigError) as refused:
        write_own_ledger(params, path.relative_to(tmp_path))
    message = str(refused.value)
    assert message.startswith("experiments/claims/mine.yaml") and says in message, message
    assert main(["claims", "--file", "experiments/claims/mine.yaml"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "results/claims").exists()


def test_a_malformed_file_is_refused_before_anything_is_read(tmp_path, monkeypatch) -> None:
    params, path = _project(tmp_path, monkeypatch)
    path.write_text("suite: mine\nclaims: [{id: c1\n")
    with pytest.raises(ConfigError, match="mine.yaml: not valid YAML"):
        load_own_claims(path, params)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="a claims file is a mapping of suite, protocols, metric, claims"):
        load_own_claims(path, params)
    with pytest.raises(ConfigError, match="no such claims file; claims of your own go in experiments/claims/"):
        load_own_claims(tmp_path / "experiments/claims/none.yaml", params)
