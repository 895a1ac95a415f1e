"""``extended_dirichlet`` ExDir(C, beta) (clients, classes_per_client, beta, min_size=10, max_redraws=1000).

Extended Dirichlet ("ExDir"): Yipeng Li and Xinchen Lyu, "Convergence Analysis of Sequential Federated
Learning on Heterogeneous Data", NeurIPS 2023 (arXiv 2311.03154; the authors' code, liyipeng00/convergence,
``ExDirPartitioner``, which PFLlib's ``exdir`` partition ports). Two levels, as there:

1. Classes to clients: each client draws ``C = classes_per_client`` distinct classes uniformly at random
   (of the classes present). Every class must then have ``req = max(C*m // K // 5, 1)`` holders (``K``
   classes), the authors' rule. They redraw the whole assignment until it has; we repair the one draw
   instead, which always ends (in at most ``K*req`` steps) where redrawing can take forever (``m*C = K``
   needs a perfect cover): while a class ``k`` has fewer than ``req`` holders, a random holder of the
   class with the most holders (more than ``req``) that does not hold ``k`` swaps that class for ``k``.
   A draw that already meets the rule is kept as it is. So every client is assigned exactly ``C`` classes
   and every present class at least one client, which needs ``clients * C >= K`` (``check``).
2. Samples to clients, as ``dirichlet`` (NIID-Bench) but among the holders only: for each class (in class
   order) its shuffled samples are split among its holders by ``p ~ Dir(beta)``; a holder that already
   holds ``>= n/m`` samples gets ``p_j = 0`` (if every holder does, the cap is ignored for that class:
   its samples never leave its holders). Drawing over the holders alone is the authors' draw over all
   ``m`` clients restricted to the holders, in distribution (a renormalised sub-vector of a Dirichlet is
   Dirichlet), and a class's rounding remainder goes to its last holder, as in their code. This level is
   redrawn (the assignment kept, as there) until every client holds ``>= min_size`` samples: one draw
   plus at most ``max_redraws``, then :class:`PartitionError`.

A client holds samples of its ``C`` assigned classes only, so of at most ``C`` classes: fewer when a
Dirichlet share rounds to zero (common at small ``beta``) or when the cap has shut the client before a later
class of its own comes (class order; at ``beta = 10``, ``C = 2`` of 10 classes and 10 to 20 clients, up to 40%
of the clients hold one class). The cap never shuts a client's first class, so at ``C = 1`` every client
holds exactly its class. ``beta`` is the paper's alpha: fedskew calls a Dirichlet concentration ``beta``
(FedLC's D(beta)) and a count of classes per client ``alpha`` (quantity).

What it is for: it separates the two knobs that ``dirichlet`` ties together, how many classes a client sees
(``C``, as ``quantity``) and how unevenly a class is shared among the clients that see it (``beta``), so one
can ask whether missing classes or skewed proportions hurt a method more.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme, request_context
from fedskew.data.partitions.dirichlet import Dirichlet
from fedskew.data.partitions.parameters import Parameter


class ExtendedDirichlet(Scheme):
    name = "extended_dirichlet"
    parameters = {
        "clients": Parameter(int, ref="sample_count"),
        "classes_per_client": Parameter(int, ref="sample_count"),  # against the classes: `check`
        "beta": Parameter(float, exclusive_minimum=0),
        "min_size": Parameter(int, 10, ref="sample_count"),
        "max_redraws": Parameter(int, 1000, minimum=1, maximum=100000),
    }

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """Level 1 (classes to clients) once, then level 2 (Dir(beta) among holders) until min_size holds."""
        n, m, beta = len(labels), params["clients"], params["beta"]
        present = np.flatnonzero(np.bincount(labels, minlength=num_classes))
        holders = assign_classes(m, params["classes_per_client"], present.size, rng)
        by_class = [np.flatnonzero(labels == c).astype(np.int64) for c in present]
        best = -1
        for _attempt in range(params["max_redraws"] + 1):
            parts, sizes = _split_among_holders(by_class, holders, beta, m, n / m, rng)
            best = max(best, int(sizes.min()))
            if sizes.min() >= params["min_size"]:
                return [np.concatenate(pj) if pj else np.zeros(0, np.int64) for pj in parts]
        raise PartitionError(
            f"extended_dirichlet: could not give every one of m={m} clients >= min_size={params['min_size']} "
            f"samples in {params['max_redraws'] + 1} draws (largest minimum client size seen: {best}); use a "
            f"larger beta, a larger classes_per_client, fewer clients, a smaller min_size or more max_redraws "
            f"{request_context(ExtendedDirichlet.name, params, n, dataset)}")

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        classes = num_classes if class_counts is None else int((np.asarray(class_counts) > 0).sum())
        what = "num_classes" if class_counts is None else "classes present"
        c, m = p["classes_per_client"], p["clients"]
        if not 1 <= c <= classes:
            raise PartitionError(f"classes_per_client must be in [1, {what}={classes}], got {c}; each client "
                                 f"draws that many distinct classes {ctx}")
        if m * c < classes:
            raise PartitionError(
                f"clients*classes_per_client = {m}*{c} = {m * c} class slots cannot cover the {classes} "
                f"{what}: a class nobody holds would leave its samples unassigned; use at least "
                f"{-(-classes // c)} clients or a classes_per_client of at least {-(-classes // m)} {ctx}")
        Dirichlet.check(p, n, num_classes, class_counts, ctx)  # beta, min_size, max_redraws: as dirichlet


def assign_classes(m: int, per_client: int, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Level 1: the sorted clients holding each class (of ``num_classes``, by position), each client holding
    ``per_client`` distinct classes and each class at least ``max(per_client*m // num_classes // 5, 1)``
    clients (one random draw, repaired as the module docstring says)."""
    member = np.zeros((m, num_classes), dtype=bool)
    for k in range(m):
        member[k, rng.choice(num_classes, per_client, replace=False)] = True
    need = max(per_client * m // num_classes // 5, 1)
    degree = member.sum(axis=0)
    while (degree < need).any():
        short = int(np.argmax(degree < need))  # the first class short of holders
        donor = int(np.argmax(degree))  # the most held class: more than `need` holders (pigeonhole)
        # |holders of donor| > need > |holders of short|, so some holder of donor lacks short
        client = rng.choice(np.flatnonzero(member[:, donor] & ~member[:, short]))
        member[client, donor], member[client, short] = False, True
        degree[donor] -= 1
        degree[short] += 1
    return [np.flatnonzero(member[:, c]) for c in range(num_classes)]


def _split_among_holders(by_class: list[np.ndarray], holders: list[np.ndarray], beta: float, m: int, cap: float,
                         rng: np.random.Generator) -> tuple[list[list[np.ndarray]], np.ndarray]:
    """Level 2, one draw: each class's shuffled samples cut among its holders at Dir(beta) proportions."""
    parts: list[list[np.ndarray]] = [[] for _ in range(m)]
    sizes = np.zeros(m, dtype=np.int64)
    for idx, who in zip(by_class, holders):
        idx = rng.permutation(idx)
        p = rng.dirichlet(np.full(who.size, beta))
        for q in (np.where(sizes[who] < cap, p, 0.0), p, np.ones(who.size)):
            # the NIID-Bench cap; without it when it shuts every holder; uniform if all drew an underflowed 0
            if np.isfinite(q.sum()) and q.sum() > 0:
                break
        cuts = (np.cumsum(q / q.sum()) * idx.size).astype(np.int64)[:-1]
        for j, chunk in zip(who, np.split(idx, cuts)):
            if chunk.size:
                parts[j].append(chunk)
                sizes[j] += chunk.size
    return parts, sizes
