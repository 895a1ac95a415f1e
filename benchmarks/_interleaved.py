"""The timing both round benchmarks share: engine and floor interleaved in one process, ratio of medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def compare(engine_round: Callable[[int], None], floor_round: Callable[[int], None], rounds: int) -> str:
    """Warm both up on round 0, time rounds 1..`rounds` alternately; the report's three lines.

    Interleaving puts both under the same machine noise, so the ratio is what means something.
    """
    engine_round(0), floor_round(0)
    engine_times, floor_times = [], []
    for r in range(1, rounds + 1):
        for fn, times in ((engine_round, engine_times), (floor_round, floor_times)):
            start = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - start)
    engine, floor = statistics.median(engine_times), statistics.median(floor_times)
    ratios = np.array(engine_times) / np.array(floor_times)
    return (f"engine round  median {1000 * engine:8.2f} ms\n"
            f"floor round   median {1000 * floor:8.2f} ms\n"
            f"ratio of medians {engine / floor:.3f} (per-round ratios: median {np.median(ratios):.3f}, "
            f"IQR {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})")
