"""The timing the round benchmarks share: candidates and floor interleaved in one process, ratios of medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

Round = Callable[[int], None]


def compare(engine_round: Round, floor_round: Round, rounds: int) -> str:
    """One engine against its floor: the report's three lines."""
    return compare_many({"engine": engine_round}, floor_round, rounds)


def compare_many(candidates: dict[str, Round], floor_round: Round, rounds: int) -> str:
    """Warm everything up on round 0, then time rounds 1..`rounds`, each round of every candidate
    and of the floor back to back; each candidate's median beside the floor's, and their ratio.

    Interleaving puts all of them under the same machine noise, so the ratios are what mean something.
    """
    for fn in (*candidates.values(), floor_round):
        fn(0)
    times: dict[str, list[float]] = {name: [] for name in (*candidates, "floor")}
    for r in range(1, rounds + 1):
        for name, fn in (*candidates.items(), ("floor", floor_round)):
            start = time.perf_counter()
            fn(r)
            times[name].append(time.perf_counter() - start)
    floor = statistics.median(times["floor"])
    width = max(len(name) for name in times) + len(" round")
    lines = [f"{'floor round':<{width}}  median {1000 * floor:8.2f} ms"]
    for name in candidates:
        median = statistics.median(times[name])
        ratios = np.array(times[name]) / np.array(times["floor"])
        lines.append(f"{name + ' round':<{width}}  median {1000 * median:8.2f} ms   ratio of medians "
                     f"{median / floor:.3f} (per-round ratios: median {np.median(ratios):.3f}, "
                     f"IQR {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})")
    return "\n".join(lines)
