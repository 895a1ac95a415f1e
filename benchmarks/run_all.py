"""Every speed workload in one command: each one's time beside its floor, and its peak RSS.

Each workload runs in its own process (so peak RSS is its own, read with `os.wait4`) and
prints its own comparison, timed interleaved inside that process:

- cnn:        FedLC's MNIST CNN, 60 000 MNIST-shaped samples, 20 and 200 clients (cnn_round.py)
- synthetic:  Synthetic(1,1), logistic regression, 10 of 100 clients, sequential and vectorised
              (synthetic_round.py)
- synthetic100: the same with all 100 clients per round, where vectorising pays
- execution:  the small CNN, sequential against vectorised rounds, 20/50/100 clients, on
              `--device` (round_time.py; the GPU target, vectorised ≥ 5×, when a GPU is present)
- fixed:      a training job's fixed cost: wall time minus its training loop (fixed_cost.py)
- grid:       FedLC Table 4 at full scale through Snakemake: the paper's 135 runs, `execution:
              auto`, and the suite's `seeds_per_job: all` from params.yaml (table4_grid.py)

    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py            # everything, about 12 min on 2 cores
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --quick    # reduced sizes, a few minutes
    PYTHONPATH=src .venv/bin/python benchmarks/run_all.py --only synthetic grid
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# FedLC Table 4's nine methods (our suite adds FedLC's two other readings of a missing class)
TABLE4_METHODS = ["fedavg", "fedprox", "scaffold", "fednova", "fedadam", "fedyogi", "fedadagrad", "fedrs", "fedlc"]


def workloads(quick: bool, device: str) -> dict[str, list[str]]:
    """Each workload's script and arguments: full size, or reduced with --quick."""
    return {
        "cnn": ["cnn_round.py", "--clients", "20", "200",
                *(["--samples", "6000", "--rounds", "2"] if quick else ["--rounds", "3"])],
        "synthetic": ["synthetic_round.py", "--rounds", "50" if quick else "200"],
        "synthetic100": ["synthetic_round.py", "--per-round", "100", "--rounds", "10" if quick else "30"],
        "execution": ["round_time.py", "--device", device, "--threads", "1", "--execution-clients", "20", "50", "100",
                      *(["--images", "1000", "--rounds", "1"] if quick else ["--images", "5000", "--rounds", "3"])],
        "fixed": ["fixed_cost.py", "--repeats", "1" if quick else "3"],
        "grid": ["table4_grid.py", "--execution", "auto", "--methods", *TABLE4_METHODS,
                 *(["--seeds", "0"] if quick else [])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes: a smoke run, not the figures")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="device of the execution workload")
    parser.add_argument("--only", nargs="+", default=None, help="run only these workloads")
    args = parser.parse_args()
    chosen = workloads(args.quick, args.device)
    unknown = set(args.only or []) - set(chosen)
    if unknown:
        sys.exit(f"unknown workload(s) {sorted(unknown)}; choose from {sorted(chosen)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent / "src"),
                                                                     os.environ.get("PYTHONPATH")]))}
    failed = []
    for name, (script, *script_args) in chosen.items():
        if args.only and name not in args.only:
            continue
        command = [sys.executable, str(HERE / script), *script_args]
        print(f"\n## {name}: {' '.join(['benchmarks/' + script, *script_args])}", flush=True)
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, cwd=HERE.parent)
        _, status, usage = os.wait4(process.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(f"-> {name}: exit {code}, wall {time.perf_counter() - start:.1f} s, "
              f"peak RSS {usage.ru_maxrss / 1024:.0f} MB", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
