"""``dirichlet`` D(beta) (clients, beta, min_size=10, max_redraws=1000): FedLC §5.1 / NIID-Bench.

For each class (in class order) draw ``p ~ Dir(beta * 1_m)``; a client that already holds
``>= n/m`` samples gets ``p_j = 0`` for that draw (renormalised); the class's shuffled indices
are split at ``cumsum(p)``. The whole draw is repeated until every client holds ``>= min_size``
samples: one initial draw plus at most ``max_redraws`` redraws, then :class:`PartitionError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme, request_context
from fedskew.data.partitions.parameters import Parameter


class Dirichlet(Scheme):
    name = "dirichlet"
    parameters = {
        "clients": Parameter(int, ref="sample_count"),
        "beta": Parameter(float, exclusive_minimum=0),
        "min_size": Parameter(int, 10, ref="sample_count"),  # 0 would allow empty clients
        # each redraw draws clients × classes Dirichlet weights
        "max_redraws": Parameter(int, 1000, minimum=1, maximum=100000),
    }

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """D(beta) with NIID-Bench's n/m cap and bounded min-size redraws."""
        n = len(labels)
        m, beta = params["clients"], params["beta"]
        min_size, max_redraws = params["min_size"], params["max_redraws"]
        cap = n / m
        by_class = [np.flatnonzero(labels == c).astype(np.int64) for c in range(num_classes)]
        best = -1
        for _attempt in range(max_redraws + 1):
            parts: list[list[np.ndarray]] = [[] for _ in range(m)]
            sizes = np.zeros(m, dtype=np.int64)
            for idx in by_class:
                if idx.size == 0:
                    continue
                idx = idx.copy()
                rng.shuffle(idx)
                p = rng.dirichlet(np.full(m, beta))
                p = np.where(sizes < cap, p, 0.0)
                total = p.sum()
                if not np.isfinite(total) or total <= 0:
                    # Every open client drew an (underflowed) zero: share among open clients.
                    p = (sizes < cap).astype(np.float64)
                    total = p.sum()
                p = p / total
                cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
                for j, chunk in enumerate(np.split(idx, cuts)):
                    if chunk.size:
                        parts[j].append(chunk)
                        sizes[j] += chunk.size
            smallest = int(sizes.min())
            best = max(best, smallest)
            if smallest >= min_size:
                return [np.concatenate(pj) if pj else np.zeros(0, np.int64) for pj in parts]
        ds = f" on dataset {dataset!r}" if dataset else ""
        raise PartitionError(
            f"dirichlet: could not give every one of m={m} clients >= min_size={min_size} samples "
            f"with beta={beta}{ds} (n={n} samples) in {max_redraws + 1} draws (largest minimum "
            f"client size seen: {best}); use a larger beta, fewer clients, a smaller min_size or "
            f"more max_redraws {request_context('dirichlet', params, n, dataset)}"
        )

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        if p["beta"] <= 0:
            raise PartitionError(f"beta must be > 0, got {p['beta']} {ctx}")
        if p["min_size"] < 1:
            raise PartitionError(f"min_size must be >= 1 (no client may be empty), got {p['min_size']} {ctx}")
        if p["max_redraws"] < 0:
            raise PartitionError(f"max_redraws must be >= 0, got {p['max_redraws']} {ctx}")
        if p["min_size"] * p["clients"] > n:
            raise PartitionError(
                f"min_size={p['min_size']} for each of {p['clients']} clients needs "
                f"{p['min_size'] * p['clients']} samples but only {n} exist; use fewer clients "
                f"or a smaller min_size {ctx}"
            )
