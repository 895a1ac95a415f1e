"""What the portable CPU kernels cost (fedskew.cpu_pin): the same training, `native` against `portable`.

The libraries read their kernel settings once per process, so each measurement is a fresh child
process; the two settings alternate, `--repeats` times, and the ratio of the medians of the training
loop's own time (run_training's loop_seconds: no interpreter start, no data preparation) is reported.
Each child also prints a digest of its history, so the output shows that `portable` gives one answer
and what `native` gives on this CPU. Offline: the default suite's two settings and the split suite's.

    PYTHONPATH=src .venv/bin/python benchmarks/cpu_kernels.py [--repeats 5] [--workloads cnn logreg split]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (suite, dataset, partition, method): runs of the committed suites, seed 0
WORKLOADS = {
    "cnn": ("default", "digits", "q2", "fedavg"),             # the digits CNN, 30 rounds
    "logreg": ("default", "synthetic_1_1", "natural", "fedavg"),  # Synthetic(1,1) logistic regression, 100 rounds
    "split": ("split", "digits", "q2", "scala"),              # the split CNN (SCALA), 100 rounds
}


def child(workload: str) -> None:
    """One training run in a scratch project, under the kernels FEDSKEW_CPU_KERNELS names."""
    from fedskew import cpu_pin

    cpu_pin.apply()  # before torch computes anything, as `python -m fedskew` does
    import argparse as _argparse

    from fedskew.cli import cmd_partition
    from fedskew.config import load_params
    from fedskew.data.registry import prepare
    from fedskew.engine.simulation import run_training

    suite, dataset, partition, method = WORKLOADS[workload]
    params = load_params(ROOT / "params.yaml")
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        prepare(dataset, params.dataset_spec(dataset))
        cmd_partition(params, _argparse.Namespace(dataset=dataset, partition=partition, seed=0))
        result = run_training(params.run(suite, dataset, partition, method, 0))
    digest = hashlib.sha256(json.dumps(result.history, sort_keys=True, default=repr).encode()).hexdigest()[:12]
    print(json.dumps({"seconds": result.loop_seconds, "digest": digest,
                      "final_acc": result.final["final_acc"]}))


def measure(workload: str, kernels: str) -> dict:
    env = {**os.environ, "FEDSKEW_CPU_KERNELS": kernels, "FEDSKEW_TRACKING": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE"):
        env.pop(name, None)  # the child decides, from FEDSKEW_CPU_KERNELS alone
    done = subprocess.run([sys.executable, __file__, "--child", workload], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--child", choices=list(WORKLOADS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    from fedskew.provenance import cpu_model

    print(f"CPU: {cpu_model()}; {args.repeats} interleaved repeats of each setting; training loop seconds (median)")
    print(f"{'workload':8s} {'native s':>9s} {'portable s':>11s} {'portable/native':>16s}  history digests")
    for workload in args.workloads:
        times: dict[str, list[float]] = {"native": [], "portable": []}
        digests: dict[str, set[str]] = {"native": set(), "portable": set()}
        for _ in range(args.repeats):
            for kernels in ("native", "portable"):
                got = measure(workload, kernels)
                times[kernels].append(got["seconds"])
                digests[kernels].add(f"{got['digest']} ({100 * got['final_acc']:.2f} %)")
        native, portable = (statistics.median(times[k]) for k in ("native", "portable"))
        print(f"{workload:8s} {native:9.2f} {portable:11.2f} {portable / native:16.2f}  "
              f"native {', '.join(sorted(digests['native']))}; portable {', '.join(sorted(digests['portable']))}")


if __name__ == "__main__":
    main()
