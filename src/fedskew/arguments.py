"""The numbers a command line gives, checked where they enter: argparse types.

Each refuses what is not a whole or finite number in its range in one line naming the option (argparse adds
the option's name and exits 2), as params.yaml's checks refuse a value of their own: a NaN or negative
threshold, a negative seed, a port or a thread count no machine has. `cores` caps a count above what this
machine gives fedskew, with a line saying so. Importing nothing of fedskew: every command's parser uses it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable

# Seeds as params.yaml takes them (workflow/schemas/params.schema.yaml, `seed`): scikit-learn's split of digits
# seeds numpy's RandomState, which takes 32 bits.
MAX_SEED = 2**32 - 1
# Threads or processes a command starts: as `training.threads` in params.yaml's schema (ATen starts this many;
# more than a machine's cores only slows it down).
MAX_THREADS = 1024
# Rounds: as `rounds` in params.yaml's schema (round_count).
MAX_ROUNDS = 100_000
MAX_PORT = 65535


def _range_text(low: float, high: float, low_open: bool) -> str:
    start = f"above {low:g}" if low_open else f"from {low:g}"
    return start if math.isinf(high) else f"{start} to {high:g}"


def whole(low: int, high: int) -> Callable[[str], int]:
    """A whole number from `low` to `high`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give one from {low} to {high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give a whole number from {low} to {high}")
        return value
    return parse


def number(low: float, high: float = math.inf, low_open: bool = False) -> Callable[[str], float]:
    """A finite number from `low` (above it, with `low_open`) to `high`: never NaN or ±inf, which float() takes."""
    allowed = _range_text(low, high, low_open)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give one {allowed}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number: give one {allowed}")
        if value < low or (low_open and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a number {allowed}")
        return value
    return parse


seed = whole(0, MAX_SEED)
threads = whole(1, MAX_THREADS)
processes = whole(1, MAX_THREADS)
rounds = whole(1, MAX_ROUNDS)
port = whole(1, MAX_PORT)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a container's or a job's
    share), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores(text: str) -> str:
    """Snakemake's --cores as fedskew passes it on: `all`, or a positive integer (0 would make Snakemake wait
    forever for a free core), capped at `usable_cores` with one line on stderr: more would start that many jobs at
    once on fewer cores, each slowed by the others and holding its memory."""
    if text == "all":
        return text
    if not (text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of cores: give a positive integer, or all")
    available = usable_cores()
    if int(text) > available:
        print(f"fedskew: --cores {int(text)} is more than the {available} core(s) this machine gives fedskew; "
              f"using {available}", file=sys.stderr, flush=True)
        return str(available)
    return text
