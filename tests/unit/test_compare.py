"""`fedskew compare`: each method against the baseline, paired by seed, against an independent computation.

The run files are written with chosen final accuracies (fedskew.runfiles, as a training job writes them), so
the expected effects are worked out here with scipy's t quantile, apart from fedskew's own arithmetic.
"""

from __future__ import annotations

import copy
import json
import math
import statistics

import pytest
from scipy.stats import t

from fedskew import paths
from fedskew.cli import main
from fedskew.config import ConfigError, load_params
from fedskew.report.compare import compare, write_comparison
from fedskew.runfiles import write_run_files
from tests.helpers import TINY_PARAMS

# final test accuracy (fraction) by method and seed, on every setting of the suite
ACCURACY = {"fedavg": [0.80, 0.70, 0.75], "fedprox": [0.82, 0.725, 0.77], "fedlc": [0.70, 0.72, 0.60]}


# Two classes: class 0's test accuracy is the run's accuracy, class 1's CLASS1 below it; four clients' label
# counts (every partition and seed), so a client's accuracy is its share of each class times that class's.
CLASS1 = {"fedavg": 0.30, "fedprox": 0.10, "fedlc": 0.20}
LABEL_COUNTS = [[10, 0], [0, 10], [5, 5], [8, 2]]


def _clients_by_hand(method: str, seed: int) -> list[float]:
    """The four clients' accuracies of a run, in points, from the per-class accuracies and label counts."""
    per_class = [ACCURACY[method][seed], ACCURACY[method][seed] - CLASS1[method]]
    return [100 * sum(n * a for n, a in zip(counts, per_class)) / sum(counts) for counts in LABEL_COUNTS]


def _project(tmp_path, monkeypatch, diverged: tuple[str, int] | None = None):
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"].update(methods=["fedavg", "fedprox", "fedlc"], seeds=[0, 1, 2])
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    monkeypatch.chdir(tmp_path)
    loaded = load_params(tmp_path / "params.yaml")
    for cfg in loaded.suite_runs("tiny"):
        value = ACCURACY[cfg.method][cfg.seed]
        if (cfg.method, cfg.seed) == diverged:
            final = {"status": "diverged", "diverged_round": 2}
        else:
            final = {"status": "finished", "final_acc": value, "final_round": 4}
        row = {"round": 4, "test_acc": value, "test_acc_class0": value, "test_acc_class1": value - CLASS1[cfg.method]}
        write_run_files(cfg, [row], final, tmp_path)
        summary = tmp_path / paths.PARTITION_JSON.format(dataset=cfg.dataset, partition=cfg.partition, seed=cfg.seed)
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"label_counts": LABEL_COUNTS}))
    return loaded


def _expected(method: str) -> tuple[float, float, float]:
    differences = [100 * (a - b) for a, b in zip(ACCURACY[method], ACCURACY["fedavg"])]
    mean = statistics.fmean(differences)
    half = t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return mean, mean - half, mean + half


def test_each_method_against_fedavg_in_every_setting_is_the_paired_t_interval(tmp_path, monkeypatch) -> None:
    found = compare(_project(tmp_path, monkeypatch), "tiny")
    assert [(c.dataset, c.partition, c.method) for c in found] == [
        ("digits", "dir0.5", "fedprox"), ("digits", "dir0.5", "fedlc"),
        ("digits", "q2", "fedprox"), ("digits", "q2", "fedlc")]
    for c in found:
        mean, low, high = _expected(c.method)
        assert c.seeds == (0, 1, 2) and c.baseline == "fedavg"
        assert (c.effect.mean, c.effect.low, c.effect.high) == pytest.approx((mean, low, high), abs=1e-9)
    fedprox, fedlc = found[0], found[1]
    # fedprox: +2, +2.5, +2 points: the whole interval above 0
    assert fedprox.verdicts == {"beats": "holds", "at least as good": "holds"}
    # fedlc: -10, +2, -15 points: the interval straddles 0
    assert fedlc.verdicts == {"beats": "inconclusive", "at least as good": "inconclusive"}


def test_a_threshold_and_another_baseline(tmp_path, monkeypatch) -> None:
    params = _project(tmp_path, monkeypatch)
    high = compare(params, "tiny", threshold=5.0)[0]  # fedprox's interval, about [+1.4, +2.9], is below 5
    assert high.verdicts["beats"] == "does not hold" and high.threshold == 5.0
    against_lc = compare(params, "tiny", baseline="fedlc")
    assert [c.method for c in against_lc[:2]] == ["fedavg", "fedprox"]


def test_a_diverged_seed_fails_the_method_and_leaves_the_baselines_pairing(tmp_path, monkeypatch) -> None:
    params = _project(tmp_path, monkeypatch, diverged=("fedprox", 1))
    fedprox = compare(params, "tiny")[0]
    assert fedprox.verdicts == {"beats": "does not hold", "at least as good": "does not hold"}
    assert fedprox.diverged == {"fedprox": (1,)} and fedprox.seeds == (0, 2)
    other = tmp_path / "other"
    other.mkdir()
    params = _project(other, monkeypatch, diverged=("fedavg", 2))
    fedprox = compare(params, "tiny")[0]
    assert fedprox.seeds == (0, 1) and fedprox.diverged == {"fedavg": (2,)}
    # +2, +2.5 on the seeds left: two seeds, t(0.975, 1) = 12.7, an interval of ±3.2 around +2.25
    assert fedprox.verdicts["beats"] == "inconclusive" and fedprox.effect.low < 0 < fedprox.effect.high


def test_the_command_prints_writes_and_refuses_what_it_cannot_compare(tmp_path, monkeypatch, capsys) -> None:
    params = _project(tmp_path, monkeypatch)
    assert main(["compare", "--suite", "tiny"]) == 0
    page = capsys.readouterr().out
    mean, low, high = _expected("fedprox")
    assert f"| digits / dir0.5 | fedprox | 3 | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | holds | holds |" in page
    assert main(["compare", "--suite", "tiny", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[0]["mean"] == pytest.approx(mean) and records[0]["verdicts"]["beats"] == "holds"
    written = write_comparison(compare(params, "tiny"), tmp_path)
    assert [p.name for p in written] == ["tiny.md", "tiny.csv", "tiny.json", "tiny.png"]
    assert written[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(written[2].read_text()) == records
    with pytest.raises(ConfigError, match="--baseline 'scaffold' is not a method of suite 'tiny'"):
        compare(params, "tiny", baseline="scaffold")
    params.raw["suites"]["tiny"]["methods"] = ["fedlc"]
    with pytest.raises(ConfigError, match="suite 'tiny' runs one method, 'fedlc': there is nothing to compare"):
        compare(params, "tiny")
    assert main(["compare", "--suite", "nope"]) == 2
    assert "'nope' is not a suite" in capsys.readouterr().err


def _seeds_by_hand(differences: list[float], threshold: float = 0.0) -> int:
    """The smallest n >= 2 at which the t-interval's half-width at the observed spread is below |mean − θ|."""
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    n = 2
    while t.ppf(0.975, n - 1) * spread / math.sqrt(n) >= abs(mean - threshold):
        n += 1
    return n


def test_an_inconclusive_comparison_states_the_seeds_that_would_decide_it_and_their_cost(tmp_path, monkeypatch,
                                                                                         capsys) -> None:
    params = _project(tmp_path, monkeypatch)
    fedprox, fedlc = compare(params, "tiny")[:2]
    assert fedprox.to_decide is None and fedprox.record()["seeds_to_decide"] is None  # decided: nothing to add
    expected = _seeds_by_hand([-10.0, 2.0, -15.0])
    assert fedlc.to_decide.seeds == expected and fedlc.to_decide.more == expected - 3
    cost = fedlc.to_decide_cost
    assert cost["runs"] == 2 * (expected - 3) and cost["gpu_hours"] > 0 and cost["cpu_hours"] is None  # digits
    record = fedlc.record()["seeds_to_decide"]
    assert record["estimate"] is True and record["seeds"] == expected and "t((1+L)/2, n−1)" in record["formula"]
    assert main(["compare", "--suite", "tiny"]) == 0
    page = capsys.readouterr().out
    assert f"| ≈ {expected} seeds ({expected - 3} more; estimate) | {2 * (expected - 3)} runs, " in page
    assert "Seeds that would decide an inconclusive comparison: an estimate" in page


def test_without_fedavg_the_suites_first_method_is_the_baseline(tmp_path, monkeypatch) -> None:
    params = _project(tmp_path, monkeypatch)
    params.raw["suites"]["tiny"]["methods"] = ["fedprox", "fedavg", "fedlc"]
    assert {c.baseline for c in compare(params, "tiny")} == {"fedavg"}
    params.raw["suites"]["tiny"]["methods"] = ["fedprox", "fedlc"]
    assert {(c.method, c.baseline) for c in compare(params, "tiny")} == {("fedlc", "fedprox")}


def test_the_worst_10_percent_of_clients_and_the_others_are_paired_by_seed_too(tmp_path, monkeypatch, capsys) -> None:
    fedprox = compare(_project(tmp_path, monkeypatch), "tiny")[0]
    by_hand = {}
    for name, of in (("mean_acc", statistics.fmean), ("worst10_acc", min), ("spread_acc", statistics.pstdev)):
        differences = [of(_clients_by_hand("fedprox", s)) - of(_clients_by_hand("fedavg", s)) for s in (0, 1, 2)]
        mean = statistics.fmean(differences)
        half = t.ppf(0.975, 2) * statistics.stdev(differences) / math.sqrt(3)
        by_hand[name] = (mean, mean - half, mean + half)
    for name, (mean, low, high) in by_hand.items():  # 4 clients: the worst 10 % is the worst client
        effect = fedprox.clients[name]
        assert (effect.mean, effect.low, effect.high) == pytest.approx((mean, low, high), abs=1e-9), name
    assert main(["compare", "--suite", "tiny"]) == 0
    mean, low, high = by_hand["worst10_acc"]
    assert f"| {mean:+.2f} [{low:+.2f}, {high:+.2f}] |" in capsys.readouterr().out
    # without the partitions' label counts there is nothing to weigh the classes by: it says what to draw
    for summary in (tmp_path / "data/partitions").rglob("*.json"):
        summary.unlink()
    with pytest.raises(FileNotFoundError, match="partition summaries these runs trained on are missing"):
        compare(load_params(tmp_path / "params.yaml"), "tiny")
