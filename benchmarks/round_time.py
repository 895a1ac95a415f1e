"""Per-round training time of every CIFAR-capable model on fake CIFAR-shaped data.

What does a round of each model cost on a GPU? This script measures it on
whatever `--device` names (`auto` takes a GPU when present). The setting is fixed so
numbers are comparable across machines: 5 000 random 3×32×32 images, 10 classes, 10
clients (iid), 5 per round, 1 local epoch at batch 64, SGD lr 0.01 momentum 0.9, FedAvg
through the engine's own `federated_round`. The first round is a warm-up (CUDA context,
cuDNN autotuning off) and is not reported; the median of the next rounds is.

    .venv/bin/python benchmarks/round_time.py --device auto            # all models
    .venv/bin/python benchmarks/round_time.py --device cpu --models cnn resnet32 --rounds 2
    .venv/bin/python benchmarks/round_time.py --device auto --execution-clients 20 50 100

`--execution-clients N ...` compares the two execution paths instead (the target on a GPU:
vectorised rounds at least 5× as fast as sequential ones): for each N, the images are split evenly over N clients who all train every round, with
the small `cnn` (or `--models`' first), and the vectorised round's speed is reported as a
multiple of the sequential round's (rounds/s), timed interleaved.

Wall-clock times on a shared machine are noisy: compare models within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fedskew.data.registry import DatasetInfo  # noqa: E402
from fedskew.engine.sampling import client_seed, sampling_schedule  # noqa: E402
from fedskew.engine.rounds import federated_round  # noqa: E402
from fedskew.engine.simulation import resolve_device
from fedskew.fl import ALGORITHMS  # noqa: E402
from fedskew.fl.base import ClientContext, TrainingSettings  # noqa: E402
from fedskew.models import MODELS, build_model, incompatibility  # noqa: E402

CIFAR = DatasetInfo((3, 32, 32), 10, True, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--models", nargs="*", default=[m for m in MODELS if incompatibility(m, CIFAR) is None])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--execution-clients", type=int, nargs="*", default=None,
                        help="compare sequential and vectorised rounds with these numbers of clients")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.execution_clients:
        compare_execution(args, device)
        return

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.images, *CIFAR.input_shape, generator=generator).to(device)
    y = torch.randint(0, CIFAR.num_classes, (args.images,), generator=generator).to(device)
    parts = np.array_split(np.random.default_rng(0).permutation(args.images), 10)
    indices = [torch.as_tensor(p, dtype=torch.int64) for p in parts]
    counts = [torch.bincount(y[i.to(device)], minlength=10) for i in indices]
    schedule = sampling_schedule(0, 10, 5, args.rounds + 1)
    settings = TrainingSettings(local_epochs=1, batch_size=64, lr=0.01, momentum=0.9, weight_decay=0.0)

    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, {args.threads} thread(s), {args.images} images, 5 clients x 1 epoch per round")
    print("| model | parameters | median s/round | rounds timed |")
    print("| --- | ---: | ---: | ---: |")
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(name, CIFAR).to(device)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        algorithm = ALGORITHMS["fedavg"](settings, 10, 10)
        times = []
        for round_ in range(1, args.rounds + 2):
            clients = [ClientContext(int(c), round_, indices[int(c)], counts[int(c)],
                                     torch.Generator().manual_seed(client_seed(0, round_, int(c))),
                                     client_seed(0, round_, int(c))) for c in schedule[round_ - 1]]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            state = federated_round(algorithm, model, state, clients, x, y, "benchmark").global_state
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_ > 1:
                times.append(time.perf_counter() - start)
        params = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {params:,} | {statistics.median(times):.3f} | {len(times)} |", flush=True)


def compare_execution(args: argparse.Namespace, device: torch.device) -> None:
    """Sequential against vectorised rounds of one small model, all clients training, interleaved."""
    name = args.models[0] if args.models and len(args.models) == 1 else "cnn"
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.images, *CIFAR.input_shape, generator=generator).to(device)
    y = torch.randint(0, CIFAR.num_classes, (args.images,), generator=generator).to(device)
    settings = TrainingSettings(local_epochs=1, batch_size=64, lr=0.01, momentum=0.9, weight_decay=0.0)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, {args.threads} thread(s), {args.images} images, model {name}, "
          "every client trains 1 epoch per round")
    print("| clients | sequential s/round | vectorised s/round | vectorised / sequential rounds/s | rounds timed |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for num_clients in args.execution_clients:
        parts = np.array_split(np.random.default_rng(0).permutation(args.images), num_clients)
        indices = [torch.as_tensor(p, dtype=torch.int64) for p in parts]
        counts = [torch.bincount(y[i.to(device)], minlength=10) for i in indices]
        torch.manual_seed(0)
        model = build_model(name, CIFAR).to(device)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        algorithm = ALGORITHMS["fedavg"](settings, num_clients, 10)
        times: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(1, args.rounds + 2):
            clients = [ClientContext(k, round_, indices[k], counts[k],
                                     torch.Generator().manual_seed(client_seed(0, round_, k)), client_seed(0, round_, k))
                       for k in range(num_clients)]
            for vectorised in (False, True):
                for client in clients:  # each path draws the same batches from fresh generators
                    client.generator.manual_seed(client.seed)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                federated_round(algorithm, model, state, clients, x, y, "benchmark", vectorised=vectorised)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if round_ > 1:  # round 1 warms up both paths
                    times[vectorised].append(time.perf_counter() - start)
        sequential, vectorised = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {num_clients} | {sequential:.3f} | {vectorised:.3f} | {sequential / vectorised:.2f}x | "
              f"{len(times[True])} |", flush=True)


if __name__ == "__main__":
    main()
