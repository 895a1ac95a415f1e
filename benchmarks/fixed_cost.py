"""What does a training job cost beyond its training loop (the target: at most 3 s of wall time)?

In a temporary project (the code of --src, this checkout's workflow/ and params.yaml), prepares
Synthetic(1,1) / natural, then runs the job

    python -m fedskew train --suite fedlc_t4_synthetic --dataset synthetic_1_1 --partition natural
                            --method fedavg --seed 0

in three ways, interleaved, --repeats times each, all 300 rounds every time (the run's results/runs
and results/checkpoints are deleted first):

* tracking into a new store: no mlflow.db yet (the first job of a project creates it);
* tracking into an existing store: a copy of a store that holds the suite's experiment and one
  other run (FedProx, same setting), as every later job of a suite finds it;
* FEDSKEW_TRACKING=0.

Measured from outside: wall time (perf_counter around the job), CPU time (user + sys of the job
and every process it waited for, the tracking worker included), the loop time the job logs
(`timing: N rounds in X s`) and fixed cost = wall - loop; medians over the repeats. A wait for
the tracker inside the loop counts as loop time, so the wall time over the untracked job's is
given too: what tracking costs in all. Peak RSS is given for the largest single process (wait4)
and for the job's processes together (sampled every 0.1 s, so a lower bound).

    .venv/bin/python benchmarks/fixed_cost.py [--repeats 3] [--src PATH]

--src points at a `src` folder (default: this checkout's), e.g. a copy of the code before a change.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = {"suite": "fedlc_t4_synthetic", "dataset": "synthetic_1_1", "partition": "natural", "method": "fedavg",
       "seed": "0"}
MODES = ("tracking, new store", "tracking, existing store", "no tracking")
TIMING = re.compile(r"timing: (\d+) rounds in ([0-9.]+) s")


def _train_args(**run: str) -> list[str]:
    return ["train", *(arg for key, value in run.items() for arg in (f"--{key}", value))]


def _descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for child in map(int, children):
        found += [child, *_descendants(child)]
    return found


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_job(root: Path, env: dict[str, str], args: list[str]) -> dict[str, float]:
    """One job: wall, CPU (user + sys of its process tree), its logged loop time, peak RSS in MiB."""
    log = root / "job.log"
    with open(log, "w") as stderr:
        started = time.perf_counter()
        job = subprocess.Popen([sys.executable, "-m", "fedskew", *args], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=stderr)
        peak_total = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak_total
            while not done.wait(0.1):
                peak_total = max(peak_total, sum(map(_rss_kib, [job.pid, *_descendants(job.pid)])))

        sampler = threading.Thread(target=sample)
        sampler.start()
        _, status, usage = os.wait4(job.pid, 0)  # the usage of this job's tree alone
        wall = time.perf_counter() - started
        job.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
    text = log.read_text()
    if job.returncode != 0:
        raise SystemExit(f"`fedskew {' '.join(args)}` failed ({job.returncode}):\n{text[-3000:]}")
    timing = TIMING.findall(text)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "loop": float(timing[-1][1]) if timing else 0.0,
            "rss_max": usage.ru_maxrss / 1024, "rss_total": peak_total / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the code to time (default: this checkout's)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fixed_cost-") as folder:
        root = Path(folder)
        shutil.copytree(args.src, root / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "workflow", root / "workflow")  # the params schema is found next to src/
        shutil.copy(REPO / "params.yaml", root / "params.yaml")
        env = {**os.environ, "PYTHONPATH": str(root / "src"), "FEDSKEW_TRACKING": "1"}
        for name in ("MLFLOW_TRACKING_URI", "FEDSKEW_TRACKING_FLUSH_S"):
            env.pop(name, None)
        for prepare in (["download", "--dataset", RUN["dataset"]],
                        ["partition", "--dataset", RUN["dataset"], "--partition", RUN["partition"], "--seed", "0"]):
            subprocess.run([sys.executable, "-m", "fedskew", *prepare], cwd=root, env=env, check=True,
                           capture_output=True)
        train = _train_args(**RUN)

        def fresh_results() -> None:
            for results in ("results/runs", "results/checkpoints"):
                shutil.rmtree(root / results, ignore_errors=True)

        def fresh_store() -> None:
            for path in root.glob("mlflow.db*"):
                path.unlink()
            shutil.rmtree(root / "mlartifacts", ignore_errors=True)

        # The existing store's template: the suite's experiment with another run in it. Training it
        # also compiles the copied code, so no timed job pays for that.
        fresh_store()
        run_job(root, env, _train_args(**{**RUN, "method": "fedprox"}))
        template = root / "template.db"
        shutil.copy(root / "mlflow.db", template)

        def existing_store() -> None:
            fresh_store()
            shutil.copy(template, root / "mlflow.db")

        setups = {"tracking, new store": fresh_store, "tracking, existing store": existing_store,
                  "no tracking": fresh_store}
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                setups[mode]()
                fresh_results()
                results[mode].append(run_job(root, {**env, "FEDSKEW_TRACKING": "0" if mode == "no tracking" else "1"},
                                             train))

    print(f"code: {args.src.resolve()}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"job: PYTHONPATH=src {Path(sys.executable).name} -m fedskew {' '.join(train)}  (300 rounds each time; "
          f"tracking to sqlite:///<project>/mlflow.db, FEDSKEW_TRACKING_FLUSH_S unset = 10 s)")
    print(f"medians of {args.repeats} interleaved repeats; fixed cost = wall - loop; "
          "peak RSS: largest process / job's processes together (sampled)\n")
    print("| mode | wall | CPU (all processes) | loop | fixed cost (min-max) | wall - untracked wall | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    untracked = statistics.median(run["wall"] for run in results["no tracking"])
    for mode, runs in results.items():
        median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        fixed = [run["wall"] - run["loop"] for run in runs]
        print(f"| {mode} | {median['wall']:.2f} s | {median['cpu']:.2f} s | {median['loop']:.2f} s | "
              f"**{statistics.median(fixed):.2f} s** ({min(fixed):.2f}-{max(fixed):.2f}) | "
              f"{median['wall'] - untracked:+.2f} s | {median['rss_max']:.0f} / {median['rss_total']:.0f} MiB |")


if __name__ == "__main__":
    main()
