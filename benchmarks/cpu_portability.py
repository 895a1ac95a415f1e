"""Do fedskew's CPU results stay the same on another x86-64 CPU? Checked under QEMU's CPU models.

The same computation runs on this machine's CPU and under `qemu-x86_64 -cpu <model>` (Debian's
qemu-user: it runs this machine's Python and torch, emulating the chosen CPU's instructions and what
its CPUID reports), once with FEDSKEW_CPU_KERNELS=portable and once with =native:

- `steps`: 20 SGD steps on a fixed batch, then a forward pass, of the digits CNN, the digits MLP,
  FL-FCR's MLP on MNIST-sized inputs (784 → 512 → 256 → 128 → 64 → 10) and the split digits CNN
  (client part to the cut, server part after it, the activations' gradient sent back, as a split
  method trains);
- `train`: the first `--rounds` rounds of the default suite's FedAvg on digits Q(2), seed 2, with the
  engine, its evaluation included;
- `ops`: single operations on 5,000 fixed random numbers (float32 and float64) that the methods use:
  fedskew's square root (`fedskew.numerics.exact_math`), exp, log, tanh, rsqrt, division, variance, norm, a matrix
  product, and 20 steps of fedskew's Adam on FL-FCR's MLP. torch's own `sqrt` is shown beside them and
  left out of the comparison: it is not correctly rounded under the pin and differs between CPUs with
  and without AVX-512, which is why fedskew does not use it on CPU (docs/reliability.md).

`--recipe` puts every model on that portable recipe (fedskew.numerics.cpu_pin.RECIPES; default: the newest),
whether or not the model is on it in the project (cpu_pin.RECIPE_1_MODELS: logistic regression stays on
recipe 1).

Each prints a digest of the bits (parameters and outputs, or the whole history). Under `portable`
every digest of a row must be the same; under `native` they may differ, and on this machine's CPU
did (benchmarks/README.md). QEMU emulates about a hundred times slower than the CPU runs: a `train`
row takes minutes per model. Default models: Intel Haswell (AVX2, no AVX-512), Intel
Skylake-Server (AVX-512), AMD EPYC-Rome (AVX2, an AMD CPUID, which MKL treats apart).

    PYTHONPATH=src .venv/bin/python benchmarks/cpu_portability.py [--cpus Haswell-v4 EPYC-Rome] \\
        [--checks steps train ops] [--kernels portable native] [--rounds 3] [--recipe 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "host"


def _digest(*chunks: bytes) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()[:12]


def _sgd_steps(model, x, y, view=None) -> None:
    """20 SGD steps on the first 32 rows; with a split `view`, as a split method trains: the client's part
    to the cut, its activations sent to the server's part, their gradient sent back."""
    import torch.nn.functional as F

    from fedskew.numerics.sgd import SGD

    optimiser = SGD(model.parameters(), lr=0.05)
    for _ in range(20):
        optimiser.zero_grad()
        if view is None:
            F.cross_entropy(model(x[:32]), y[:32]).backward()
        else:
            activations = view.client(x[:32])
            sent = activations.detach().requires_grad_(True)
            F.cross_entropy(view.server(sent), y[:32]).backward()  # the server's part, and ∂activations
            activations.backward(sent.grad)                           # the client's part
        optimiser.step()


def steps_check() -> str:
    import torch

    from fedskew.catalog import dataset_info
    from fedskew.data.registry import DatasetInfo
    from fedskew.models import build_model
    from fedskew.models.split import split_model

    torch.set_num_threads(1)
    digits = dataset_info({"source": "digits", "test_fraction": 0.2, "seed": 0})
    mnist_vectors = DatasetInfo((784,), 10, False, False)
    digests = []
    for label, name, info in (("cnn", "cnn", digits), ("mlp", "mlp", digits),
                              ("flfcr_mlp", "flfcr_mlp", mnist_vectors), ("split cnn", "cnn", digits)):
        torch.manual_seed(0)
        model = build_model(name, info)
        generator = torch.Generator().manual_seed(1)
        x, y = torch.randn(64, *info.input_shape, generator=generator), torch.randint(0, 10, (64,), generator=generator)
        view = split_model(model, model.default_split) if label.startswith("split") else None
        _sgd_steps(model, x, y, view)
        with torch.no_grad():
            out = model(x).softmax(-1)
        digests.append(f"{label} " + _digest(*(p.detach().numpy().tobytes() for p in model.state_dict().values()),
                                             out.numpy().tobytes()))
    return ", ".join(digests)


def train_check(rounds: int) -> str:
    import dataclasses

    from fedskew.config import load_params
    from fedskew.data.registry import prepare
    from fedskew.engine.simulation import run_training
    from fedskew.job import prepare_partition

    params = load_params(ROOT / "params.yaml")
    scratch = tempfile.mkdtemp()
    try:
        os.chdir(scratch)
        prepare("digits", params.dataset_spec("digits"))
        prepare_partition(params, "digits", "q2", 2)
        cfg = params.run("default", "digits", "q2", "fedavg", 2)
        cfg = dataclasses.replace(cfg, training={**cfg.training, "rounds": rounds})
        result = run_training(cfg)
    finally:
        os.chdir(ROOT)
        shutil.rmtree(scratch, ignore_errors=True)
    return (f"history {_digest(json.dumps(result.history, sort_keys=True, default=repr).encode())}, "
            f"test loss {result.history[-1]['test_loss']!r}")


def ops_check() -> tuple[str, str]:
    """Digests of single operations (compared between CPUs), and of torch.sqrt (shown, not compared)."""
    import torch
    import torch.nn.functional as F

    from fedskew.data.registry import DatasetInfo
    from fedskew.models import build_model
    from fedskew.numerics import exact_math
    from fedskew.numerics.adam import Adam

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    digests, shown = [], []
    for dtype in (torch.float32, torch.float64):
        x = torch.rand(5000, generator=generator, dtype=dtype) * 10 + 0.01
        y = torch.randn(5000, generator=generator, dtype=dtype)
        ops = {"sqrt": exact_math.sqrt(x), "exp": torch.exp(y), "log": torch.log(x), "tanh": torch.tanh(y),
               "rsqrt": torch.rsqrt(x), "div": y / x, "var": x.reshape(50, 100).var(dim=0),
               "norm": torch.linalg.vector_norm(y.reshape(50, 100), dim=1),
               "mm": x.reshape(50, 100) @ y.reshape(100, 50)}
        name = str(dtype).removeprefix("torch.")
        digests += [f"{op} {name} {_digest(out.numpy().tobytes())}" for op, out in ops.items()]
        shown.append(f"torch.sqrt {name} {_digest(torch.sqrt(x).numpy().tobytes())}")
    torch.manual_seed(0)
    model = build_model("flfcr_mlp", DatasetInfo((784,), 10, False, False))
    inputs, labels = torch.randn(32, 784, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    optimiser = Adam(model.parameters(), lr=1e-3)
    for _ in range(20):
        optimiser.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimiser.step()
    digests.append("adam flfcr_mlp " + _digest(*(p.detach().numpy().tobytes() for p in model.state_dict().values())))
    return ", ".join(digests), ", ".join(shown)


def child(check: str, rounds: int, recipe: int) -> None:
    from fedskew.numerics import cpu_pin

    cpu_pin.apply()  # as `python -m fedskew` does, before torch computes anything
    import torch

    cpu_pin.kernel_recipe = lambda model: 1 if model == "logreg" else recipe

    cpu_pin.configure_torch()
    shown = ""
    if check == "ops":
        text, shown = ops_check()
    else:
        text = steps_check() if check == "steps" else train_check(rounds)
    print(json.dumps({"capability": str(torch.backends.cpu.get_cpu_capability()), "result": text, "shown": shown}))


def measure(cpu: str, check: str, kernels: str, rounds: int, recipe: int) -> dict:
    env = {**os.environ, "FEDSKEW_CPU_KERNELS": kernels, "FEDSKEW_TRACKING": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE"):
        env.pop(name, None)  # the child decides, from FEDSKEW_CPU_KERNELS alone
    command = [sys.executable, __file__, "--child", check, "--rounds", str(rounds), "--recipe", str(recipe)]
    if cpu != HOST:
        command = ["qemu-x86_64", "-cpu", cpu, *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"capability": "?", "result": f"failed: {done.stderr.strip().splitlines()[-1:]}", "shown": ""}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", nargs="*", default=["Haswell-v4", "Skylake-Server-v4", "EPYC-Rome"],
                        help="QEMU CPU models (`qemu-x86_64 -cpu help`); this machine's CPU always runs first")
    parser.add_argument("--checks", nargs="+", default=["steps", "train", "ops"], choices=["steps", "train", "ops"])
    parser.add_argument("--kernels", nargs="+", default=["portable", "native"], choices=["portable", "native"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe", type=int, default=None, help="the portable recipe for every model but logreg "
                                                                   "(default: the newest, fedskew.numerics.cpu_pin.RECIPE)")
    parser.add_argument("--child", choices=["steps", "train", "ops"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recipe is None:
        from fedskew.numerics.cpu_pin import RECIPE

        args.recipe = RECIPE
    if args.child:
        child(args.child, args.rounds, args.recipe)
        return
    if shutil.which("qemu-x86_64") is None:
        sys.exit("qemu-x86_64 is missing: `apt-get install qemu-user` (Debian), or pass --cpus with no model")
    from fedskew.provenance import cpu_model

    print(f"this machine: {cpu_model()}; portable recipe {args.recipe} for every model but logreg")
    for check in args.checks:
        for kernels in args.kernels:
            results = {cpu: measure(cpu, check, kernels, args.rounds, args.recipe) for cpu in [HOST, *args.cpus]}
            same = len({r["result"] for r in results.values()}) == 1
            print(f"{check} / {kernels}: {'identical on every CPU' if same else 'DIFFERENT between CPUs'}")
            for cpu, got in results.items():
                print(f"  {cpu:18s} ({got['capability']}): {got['result']}", flush=True)
                if got["shown"]:
                    print(f"  {'':18s} not compared: {got['shown']}", flush=True)


if __name__ == "__main__":
    main()
