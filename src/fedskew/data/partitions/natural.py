"""``natural`` (no params): client ``k`` holds the samples whose ``natural_groups`` value is ``k``.

For datasets generated per client (e.g. Synthetic). A group id that no sample carries is dropped
and the later ids move down by one; make_partition logs the dropped ids and records them in
``meta["dropped_empty_groups"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme, request_context


class Natural(Scheme):
    name = "natural"
    # A natural id that no sample carries is only a gap in the ids (a writer filtered out upstream).
    drops_empty_clients = True

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """Client k = samples with natural_groups == k, for k = 0..max id (make_partition drops empty ones)."""
        n = len(labels)
        ctx = request_context("natural", params, n, dataset)
        if natural_groups is None:
            raise PartitionError(f"scheme 'natural' needs natural_groups (one client id per sample) {ctx}")
        g = np.asarray(natural_groups)
        if g.ndim != 1 or g.shape[0] != n:
            raise PartitionError(f"natural_groups must have shape ({n},), got {g.shape} {ctx}")
        if g.size and not np.issubdtype(g.dtype, np.integer):
            raise PartitionError(f"natural_groups must be integers, got dtype {g.dtype} {ctx}")
        if g.size and g.min() < 0:
            raise PartitionError(f"natural_groups must be >= 0, got min {g.min()} {ctx}")
        counts = np.bincount(g)
        order = np.argsort(g, kind="stable").astype(np.int64)
        return list(np.split(order, np.cumsum(counts)[:-1]))
