"""The seeds that would decide an inconclusive comparison (fedskew.reproduce.seeds), against hand-worked values,
and when they decide a part and a claim (fedskew.reproduce.deciding: the policy's rules of combination).

Every expected number is worked here from the paired differences written in the test and Student t quantiles
(t(0.975, 2) = 4.3027, t(0.975, 3) = 3.1824, t(0.975, 4) = 2.7764, t(0.975, 15) = 2.1314,
t(0.975, 16) = 2.1199); none is produced by the code under test.
"""

from __future__ import annotations

import math

import pytest

from fedskew.config import load_params
from fedskew.reproduce.combine import combine_parts, conjunction
from fedskew.reproduce.cost import ASSUMED_GPU_TFLOPS, CPU_RATES, run_flops
from fedskew.reproduce.deciding import Open, settle
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, PARTLY, REPRODUCED, Effect, paired_effect
from fedskew.reproduce.seeds import FORMULA, MAX_SEEDS, cost_text, seeds_cost, seeds_to_decide
from tests.helpers import REPO, TINY_PARAMS


def test_three_seeds_that_straddle_zero_need_17() -> None:
    # [1.0, -0.5, 0.8]: mean 0.4333, sd 0.81445. At 16 seeds the half-width is 2.1314 · 0.81445 / 4 = 0.4340,
    # still above 0.4333; at 17 it is 2.1199 · 0.81445 / √17 = 0.4188, below: 17 seeds, 14 more.
    estimate = seeds_to_decide(paired_effect([1.0, -0.5, 0.8]), 0.0)
    assert (estimate.observed, estimate.seeds, estimate.more, estimate.beyond) == (3, 17, 14, False)
    assert estimate.text() == "≈ 17 seeds (14 more; estimate)"
    record = estimate.record()
    assert record["estimate"] is True and record["formula"] == FORMULA and record["reason"] is None


def test_the_threshold_is_what_the_interval_must_clear() -> None:
    # [2, 3, 4] against 1.5: mean 3, sd 1, so |mean - threshold| = 1.5. Half-widths: 3 seeds 4.3027 / √3 = 2.484,
    # 4 seeds 3.1824 / 2 = 1.591, 5 seeds 2.7764 / √5 = 1.242 < 1.5: 5 seeds.
    assert seeds_to_decide(paired_effect([2.0, 3.0, 4.0]), 1.5).seeds == 5
    # a mean below the threshold is decided the other way, at the same distance: [-2, -3, -4] against -1.5
    assert seeds_to_decide(paired_effect([-2.0, -3.0, -4.0]), -1.5).seeds == 5


def test_one_seed_has_no_estimate() -> None:
    estimate = seeds_to_decide(paired_effect([5.0]), 0.0)
    assert estimate.seeds is None and estimate.more is None
    assert "one paired seed" in estimate.text() and "second seed" in estimate.text()


def test_a_mean_at_the_threshold_has_none() -> None:
    estimate = seeds_to_decide(paired_effect([1.0, -1.0, 0.0]), 0.0)  # mean 0, sd 1
    assert estimate.seeds is None and "equals the threshold" in estimate.reason
    assert seeds_to_decide(paired_effect([2.0, 0.0, 1.0]), 1.0).seeds is None  # mean 1 at a threshold of 1


def test_a_decided_effect_needs_no_more_and_a_hopeless_one_says_more_than_the_cap() -> None:
    decided = seeds_to_decide(paired_effect([7.0, 8.0, 9.0]), 0.0)  # [4.52, 11.48]: already clear of 0
    assert (decided.seeds, decided.more) == (3, 0)
    # mean 1/3000 against a spread of about 10: n ≈ (1.96 · 10 · 3000)² ≈ 3.5e9 seeds, past the cap
    hopeless = seeds_to_decide(paired_effect([10.0, -10.0, 0.001]), 0.0)
    assert hopeless.beyond and hopeless.seeds == MAX_SEEDS and hopeless.text().startswith("more than 100,000 seeds")


def test_the_spread_is_read_back_from_the_interval() -> None:
    # an effect as the ledger's JSON twin records it: mean ± 4.3027 · sd / √3 with sd 2 (differences 7, 3, 5)
    half = 4.302653 * 2 / math.sqrt(3)
    effect = Effect(5.0, 5.0 - half, 5.0 + half, 3)
    # against 4.5: |5 - 4.5| = 0.5 needs t(n-1) · 2 / √n < 0.5: the first such n, counted up with scipy's t
    n = next(n for n in range(2, 1000) if _t(n - 1) * 2 / math.sqrt(n) < 0.5)
    assert 60 < n < 70 and seeds_to_decide(effect, 4.5).seeds == n


def _t(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def test_the_extra_seeds_cost_what_cost_counts_for_every_run_they_add() -> None:
    runs = load_params(TINY_PARAMS).suite_runs("tiny")[:2]   # an MLP on digits: no measured CPU rate
    flops = sum(run_flops(cfg) for cfg in runs)
    cost = seeds_cost(runs, 3)
    assert cost["runs"] == 6
    assert cost["pflop"] == pytest.approx(3 * flops / 1e15)
    assert cost["gpu_hours"] == pytest.approx(3 * flops / (ASSUMED_GPU_TFLOPS * 1e12) / 3600)
    assert cost["cpu_hours"] is None
    assert cost_text(cost) == (f"6 runs, {3 * flops / 1e15:.2g} PFLOP: {cost['gpu_hours']:.2g} GPU-hours at "
                               f"{ASSUMED_GPU_TFLOPS:g} TFLOP/s sustained (assumed)")


def test_a_run_with_a_measured_cpu_rate_has_its_cpu_hours() -> None:
    cfg = next(c for c in load_params(REPO / "params.yaml", experiments=None).suite_runs("feded_mnist")
               if c.train.model == "fed_dnn")
    rate = CPU_RATES[("fed_dnn", "mnist")]
    cost = seeds_cost([cfg], 2)
    assert cost["cpu_hours"] == pytest.approx(2 * run_flops(cfg) / (rate * 1e9) / 3600)
    assert cost_text(cost).endswith(f", {cost['cpu_hours']:.2g} CPU-hours (measured rate)")


# ------------------------------------------------------------------ a part and a claim (fedskew.reproduce.deciding)
R, NR, I = REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE


def _open(seeds: int | None, toward: str | None = None, label: str = "x") -> Open:
    return Open(label, I, seeds, toward, observed=3, reason="" if seeds else "one paired seed")


def test_a_part_needs_every_comparison_unless_one_falls_short() -> None:
    # every comparison toward reproduced: the one needing most seeds decides; one conclusive already counts as is
    assert _settled([Open("a", R), _open(5, R), _open(9, R)], conjunction) == (9, R)
    # one toward not reproduced decides the column there, whatever the others do, estimated or not
    assert _settled([_open(5, NR), _open(9, R)], conjunction) == (5, NR)
    assert _settled([_open(5, NR), _open(None)], conjunction) == (5, NR)
    # a comparison without an estimate may still fail the column: no estimate
    assert settle([_open(5, R), _open(None)], conjunction) is None


def test_a_claim_under_all_waits_for_every_part_unless_it_is_partly_whatever_they_do() -> None:
    every = lambda verdicts: combine_parts(verdicts, "all")  # noqa: E731
    assert _settled([_open(5, R), _open(17, R)], every) == (17, R)
    # not reproduced at 5 seeds, then partly once the other part holds at 17: the verdict is final at 17
    assert _settled([_open(5, NR), _open(17, R)], every) == (17, PARTLY)
    # reproduced at 5 and the other part heading for not reproduced: partly from 5 seeds on
    assert _settled([_open(5, R), _open(17, NR)], every) == (5, PARTLY)


def test_a_claim_under_most_is_decided_by_a_majority() -> None:
    most = lambda verdicts: combine_parts(verdicts, "most")  # noqa: E731
    # two of three parts reproduced at 9 seeds: the third (not reproduced at 20) no longer changes it
    assert _settled([_open(4, R), _open(9, R), _open(20, NR)], most) == (9, R)
    # half the lines not reproduced is not reproduced under most: at 6 seeds, whatever the line without an estimate
    assert _settled([_open(6, NR), _open(None)], most) == (6, NR)


def test_the_deciding_comparison_is_named() -> None:
    settled = settle([Open("a", R), _open(9, R, "vs FedAvg"), _open(5, R, "vs FedProx")], conjunction)
    assert settled.by == "vs FedAvg" and (settled.seeds, settled.observed) == (9, 3)
    claim = settle([Open("CIFAR10", I, 9, R, 3, by="vs FedAvg"), Open("MNIST", R)],
                   lambda v: combine_parts(v, "all"))
    assert claim.by == "CIFAR10 vs FedAvg"


def _settled(items, combine):
    settled = settle(items, combine)
    return None if settled is None else (settled.seeds, settled.toward)
