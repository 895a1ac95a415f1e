"""A convolutional round against its floor: MNIST-shaped data, FedLC's MNIST CNN, many clients.

The compute-bound speed workload: 60 000 random 1x28x28 images split evenly over
`--clients` clients (20 and 200 by default), every client training in every round (one
local epoch, batch 64, SGD lr 0.01, one torch thread). fedskew's `federated_round` (FedAvg:
reloading the global model per client, streamed averaging) is timed against the floor of
the same minibatches and SGD steps on one model in a bare loop, interleaved in one
process; the ratio of medians has a target of at most 1.05. With `--vectorised`
the vectorised round is timed too (on a CPU a CNN gains nothing from it; on a GPU it is
the point, see round_time.py).

    .venv/bin/python benchmarks/cnn_round.py [--clients 20 200] [--rounds 3] [--samples 60000]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from _interleaved import compare_many  # benchmarks/, on the path when run as a script

from fedskew.data.registry import DatasetInfo
from fedskew.engine.sampling import client_seed
from fedskew.engine.rounds import federated_round
from fedskew.engine.simulation import resolve_device
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.models import build_model
from fedskew.numerics.sgd import SGD

MNIST = DatasetInfo((1, 28, 28), 10, True, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each, after one warm-up round")
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--model", default="fedlc_cnn_mnist")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--vectorised", action="store_true", help="time the vectorised round as well")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = resolve_device(args.device)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, *MNIST.input_shape, generator=generator).to(device)
    y = torch.randint(0, MNIST.num_classes, (args.samples,), generator=generator).to(device)
    settings = TrainingSettings(local_epochs=1, batch_size=64, lr=0.01, momentum=0.0, weight_decay=0.0)
    for num_clients in args.clients:
        parts = np.array_split(np.random.default_rng(0).permutation(args.samples), num_clients)
        indices = [torch.as_tensor(p, dtype=torch.int64) for p in parts]
        counts = [torch.bincount(y[i.to(device)], minlength=10) for i in indices]
        torch.manual_seed(0)
        model = build_model(args.model, MNIST).to(device)
        algorithm = ALGORITHMS["fedavg"](settings, num_clients, 10)
        global_state = {k: v.clone() for k, v in model.state_dict().items()}

        def contexts(r: int) -> list[ClientContext]:
            return [ClientContext(k, r, indices[k], counts[k], torch.Generator().manual_seed(client_seed(0, r, k)),
                                  client_seed(0, r, k)) for k in range(num_clients)]

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        def sequential_round(r: int) -> None:
            federated_round(algorithm, model, global_state, contexts(r), x, y, "bench")
            sync()

        def vectorised_round(r: int) -> None:
            federated_round(algorithm, model, global_state, contexts(r), x, y, "bench", vectorised=True)
            sync()

        floor_model = build_model(args.model, MNIST).to(device)
        floor_opt = SGD(floor_model.parameters(), lr=settings.lr)  # the engine's optimiser

        def floor_round(r: int) -> None:
            """The same minibatches and SGD steps on one model: no contexts, no reloads, no averaging."""
            for k in range(num_clients):
                generator = torch.Generator().manual_seed(client_seed(0, r, k))
                order = indices[k][torch.randperm(len(indices[k]), generator=generator)].to(device)
                for start in range(0, len(order), settings.batch_size):
                    batch = order[start:start + settings.batch_size]
                    floor_opt.zero_grad(set_to_none=True)
                    F.cross_entropy(floor_model(x[batch]), y[batch]).backward()
                    floor_opt.step()
            sync()

        candidates = {"sequential": sequential_round}
        if args.vectorised:
            candidates["vectorised"] = vectorised_round
        print(f"{args.model}, {args.samples} MNIST-shaped samples, {num_clients} clients all training, "
              f"{args.rounds} rounds, device {device}, 1 torch thread")
        print(compare_many(candidates, floor_round, args.rounds), flush=True)


if __name__ == "__main__":
    main()
