"""What the portable CPU kernels cost (fedskew.numerics.cpu_pin, fedskew.numerics.gemm): the same training under three kernel
settings, side by side, with the matrix-product floor of this machine at the workload's own shapes.

Settings (each measurement is a fresh child process: the libraries read their kernel settings once):
- `native`: FEDSKEW_CPU_KERNELS=native, the libraries' own choice (results follow the CPU model);
- `portable-v1`: the portable recipe 1, every product on MKL's `COMPATIBLE` branch (SSE2), kept here
  for the comparison only;
- `portable-v2`: the portable recipe 2 for the workload's model, whether or not the model is on it in
  the project (fedskew.numerics.cpu_pin.RECIPE_1_MODELS: logistic regression stays on recipe 1): the layers'
  products through numpy's OpenBLAS at its Haswell kernels, one thread.

Workloads: runs of the committed suites, seed 0 (`cnn`, `logreg`, `split`: the training loop's own
time, run_training's loop_seconds), and `mlp`: one round of FL-FCR's MNIST protocol with FedAvg
(training.flfcr_mnist: its MLP 784-512-256-128-64-10, 10 clients, 3 local epochs, batch 64, SGD with
momentum 0.9) on 60,000 random 784-vectors split evenly, timed in CPU time.

The GEMM floor: under `portable-v2`, every product a workload computes is recorded (shapes and
layouts); afterwards the child times each distinct product alone with numpy's OpenBLAS on one
thread, in CPU time, and sums count × time. That is the time the workload's products alone need
at this BLAS's one-thread rate: `floor ÷ portable` says how much of the loop is matrix products.
The settings alternate, `--repeats` times; medians are reported. Each child prints a digest of its
history, so the output shows that each portable recipe gives one answer.

    PYTHONPATH=src .venv/bin/python benchmarks/cpu_kernels.py [--repeats 3] [--workloads mlp cnn logreg split]
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
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (suite, dataset, partition, method): runs of the committed suites, seed 0
RUNS = {
    "cnn": ("default", "digits", "q2", "fedavg"),             # the digits CNN, 30 rounds
    "logreg": ("default", "synthetic_1_1", "natural", "fedavg"),  # Synthetic(1,1) logistic regression, 100 rounds
    "split": ("split", "digits", "q2", "scala"),              # the split CNN (SCALA), 100 rounds
}
WORKLOADS = ["mlp", *RUNS]
SETTINGS = ("native", "portable-v1", "portable-v2")


def _record_products() -> Counter:
    """Count every product fedskew.numerics.gemm computes, by its operands' shapes and layouts."""
    from fedskew.numerics import gemm

    calls: Counter = Counter()
    plain_product = gemm.product

    def counted(a, b):
        transposed = (a.ndim == 2 and not a.flags.c_contiguous, b.ndim == 2 and not b.flags.c_contiguous)
        calls[(a.shape, transposed[0], b.shape, transposed[1])] += 1
        return plain_product(a, b)

    gemm.product = counted
    return calls


def _gemm_floor(calls: Counter) -> tuple[float, float]:
    """CPU seconds the recorded products take alone, each timed with numpy's OpenBLAS (one thread),
    and their floating-point operations."""
    import numpy as np

    rng = np.random.default_rng(0)

    def operand(shape, transposed):
        array = rng.standard_normal(shape[::-1] if transposed else shape, dtype=np.float32)
        return array.T if transposed else array

    seconds = flops = 0.0
    for (shape_a, t_a, shape_b, t_b), count in calls.items():
        a, b = operand(shape_a, t_a), operand(shape_b, t_b)
        product = np.matmul(a, b)  # warm
        work = 2 * product.size * shape_a[-1]
        repeats = max(3, int(2e8 / max(work, 1)))
        started = time.process_time()
        for _ in range(repeats):
            np.matmul(a, b)
        seconds += count * (time.process_time() - started) / repeats
        flops += count * work
    return seconds, flops


def _mlp_round() -> dict:
    """One round of FL-FCR's MNIST protocol with FedAvg on random MNIST-sized vectors (see the docstring)."""
    import numpy as np
    import torch

    from fedskew.config import load_params
    from fedskew.data.registry import DatasetInfo
    from fedskew.engine.sampling import client_seed
    from fedskew.engine.rounds import federated_round
    from fedskew.fl import ALGORITHMS
    from fedskew.fl.base import ClientContext, TrainingSettings
    from fedskew.models import build_model

    protocol = load_params(ROOT / "params.yaml").raw["training"]["flfcr_mnist"]
    info, clients, samples = DatasetInfo((784,), 10, False, False), 10, 60_000
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(samples, 784, generator=generator)
    y = torch.randint(0, 10, (samples,), generator=generator)
    parts = [torch.as_tensor(p) for p in np.array_split(np.random.default_rng(0).permutation(samples), clients)]
    settings = TrainingSettings(local_epochs=protocol["local_epochs"], batch_size=protocol["batch_size"],
                                lr=protocol["lr"], momentum=protocol["momentum"], weight_decay=0.0)
    torch.manual_seed(0)
    model = build_model(protocol["model"], info)
    algorithm = ALGORITHMS["fedavg"](settings, clients, 10)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    contexts = [ClientContext(k, 1, parts[k], torch.bincount(y[parts[k]], minlength=10),
                              torch.Generator().manual_seed(client_seed(0, 1, k)), client_seed(0, 1, k))
                for k in range(clients)]
    started = time.process_time()
    result = federated_round(algorithm, model, state, contexts, x, y, "bench")
    seconds = time.process_time() - started
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in result.global_state.values())).hexdigest()[:12]
    return {"seconds": seconds, "digest": digest, "final_acc": float("nan")}


def _training_run(workload: str) -> dict:

    from fedskew.config import load_params
    from fedskew.data.registry import prepare
    from fedskew.engine.simulation import run_training
    from fedskew.job import prepare_partition

    suite, dataset, partition, method = RUNS[workload]
    params = load_params(ROOT / "params.yaml")
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        prepare(dataset, params.dataset_spec(dataset))
        prepare_partition(params, dataset, partition, 0)
        result = run_training(params.run(suite, dataset, partition, method, 0))
    digest = hashlib.sha256(json.dumps(result.history, sort_keys=True, default=repr).encode()).hexdigest()[:12]
    return {"seconds": result.loop_seconds, "digest": digest, "final_acc": result.final["final_acc"]}


def child(workload: str, setting: str) -> None:
    """One measurement, under the kernels FEDSKEW_CPU_KERNELS names (`setting` picks the recipe)."""
    from fedskew.numerics import cpu_pin

    cpu_pin.apply()  # before torch computes anything, as `python -m fedskew` does
    import torch

    torch.set_num_threads(1)
    if setting.startswith("portable-v"):
        recipe = int(setting.removeprefix("portable-v"))
        cpu_pin.kernel_recipe = lambda model: recipe  # the workload's model on that recipe
    calls = _record_products() if setting == "portable-v2" else Counter()
    cpu_pin.configure_torch()
    got = _mlp_round() if workload == "mlp" else _training_run(workload)
    if calls:
        got["floor_seconds"], got["floor_flops"] = _gemm_floor(calls)
    print(json.dumps(got))


def measure(workload: str, setting: str) -> dict:
    env = {**os.environ, "FEDSKEW_CPU_KERNELS": "native" if setting == "native" else "portable",
           "FEDSKEW_TRACKING": "0", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE"):
        env.pop(name, None)  # the child decides, from FEDSKEW_CPU_KERNELS alone
    done = subprocess.run([sys.executable, __file__, "--child", workload, setting], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{workload} / {setting} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from fedskew.provenance import cpu_model

    print(f"CPU: {cpu_model()}; {args.repeats} interleaved repeats of each setting; one thread; "
          f"seconds are medians (mlp: CPU seconds of one round; the others: the training loop's wall seconds)")
    print(f"{'workload':8s} {'native':>8s} {'portable-v1':>12s} {'portable-v2':>12s} {'v1÷native':>10s} "
          f"{'v2÷native':>10s} {'GEMM floor':>11s} {'floor÷v2':>9s} {'GFLOP/s':>8s}  digests")
    for workload in args.workloads:
        results: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
        for _ in range(args.repeats):
            for setting in SETTINGS:
                results[setting].append(measure(workload, setting))
        median = {s: statistics.median(r["seconds"] for r in results[s]) for s in SETTINGS}
        floor = statistics.median(r["floor_seconds"] for r in results["portable-v2"])
        flops = results["portable-v2"][0]["floor_flops"]
        digests = "; ".join(f"{s} {', '.join(sorted({r['digest'] for r in results[s]}))}" for s in SETTINGS)
        print(f"{workload:8s} {median['native']:8.2f} {median['portable-v1']:12.2f} {median['portable-v2']:12.2f} "
              f"{median['portable-v1'] / median['native']:10.2f} {median['portable-v2'] / median['native']:10.2f} "
              f"{floor:11.2f} {floor / median['portable-v2']:9.2f} {flops / floor / 1e9:8.1f}  {digests}", flush=True)


if __name__ == "__main__":
    main()
