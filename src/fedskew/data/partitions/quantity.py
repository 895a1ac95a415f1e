"""``quantity`` Q(alpha) (clients, alpha): FedLC §5.1.

Cut the label-sorted data into ``m * alpha`` sets of about ``n / (m * alpha)`` samples and hand
``alpha`` random sets to each client; no sample is shared. FedLC cuts the sorted array at equal
offsets, which on imbalanced data lets a set straddle two classes (a client could then hold more
than ``alpha`` classes). We cut *within* classes instead: class ``c`` gets ``s_c`` sets, with
``s_c >= 1`` and ``s_c`` proportional to its size (largest remainder), and its shuffled indices
are split into ``s_c`` near-equal sets. Every set holds one class, so every client holds at most
``alpha`` classes (fewer when it draws two sets of one class, as in FedLC). On balanced data whose
set size divides the class size (CIFAR-10, 20 clients, alpha = 2) this is exactly FedLC's cut.
Needs ``m * alpha >= C`` (every class in a set).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import DealtSets, PartitionError, class_indices
from fedskew.data.partitions.parameters import Parameter


class Quantity(DealtSets):
    """FedLC's Q(alpha): m*alpha single-class sets, alpha random sets per client."""

    name = "quantity"
    # alpha against the classes: `check` (run by fedskew.config before any job)
    parameters = {"clients": Parameter(int, ref="sample_count"), "alpha": Parameter(int, ref="sample_count")}
    per_client, set_word, remedy = "alpha", "set", "a smaller alpha"

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        present = None if class_counts is None else int((class_counts > 0).sum())
        if present is not None and p["clients"] * p["alpha"] < present:
            raise PartitionError(
                f"clients*alpha = {p['clients'] * p['alpha']} single-class sets cannot cover the {present} "
                f"classes present; use more clients or a larger alpha {ctx}"
            )
        super().check(p, n, num_classes, class_counts, ctx)

    @staticmethod
    def cut(labels: np.ndarray, num_classes: int, num_sets: int, rng: np.random.Generator) -> list[np.ndarray]:
        """``num_sets`` near-equal sets, each from one class; set counts per class ∝ class size.

        Every non-empty class gets at least one set; the remaining sets go by largest
        remainder of ``num_sets * n_c / n`` (ties to the smaller class index).
        """
        by_class = class_indices(labels, num_classes, rng)
        sizes = np.array([len(ix) for ix in by_class], dtype=np.int64)
        present = sizes > 0
        counts = present.astype(np.int64)
        spare = num_sets - int(counts.sum())
        quota = spare * sizes / sizes.sum()
        counts += np.floor(quota).astype(np.int64)
        leftover = num_sets - int(counts.sum())
        order = np.lexsort((np.arange(num_classes), -(quota - np.floor(quota))))
        counts[order[:leftover]] += 1
        counts = np.minimum(counts, sizes)  # a class cannot give more sets than samples
        while counts.sum() < num_sets:  # only for tiny classes: move sets to the largest ones
            counts[np.argmax(sizes / np.maximum(counts, 1))] += 1
        return [part for ix, k in zip(by_class, counts) if k for part in np.array_split(ix, k)]
