"""Per-client overhead where it dominates: a FedLC Table 4 round (Synthetic(1,1), logistic regression).

Times fedskew's `federated_round` (sampling contexts, reloading the global model per
client, local SGD, streamed aggregation), sequential and vectorised (all participants at
once, fedskew.engine.vectorised), against the floor of the same minibatches and SGD steps
on one model in a bare loop, interleaved in one process. The speed targets bound the ratios:
sequential <= 1.2, vectorised <= 0.5 (faster than the sequential floor). Offline: the
Synthetic generator of FedLC's Table 4.

    .venv/bin/python benchmarks/synthetic_round.py [--rounds 200] [--per-round 10] [--method fedavg]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _interleaved import compare_many  # benchmarks/, on the path when run as a script

from fedskew.data.datasets.synthetic import generate_synthetic
from fedskew.data.partitions import make_partition
from fedskew.data.registry import DatasetInfo
from fedskew.engine.sampling import client_seed, sampling_schedule
from fedskew.engine.rounds import federated_round
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.models import build_model
from fedskew.numerics.sgd import SGD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--per-round", type=int, default=10, help="participants per round (of 100 clients)")
    parser.add_argument("--method", default="fedavg", help="a method whose local training vectorises")
    args = parser.parse_args()
    torch.set_num_threads(1)

    data = generate_synthetic(1.0, 1.0)
    x, y = data["x_train"], data["y_train"]
    partition = make_partition(y.numpy(), 10, "natural", {}, seed=0, natural_groups=data["natural_groups"].numpy())
    clients = len(partition.client_indices)
    indices = [torch.from_numpy(ix) for ix in partition.client_indices]
    counts = torch.from_numpy(partition.label_counts)
    settings = TrainingSettings(local_epochs=1, batch_size=128, lr=0.01, momentum=0.0, weight_decay=0.0)
    info = DatasetInfo((60,), 10, False, True)
    torch.manual_seed(0)
    model = build_model("logreg", info)
    algorithm = ALGORITHMS[args.method](settings, clients, 10)
    algorithm.set_label_counts(counts)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    schedule = sampling_schedule(0, clients, args.per_round, args.rounds + 1)

    def contexts(r: int) -> list[ClientContext]:
        out = []
        for k in sorted(int(c) for c in schedule[r]):
            seed = client_seed(0, r, k)
            out.append(ClientContext(k, r, indices[k], counts[k], torch.Generator().manual_seed(seed), seed))
        return out

    def sequential_round(r: int) -> None:
        federated_round(algorithm, model, global_state, contexts(r), x, y, "bench")

    def vectorised_round(r: int) -> None:
        federated_round(algorithm, model, global_state, contexts(r), x, y, "bench", vectorised=True)

    floor_model = build_model("logreg", info)
    floor_opt = SGD(floor_model.parameters(), lr=settings.lr)  # the engine's optimiser: the floor differs only in overhead

    def floor_round(r: int) -> None:
        """The same minibatches and SGD steps on one model: no contexts, no reloads, no averaging."""
        for k in sorted(int(c) for c in schedule[r]):
            generator = torch.Generator().manual_seed(client_seed(0, r, k))
            order = indices[k][torch.randperm(len(indices[k]), generator=generator)]
            for start in range(0, len(order), settings.batch_size):
                batch = order[start:start + settings.batch_size]
                floor_opt.zero_grad(set_to_none=True)
                F.cross_entropy(floor_model(x[batch]), y[batch]).backward()
                floor_opt.step()

    print(f"Synthetic(1,1), logreg, {args.method}, {args.per_round} of {clients} clients per round, "
          f"{args.rounds} rounds, 1 torch thread")
    print(compare_many({"sequential": sequential_round, "vectorised": vectorised_round}, floor_round, args.rounds))


if __name__ == "__main__":
    main()
