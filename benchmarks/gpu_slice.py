"""Throughput of the packed runner on a slice of SCALA's Fashion-MNIST runs, variant by variant, in one run.

Each variant trains the same slice: the first `--rounds` rounds of every selected run
(default: SCALA, FedAvg and SplitFedV1 on SCALA's four Fashion-MNIST partitions, seed 0)
through `python -m fedskew packed run --max-rounds`, in a scratch copy of the project
whose params.yaml sets the variant's `training.execution` and `training.precision` for
scala_table. A variant is (worker processes, execution, precision); the first is the
baseline, today's single-run path: one process, sequential clients, fp32.

For each variant it prints the piece's wall time, rounds, estimated model FLOPs
(fedskew.reproduce.cost), sustained TFLOP/s, the model-FLOPs utilisation against the GPU's
dense peak for that precision, the rate in whole 500-round runs per device-hour, and the
ratio to the baseline, all measured in this one process on this one machine.

    PYTHONPATH=src python3 benchmarks/gpu_slice.py --rounds 20
    PYTHONPATH=src python3 benchmarks/gpu_slice.py --variants 1:sequential:fp32 8:auto:bf16 --methods scala

Wall time includes each worker's start (imports, CUDA context, data onto the device) and the
checkpoint written when a run pauses: with few rounds per run they weigh more than in a real
piece of 500-round runs, so the slice understates the rate of long pieces (the closing line
says how much of the wall time the runs themselves took).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VARIANTS = ["1:sequential:fp32", "4:sequential:fp32", "8:sequential:fp32", "1:auto:fp32",
                    "8:auto:fp32", "8:auto:tf32", "8:auto:bf16"]


def scratch_project(root: Path, execution: str, precision: str, suite: str) -> Path:
    """A project folder sharing the repository's code, data and partitions, with the variant's settings."""
    root.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["training"][suite].update(execution=execution, precision=precision)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for shared in ("data",):  # decoded datasets and partitions: the same for every variant
        (REPO / shared).mkdir(exist_ok=True)
        if not (root / shared).exists():
            (root / shared).symlink_to(REPO / shared)
    return root


def run_variant(project: Path, workers: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "fedskew", "packed", "run", "--suite", args.suite, "--dataset", args.dataset,
               "--method", *args.methods, "--seed", *map(str, args.seeds), "--workers", str(workers),
               "--max-rounds", str(args.rounds), "--time-limit", str(args.time_limit)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDSKEW_TRACKING": "0"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"variant in {project} failed (exit {done.returncode})")
    lines = [json.loads(line) for line in (project / "logs/packed/pieces.jsonl").read_text().splitlines()]
    piece = [line for line in lines if line["event"] == "piece"][-1]
    runs = [line for line in lines if line["event"] != "piece"]
    piece["command_wall_s"] = wall
    piece["run_seconds"] = sum(r["seconds"] for r in runs)
    return piece


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="scala_table")
    parser.add_argument("--dataset", default="fashionmnist")
    parser.add_argument("--methods", nargs="+", default=["scala", "fedavg", "splitfed_v1"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of every run in a variant's slice")
    parser.add_argument("--time-limit", type=float, default=540.0, dest="time_limit")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="workers:execution:precision")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/fedskew-gpu-slice"))
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()

    # Data and partitions once, in the repository, before any variant is timed.
    prepare = [sys.executable, "-m", "fedskew", "packed", "run", "--suite", args.suite, "--dataset", args.dataset,
               "--method", *args.methods, "--seed", *map(str, args.seeds), "--prepare-only"]
    subprocess.run(prepare, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True,
                   capture_output=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    rows = []
    for variant in args.variants:
        workers, execution, precision = variant.split(":")
        project = scratch_project(args.scratch / variant.replace(":", "-"), execution, precision, args.suite)
        piece = run_variant(project, int(workers), args)
        rows.append({"variant": variant, **piece})
        base = rows[0]
        rate = piece["rounds"] / 500 / piece["wall_s"] * 3600
        base_rate = base["rounds"] / 500 / base["wall_s"] * 3600
        mfu = f"{piece['mfu']:.3f}" if piece["mfu"] is not None else "n/a"
        print(f"{variant:18s} wall {piece['wall_s']:7.1f} s  rounds {piece['rounds']:5d}  {piece['pflop']:8.3f} PFLOP  "
              f"{piece['tflops']:7.2f} TFLOP/s  MFU {mfu}  {rate:6.1f} runs/h  x{rate / base_rate:5.2f}  "
              f"(runs {piece['run_seconds'] / max(piece['wall_s'] * int(workers), 1e-9):.0%} of worker time)",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
