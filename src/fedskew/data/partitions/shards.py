"""``shards`` (clients, shards_per_client): FedED / FedNTD.

Shuffle within each class, sort by label, cut into ``m * s`` shards (remainder spread as in
``quantity``), and give ``s`` random shards to each client; the same class may repeat.
Algorithmically the same as ``quantity`` but without the ``alpha <= C`` bound (FedED uses
s = 20, 40 for 100/200 classes) and with its own random stream.
"""

from __future__ import annotations

import numpy as np

from fedskew.data.partitions.base import DealtSets, class_indices
from fedskew.data.partitions.parameters import Parameter


class Shards(DealtSets):
    """FedED/FedNTD shards(s): m*s label-sorted shards, s random shards per client."""

    name = "shards"
    parameters = {"clients": Parameter(int, ref="sample_count"),
                  "shards_per_client": Parameter(int, ref="sample_count")}
    per_client, set_word, remedy = "shards_per_client", "shard", "fewer shards per client"

    @staticmethod
    def cut(labels: np.ndarray, num_classes: int, num_sets: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Label-sorted (shuffled within class) indices cut into ``num_sets`` contiguous sets.

        The remainder ``n mod num_sets`` goes to the first sets in label order, one each.
        """
        flat = np.concatenate(class_indices(labels, num_classes, rng))
        return list(np.array_split(flat, num_sets))
