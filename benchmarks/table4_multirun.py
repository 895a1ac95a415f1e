"""What FedLC Table 4 would take with several runs per process: evidence for the grid target
(the Table 4 grid of 135 runs × 300 rounds in at most 5 minutes on two cores).

`table4_grid.py` measures the grid as the workflow runs it, one process per run, so each of
the 165 runs pays torch's import and, with tracking, its own MLflow worker. This script
measures what a multi-run job would save, without changing the workflow: in a fresh copy of
the project (as `table4_grid.py`) Snakemake builds the data and partitions, then `--cores`
worker processes each train their share of the suite's runs one after another in one
interpreter, through `fedskew.job.train_seeds` (the same run files, checkpoints and tracking as
`fedskew train`). Torch is imported once per worker; tracking, when on, still starts one
MLflow worker per run (a multi-run job would share one), so the tracked figure is an upper
bound of what sharing processes gives.

    PYTHONPATH=src .venv/bin/python benchmarks/table4_multirun.py --no-tracking
    PYTHONPATH=src .venv/bin/python benchmarks/table4_multirun.py --execution auto
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# benchmarks/ is on the path when this runs as a script
from table4_grid import SUITE, TIMING, project


def worker(root: Path, index: int, workers: int) -> None:
    """Train runs index, index + workers, ... of the suite in this one process."""
    os.chdir(root)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from fedskew.config import load_params
    from fedskew.job import train_seeds

    params = load_params(Path("params.yaml"))
    for cfg in params.suite_runs(SUITE)[index::workers]:
        train_seeds(params, cfg.suite, cfg.dataset, cfg.partition, cfg.method, [cfg.seed], threads=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="worker processes")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the suite's five")
    parser.add_argument("--execution", choices=["sequential", "vectorised", "auto"], default=None,
                        help="override training.execution (default: params.yaml's)")
    parser.add_argument("--no-tracking", action="store_true", help="FEDSKEW_TRACKING=0")
    parser.add_argument("--worker", type=int, nargs=2, metavar=("INDEX", "OF"), help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.root, *args.worker)
        return

    with tempfile.TemporaryDirectory(prefix="fedskew-t4-multirun-") as tmp:
        root = project(Path(tmp), args.seeds, args.execution)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(Path(__file__).parent)]),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        env.pop("MLFLOW_TRACKING_URI", None)
        if args.no_tracking:
            env["FEDSKEW_TRACKING"] = "0"

        sys.path.insert(0, str(root / "src"))
        from fedskew import paths
        from fedskew.config import load_params

        runs = load_params(root / "params.yaml").suite_runs(SUITE)
        partitions = sorted({str(cfg.path(paths.PARTITION)) for cfg in runs})
        start = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "snakemake"), *partitions, "--cores", str(args.cores),
                        "--quiet", "all"], cwd=root, env=env, check=True, capture_output=True)
        prepare = time.perf_counter() - start

        start = time.perf_counter()
        jobs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), str(args.cores), "--root", str(root)],
                                 cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for i in range(args.cores)]
        cpu, peak, logs = 0.0, 0, []
        for job in jobs:
            logs.append(job.stderr.read())
            _, status, usage = os.wait4(job.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"a worker failed:\n{logs[-1][-4000:]}")
            cpu += usage.ru_utime + usage.ru_stime
            peak = max(peak, usage.ru_maxrss)
        train = time.perf_counter() - start
        loops = [float(m[2]) for log in logs for m in TIMING.finditer(log)]
        if len(loops) != len(runs):
            sys.exit(f"{len(loops)} of {len(runs)} runs reported their loop time")
        loop_total = sum(loops)
        print(f"{SUITE}: {len(runs)} runs in {args.cores} processes, execution {args.execution or 'as params.yaml'}, "
              f"tracking {'off' if args.no_tracking else 'on (one MLflow worker per run)'}")
        print(f"data and partitions (Snakemake) {prepare:.1f} s; training {train:.1f} s; "
              f"in all {(prepare + train) / 60:.2f} min")
        print(f"training: CPU {cpu:.1f} s (workers and their children), peak RSS {peak / 1024:.0f} MB; "
              f"loops {loop_total:.1f} s ({loop_total / len(runs):.2f} s per run), "
              f"beyond the loops {(train * args.cores - loop_total) / len(runs):.2f} core-s per run")


if __name__ == "__main__":
    main()
