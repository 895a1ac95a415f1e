"""``iid_mixture`` (clients, rho, beta, min_size=10, max_redraws=1000): a fraction rho of each client IID.

FL-bench's ``--iid`` option (KarhouTam/FL-bench, ``generate_data.py``): a uniformly random ``int(rho * n)``
of the training samples is dealt IID, and the rest is partitioned by another scheme, here Dirichlet(beta);
each client holds its IID share and its Dirichlet share. We follow it with two changes, so that the defining
property, *a fraction rho of each client's data is drawn IID, the rest by Dirichlet(beta)*, holds on every
client rather than over the whole set:

- the rest (``D = n - int(rho*n)`` samples) is drawn first, by fedskew's ``dirichlet`` (NIID-Bench's n/m cap
  and min-size redraws, its ``beta``, ``max_redraws`` and a ``min_size`` of ``ceil(min_size * D / n)``, which
  makes every whole client reach ``min_size``), giving client ``k`` its Dirichlet share of ``d_k`` samples;
- the IID pool is then dealt in proportion to those shares (largest remainder), ``i_k ~ int(rho*n) * d_k / D``,
  so ``i_k / (i_k + d_k)`` is rho up to rounding (``|i_k - rho (i_k + d_k)| < 2``). FL-bench deals it in equal
  shares ``int(rho*n / m)`` (dropping the remainder), which makes each client's IID fraction vary with its
  Dirichlet share; here no sample is dropped.

Each client's IID share is a uniformly random sample of the training set (consecutive cuts of one random
permutation), so its label distribution is the global one up to sampling noise, and each client's label
distribution is ``rho * global + (1 - rho) * (its Dirichlet share's)``. ``rho = 1`` is ``iid`` (equal shares,
the same draw for the same generator); ``rho = 0`` is ``dirichlet`` (the same draw for the same generator:
no random number is taken before it). In between, client sizes are the Dirichlet shares scaled by ``n/D``.

What it is for: how much globally distributed data it takes to undo label skew, e.g. a server or public
dataset mixed into every client, or a mild skew between IID and D(beta): accuracy against rho at fixed beta.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme
from fedskew.data.partitions.dirichlet import Dirichlet
from fedskew.data.partitions.parameters import Parameter


class IidMixture(Scheme):
    name = "iid_mixture"
    parameters = {
        "clients": Parameter(int, ref="sample_count"),
        "rho": Parameter(float, minimum=0, maximum=1),
        "beta": Parameter(float, exclusive_minimum=0),
        "min_size": Parameter(int, 10, ref="sample_count"),
        "max_redraws": Parameter(int, 1000, minimum=1, maximum=100000),
    }

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """Each client's Dirichlet share and IID share, together."""
        iid, noniid = draw_parts(labels, num_classes, params, rng, dataset)
        return [np.concatenate([a, b]) for a, b in zip(noniid, iid)]

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        if not 0 <= p["rho"] <= 1:
            raise PartitionError(f"rho must be in [0, 1] (1: iid, 0: dirichlet), got {p['rho']} {ctx}")
        Dirichlet.check(p, n, num_classes, class_counts, ctx)  # beta, min_size, max_redraws over all n
        rest = n - int(p["rho"] * n)
        if 0 < rest < p["clients"] * _rest_min_size(p, n):
            raise PartitionError(
                f"the Dirichlet part, {rest} of the {n} samples at rho={p['rho']}, cannot give each of the "
                f"{p['clients']} clients a Dirichlet share of {_rest_min_size(p, n)} sample(s), which its "
                f"min_size={p['min_size']} needs (its IID share is dealt in proportion to it); use a smaller rho "
                f"(or rho=1, plain iid), fewer clients or a smaller min_size {ctx}")


def _rest_min_size(p: dict[str, Any], n: int) -> int:
    """The Dirichlet shares' min_size that gives every whole client ``min_size``: ``ceil(min_size * D / n)``."""
    rest = n - int(p["rho"] * n)
    return max(1, math.ceil(p["min_size"] * rest / n))


def draw_parts(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               dataset: str = "") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(IID shares, Dirichlet shares), one int64 index array per client each."""
    n, m = len(labels), params["clients"]
    n_iid = int(params["rho"] * n)  # FL-bench: int(len * iid)
    # No draw when nothing is IID, so that rho = 0 is dirichlet's draw for the same generator.
    perm = rng.permutation(n).astype(np.int64) if n_iid else np.zeros(0, np.int64)
    pool = perm[:n_iid]
    if n_iid == n:  # rho = 1: iid's equal shares of the same permutation
        return list(np.array_split(pool, m)), [np.zeros(0, np.int64)] * m
    rest = np.sort(perm[n_iid:]) if n_iid else np.arange(n, dtype=np.int64)
    sub = {key: params[key] for key in ("clients", "beta", "max_redraws")}
    sub["min_size"] = _rest_min_size(params, n)
    try:
        noniid = [rest[ix] for ix in Dirichlet.sample(labels[rest], num_classes, sub, rng, dataset=dataset)]
    except PartitionError as err:
        raise PartitionError(f"iid_mixture (rho={params['rho']}): the Dirichlet part of {rest.size} samples: "
                             f"{err}") from err
    counts = _largest_remainder(n_iid, np.array([ix.size for ix in noniid], dtype=np.int64))
    return list(np.split(pool, np.cumsum(counts)[:-1])), noniid


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``weights``: floors, then one more to the largest remainders (ties to
    the lower client id)."""
    quota = total * weights / weights.sum()
    counts = np.floor(quota).astype(np.int64)
    order = np.lexsort((np.arange(weights.size), -(quota - counts)))
    counts[order[: total - int(counts.sum())]] += 1
    return counts
