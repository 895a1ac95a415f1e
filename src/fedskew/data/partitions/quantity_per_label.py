"""``quantity_per_label`` (clients, alpha): SCALA's variant of quantity skew.

Each class's shuffled data is split into ``P = m * alpha / C`` near-equal portions (requires
``C | m * alpha``); every client receives ``alpha`` portions of ``alpha`` *distinct* classes and
every class hands out exactly ``P`` portions. The client-class incidence starts from a cyclic
layout (a random class order repeated, ``alpha`` consecutive entries per client, hence distinct
as ``alpha <= C``) and is then randomised by degree-preserving swaps, which keep both guarantees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme, class_indices
from fedskew.data.partitions.parameters import Parameter


class QuantityPerLabel(Scheme):
    name = "quantity_per_label"
    # alpha against the classes: `check` (run by fedskew.config before any job)
    parameters = {"clients": Parameter(int, ref="sample_count"), "alpha": Parameter(int, ref="sample_count")}

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """SCALA's Q(alpha): each class cut into m*alpha/C portions, alpha distinct classes per client."""
        m, a = params["clients"], params["alpha"]
        portions_per_class = m * a // num_classes
        portions = [list(np.array_split(ix, portions_per_class))
                    for ix in class_indices(labels, num_classes, rng)]
        for plist in portions:
            order = rng.permutation(len(plist))  # which portion of a class goes to which client
            plist[:] = [plist[i] for i in order]
        assign = _class_assignment(m, a, num_classes, rng)
        next_portion = np.zeros(num_classes, dtype=np.int64)
        out = []
        for k in range(m):
            chunks = []
            for c in assign[k]:
                chunks.append(portions[c][next_portion[c]])
                next_portion[c] += 1
            out.append(np.concatenate(chunks))
        return out

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        m, a = p["clients"], p["alpha"]
        if (m * a) % num_classes != 0:
            raise PartitionError(
                f"quantity_per_label needs clients*alpha ({m}*{a}={m * a}) divisible by "
                f"num_classes={num_classes} so that every class is cut into the same number "
                f"of portions; change clients or alpha {ctx}"
            )
        portions = m * a // num_classes
        short = np.flatnonzero(class_counts < portions) if class_counts is not None else np.zeros(0)
        if short.size:
            raise PartitionError(
                f"class(es) {short.tolist()[:10]} have fewer samples "
                f"({class_counts[short].tolist()[:10]}) than the {portions} portions per class "
                f"(clients*alpha/num_classes); use fewer clients or a smaller alpha {ctx}"
            )


def _class_assignment(m: int, alpha: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Random [m, alpha] matrix of classes: distinct per row, each class m*alpha/C times.

    Starts from a cyclic layout of a random class order (alpha consecutive entries of a
    cycle of C distinct classes are distinct since alpha <= C), then applies random
    degree-preserving swaps between two clients that keep both rows distinct.
    """
    order = rng.permutation(num_classes)
    assign = np.resize(order, m * alpha).reshape(m, alpha)
    assign = assign[rng.permutation(m)]
    if m >= 2 and alpha < num_classes:
        members = [set(row.tolist()) for row in assign]
        for _ in range(10 * m * alpha):
            a, b = rng.integers(m, size=2)
            if a == b:
                continue
            i, j = rng.integers(alpha, size=2)
            x, y = int(assign[a, i]), int(assign[b, j])
            if x == y or y in members[a] or x in members[b]:
                continue
            assign[a, i], assign[b, j] = y, x
            members[a].remove(x)
            members[a].add(y)
            members[b].remove(y)
            members[b].add(x)
    return assign
