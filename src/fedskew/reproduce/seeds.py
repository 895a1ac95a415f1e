"""The seeds that would decide an inconclusive comparison: an estimate, and what those seeds cost.

An inconclusive paired effect is one whose t-interval straddles its threshold θ. With the observed mean d̄ and
standard deviation s of the paired per-seed differences held fixed, the interval's half-width at n seeds is
t((1 + level) / 2, n − 1) · s / √n, which shrinks as n grows; the interval excludes θ once that half-width is
below |d̄ − θ|. The seeds that decide are the smallest such n:

    n* = min { n ≥ 2 : t((1 + level) / 2, n − 1) · s / √n < |d̄ − θ| }

It is an **estimate**: d̄ and s are themselves estimated from the seeds run so far, and more seeds move both.
Read it as "about how many", to plan with: a comparison at n* ≈ 6 is within reach, one at n* ≈ 400 says the
methods differ by less than the seeds' spread can resolve. It is undefined for one seed (no spread to estimate
from) and infinite where d̄ = θ (no number of seeds moves the interval off the threshold); both say so.

What the seeds cost is counted by `fedskew.reproduce.cost` (training and evaluation FLOPs, GPU-hours at its
assumed throughput, CPU-hours at its measured rates), for the runs the extra seeds add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedskew.reproduce.policy import Effect, load_policy, t_quantile

MAX_SEEDS = 100_000  # past this many seeds the estimate says "more than"
FORMULA = "n* = min{n ≥ 2 : t((1+L)/2, n−1) · s/√n < |d̄ − θ|}, at the observed mean d̄ and spread s"


@dataclass(frozen=True)
class SeedsToDecide:
    """The estimated number of paired seeds at which an inconclusive effect's interval would exclude its
    threshold; `seeds` None where no estimate can be given (`reason` says why)."""

    observed: int               # the paired seeds run so far
    seeds: int | None           # n*, the estimated total of paired seeds that decides it (> observed)
    beyond: bool = False        # True: more than MAX_SEEDS (`seeds` is MAX_SEEDS)
    reason: str = ""            # why there is no estimate

    @property
    def more(self) -> int | None:
        """The seeds to add to those run: n* − observed."""
        return None if self.seeds is None else self.seeds - self.observed

    def text(self) -> str:
        """The estimate in words: "≈ 7 seeds (4 more; estimate)", or why there is none."""
        if self.seeds is None:
            return self.reason
        if self.beyond:
            return f"more than {MAX_SEEDS:,} seeds (estimate): the difference is far inside the seeds' spread"
        return f"≈ {self.seeds} seeds ({self.more} more; estimate)"

    def record(self) -> dict:
        return {"observed": self.observed, "seeds": self.seeds, "more": self.more, "beyond": self.beyond,
                "reason": self.reason or None, "estimate": True, "formula": FORMULA}


def spread(effect: Effect, level: float) -> float:
    """The standard deviation s of the paired differences behind an effect with an interval: its half-width
    is t((1 + level) / 2, n − 1) · s / √n."""
    half = (effect.high - effect.low) / 2
    return half * math.sqrt(effect.n) / t_quantile(level, effect.n - 1)


def seeds_to_decide(effect: Effect, threshold: float, level: float | None = None) -> SeedsToDecide:
    """n* for a paired effect (see the module's docstring) at its observed mean and spread."""
    level = load_policy().level if level is None else level
    if not effect.has_interval:
        return SeedsToDecide(effect.n, None, reason="one paired seed: no spread to estimate the seeds from; "
                                                    "run a second seed first")
    gap = abs(effect.mean - threshold)
    s = spread(effect, level)
    if gap == 0:
        return SeedsToDecide(effect.n, None, reason="the mean difference equals the threshold: no number of "
                                                    "seeds moves the interval off it")

    def decides(n: int) -> bool:
        return t_quantile(level, n - 1) * s / math.sqrt(n) < gap

    if decides(effect.n):  # already decided at this spread (the caller asks only for inconclusive ones)
        return SeedsToDecide(effect.n, effect.n)
    if not decides(MAX_SEEDS):
        return SeedsToDecide(effect.n, MAX_SEEDS, beyond=True)
    low, high = effect.n, MAX_SEEDS   # decides(low) is False, decides(high) True; the half-width falls with n
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if decides(middle) else (middle, high)
    return SeedsToDecide(effect.n, high)


def seeds_cost(runs: list, more: int) -> dict:
    """What `more` seeds of `runs` cost (one configuration per run a seed adds: a comparison's method and
    baseline), counted as `fedskew.reproduce.cost` counts: training and evaluation PFLOP, GPU-hours at its
    assumed throughput, CPU-hours at its measured rate (None unless every run's model and source has one)."""
    from fedskew.reproduce.cost import ASSUMED_GPU_TFLOPS, CPU_RATES, run_flops

    flops = [run_flops(cfg) for cfg in runs]
    rates = [CPU_RATES.get((cfg.train.model, cfg.dataset_spec["source"])) for cfg in runs]
    cpu_seconds = sum(f / (r * 1e9) for f, r in zip(flops, rates)) if all(rates) else None
    return {"runs": more * len(runs), "pflop": more * sum(flops) / 1e15,
            "gpu_hours": more * sum(flops) / (ASSUMED_GPU_TFLOPS * 1e12) / 3600,
            "cpu_hours": None if cpu_seconds is None else more * cpu_seconds / 3600,
            "gpu_assumption": f"{ASSUMED_GPU_TFLOPS:g} TFLOP/s sustained (assumed)"}


def cost_text(cost: dict) -> str:
    """"8 runs, 0.0012 PFLOP: 3.3e-05 GPU-hours at 10 TFLOP/s (assumed), 0.0071 CPU-hours (measured rate)"."""
    cpu = f", {cost['cpu_hours']:.2g} CPU-hours (measured rate)" if cost["cpu_hours"] is not None else ""
    return (f"{cost['runs']} runs, {cost['pflop']:.2g} PFLOP: {cost['gpu_hours']:.2g} GPU-hours at "
            f"{cost['gpu_assumption']}{cpu}")
