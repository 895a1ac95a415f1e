"""How close is a fedskew round to the floor of the same SGD steps on in-memory tensors?

DESIGN.md asks that a round stay within 1.1x of that floor. Both are timed in one
process, interleaved, and the ratio of medians is reported, so machine noise largely
cancels. Offline: the digits dataset and the default suite's CNN.

    .venv/bin/python benchmarks/round_overhead.py [--rounds 20] [--clients 10]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _interleaved import compare  # benchmarks/, on the path when run as a script

from fedskew.data.datasets.digits import load_digits_split
from fedskew.data.partitions import make_partition
from fedskew.data.registry import DatasetInfo, _normalise
from fedskew.engine.sampling import client_seed
from fedskew.engine.rounds import train_client
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientContext, TrainingSettings, trainable_parameters
from fedskew.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--method", default="fedavg")
    args = parser.parse_args()
    torch.set_num_threads(1)

    raw = load_digits_split()
    x = _normalise(raw["x_train"], raw["x_test"], "digits")[0]  # (x_train, x_test, mean, std)
    y = raw["y_train"]
    partition = make_partition(y.numpy(), 10, "dirichlet", {"clients": args.clients, "beta": 0.5}, seed=0)
    indices = [torch.from_numpy(ix) for ix in partition.client_indices]
    counts = torch.from_numpy(partition.label_counts)
    settings = TrainingSettings(local_epochs=2, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    model = build_model("cnn", DatasetInfo((1, 8, 8), 10, True, False))
    algorithm = ALGORITHMS[args.method](settings, args.clients, 10)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}

    def engine_round(r: int) -> None:
        updates = []
        for k in range(args.clients):
            seed = client_seed(0, r, k)
            client = ClientContext(k, r, indices[k], counts[k], torch.Generator().manual_seed(seed))
            updates.append(train_client(algorithm, model, global_state, x, y, client, "bench"))
        algorithm.aggregate(global_state, updates, trainable_parameters(model))

    floor_model = build_model("cnn", DatasetInfo((1, 8, 8), 10, True, False))
    floor_opt = torch.optim.SGD(floor_model.parameters(), lr=0.05)

    def floor_round(r: int) -> None:
        """The same minibatches and SGD steps, one model, no state copies, no aggregation."""
        for k in range(args.clients):
            generator = torch.Generator().manual_seed(client_seed(0, r, k))
            for _ in range(settings.local_epochs):
                order = indices[k][torch.randperm(len(indices[k]), generator=generator)]
                for start in range(0, len(order), settings.batch_size):
                    batch = order[start:start + settings.batch_size]
                    floor_opt.zero_grad(set_to_none=True)
                    F.cross_entropy(floor_model(x[batch]), y[batch]).backward()
                    floor_opt.step()

    print(f"method={args.method} clients={args.clients} rounds={args.rounds} torch threads=1")
    print(compare(engine_round, floor_round, args.rounds))


if __name__ == "__main__":
    main()
