"""FedLC Table 4 at full scale through Snakemake: wall time against its compute floor.

Builds the suite `fedlc_t4_synthetic` of params.yaml (3 Synthetic settings x every method
x 5 seeds x 300 rounds) from nothing in a fresh copy of the project: data generation,
partitioning, every training job with MLflow tracking, as `snakemake --cores N` runs it.
Reports the wall time, the CPU time and peak RSS of the whole process tree, and the floor:
the training loops' own time (each job logs `timing: R rounds in X s`) divided by the
cores. The rest is per-job fixed cost (interpreter, imports, loading, tracking) and
Snakemake's own.

    PYTHONPATH=src .venv/bin/python benchmarks/table4_grid.py                 # the full grid
    PYTHONPATH=src .venv/bin/python benchmarks/table4_grid.py --seeds 0 --no-tracking
    PYTHONPATH=src .venv/bin/python benchmarks/table4_grid.py --execution auto
    PYTHONPATH=src .venv/bin/python benchmarks/table4_grid.py --execution auto --seeds-per-job all
    PYTHONPATH=src .venv/bin/python benchmarks/table4_grid.py --execution auto --seeds-per-job all \
        --methods fedavg fedprox scaffold fednova fedadam fedyogi fedadagrad fedrs fedlc   # the paper's 135 runs

Takes minutes (the full grid about 10-15 on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SUITE = "fedlc_t4_synthetic"
TABLE_METHODS = ["fedavg", "fedprox", "scaffold", "fednova", "fedadam", "fedyogi", "fedadagrad", "fedrs", "fedlc"]
TIMING = re.compile(r"timing: (\d+) rounds in ([0-9.]+) s")


def project(folder: Path, seeds: list[int] | None, execution: str | None, seeds_per_job: str | None = None,
            methods: list[str] | None = None) -> Path:
    """A checkout-like copy running only the Table 4 suite (optionally fewer seeds or methods, another
    execution, or another number of seeds per training job)."""
    for item in ("src", "workflow"):
        shutil.copytree(REPO / item, folder / item, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["run"]["suites"] = [SUITE]
    if seeds is not None:
        params["suites"][SUITE]["seeds"] = seeds
    if methods is not None:
        params["suites"][SUITE]["methods"] = methods
    if execution is not None:
        params["training"][SUITE] = {**params["training"][SUITE], "execution": execution}
    if seeds_per_job is not None:
        params["suites"][SUITE]["seeds_per_job"] = 1 if seeds_per_job == "1" else seeds_per_job
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the suite's five")
    parser.add_argument("--execution", choices=["sequential", "vectorised", "auto"], default=None,
                        help="override training.execution (default: params.yaml's)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="default: the suite's eleven; --methods " + " ".join(TABLE_METHODS) + " is the "
                             "paper's table (135 runs), without FedLC's two other readings of a missing class")
    parser.add_argument("--seeds-per-job", choices=["1", "all"], default=None,
                        help="override the suite's seeds_per_job (default: params.yaml's)")
    parser.add_argument("--no-tracking", action="store_true", help="FEDSKEW_TRACKING=0 (to see tracking's share)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fedskew-t4-") as tmp:
        root = project(Path(tmp), args.seeds, args.execution, args.seeds_per_job, args.methods)
        env = {**os.environ, "PYTHONPATH": str(root / "src"),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        env.pop("MLFLOW_TRACKING_URI", None)
        if args.no_tracking:
            env["FEDSKEW_TRACKING"] = "0"
        command = [str(Path(sys.executable).parent / "snakemake"), f"results/runs/{SUITE}/TRAINED",
                   "--cores", str(args.cores), "--quiet", "all"]
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # this process tree's CPU time and peak RSS
        wall = time.perf_counter() - start
        output = process.stdout.read().decode(errors="replace")
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"snakemake failed:\n{output[-4000:]}")
        logs = list((root / "logs/train").rglob("*.log"))
        loops = [(int(m[1]), float(m[2])) for log in logs for m in TIMING.finditer(log.read_text())]
        runs = len(loops)
        loop_total = sum(seconds for _, seconds in loops)
        floor = loop_total / args.cores
        print(f"{SUITE}: {runs} runs ({sum(r for r, _ in loops)} rounds) in {len(logs)} training jobs, "
              f"--cores {args.cores}, execution {args.execution or 'as params.yaml'}, seeds per job "
              f"{args.seeds_per_job or 'as params.yaml'}, tracking {'off' if args.no_tracking else 'on'}")
        print(f"wall {wall:.1f} s ({wall / 60:.2f} min); CPU {usage.ru_utime + usage.ru_stime:.1f} s; "
              f"peak RSS {usage.ru_maxrss / 1024:.0f} MB")
        print(f"training loops {loop_total:.1f} s in total, {loop_total / max(runs, 1):.2f} s per run; "
              f"floor (loops / cores) {floor:.1f} s; wall / floor {wall / floor:.2f}")
        print(f"per run beyond its loop: {(wall * args.cores - loop_total) / max(runs, 1):.2f} core-s "
              "(interpreter, imports, loading, tracking, Snakemake)")


if __name__ == "__main__":
    main()
