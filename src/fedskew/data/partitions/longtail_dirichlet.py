"""``longtail_dirichlet`` (clients, imbalance_ratio, beta, min_size=10, max_redraws=1000): long tail, then D(beta).

Heterogeneous *and* long-tailed data, as in Xinyi Shang, Yang Lu, Gang Huang and Hanzi Wang, "Federated
Learning on Heterogeneous and Long-Tailed Data via Classifier Re-Training with Federated Features" (CReFF),
IJCAI 2022 (code: shangxinyi/CReFF-FL, ``train_long_tail`` then ``clients_indices``): the training set is first
thinned to a long tail, then the kept samples are split across the clients by Dirichlet(beta).

1. Long tail, the exponential profile of CIFAR-10-LT (Kaidi Cao, Colin Wei, Adrien Gaidon, Nikos Arechiga and
   Tengyu Ma, "Learning Imbalanced Datasets with Label-Distribution-Aware Margin Loss" (LDAM), NeurIPS 2019;
   kaidic/LDAM-DRW, ``get_img_num_per_cls``, ``imb_type='exp'``): class ``c`` of ``C`` keeps
   ``n_c = floor(n_max * r^(-c/(C-1)))`` samples, ``r = imbalance_ratio = n_0 / n_(C-1)`` (their
   ``imb_factor`` is ``1/r``), a uniformly random subset of its samples (their shuffle, then the first ``n_c``).
   Classes are ranked in label order, class 0 the head and class C-1 the tail, as LDAM and CReFF do, so that
   which classes are rare is the literature's (CIFAR-10-LT) and the same for every seed: seeds vary the kept
   samples and the Dirichlet draw, not which classes are rare. ``n_max`` is the class size on balanced data
   (theirs); on imbalanced data it is the largest head whose exact curve stays within every class's count,
   ``min_c floor(count_c * r^(c/(C-1)))``. A 1e-9 guard keeps float error from flooring 5.0 to 4.
2. The kept samples split by fedskew's ``dirichlet`` (NIID-Bench's n/m cap, with ``n`` the kept count, and
   min-size redraws); CReFF's own split adds a re-balancing of client sizes that fedskew's ``dirichlet``
   does not have.

The thinned-out samples belong to no client: the partition does not cover the training set
(``leaves_samples_out``; the partition job still checks that no sample is held twice). ``r = 1`` keeps a
balanced set of ``n_max`` per class (everything, on balanced data).

What it is for: a global class imbalance on top of the label skew between clients (the federated long-tail
setting): whether a method that corrects the skew between clients also recovers the tail classes, read in
the per-class test accuracy, against ``r`` at fixed beta.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import PartitionError, Scheme
from fedskew.data.partitions.dirichlet import Dirichlet
from fedskew.data.partitions.parameters import Parameter

_GUARD = 1e-9  # float error must not floor an integral count (500 * 100**-1 = 5.0) one below


class LongtailDirichlet(Scheme):
    name = "longtail_dirichlet"
    leaves_samples_out = True  # the thinned classes' other samples go to no client
    parameters = {
        "clients": Parameter(int, ref="sample_count"),
        "imbalance_ratio": Parameter(float, minimum=1),
        "beta": Parameter(float, exclusive_minimum=0),
        "min_size": Parameter(int, 10, ref="sample_count"),
        "max_redraws": Parameter(int, 1000, minimum=1, maximum=100000),
    }

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """The long-tailed subset, then dirichlet's draw over it (indices into the whole training set)."""
        kept = keep_long_tail(labels, num_classes, params["imbalance_ratio"], rng)
        sub = {key: params[key] for key in ("clients", "beta", "min_size", "max_redraws")}
        try:
            parts = Dirichlet.sample(labels[kept], num_classes, sub, rng, dataset=dataset)
        except PartitionError as err:
            raise PartitionError(f"longtail_dirichlet (imbalance_ratio={params['imbalance_ratio']}): the "
                                 f"{kept.size} kept samples: {err}") from err
        return [kept[ix] for ix in parts]

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        r = p["imbalance_ratio"]
        if r < 1:
            raise PartitionError(f"imbalance_ratio must be >= 1 (largest over smallest class count), got {r} {ctx}")
        Dirichlet.check(p, n, num_classes, class_counts, ctx)  # beta, min_size, max_redraws; over all n
        if class_counts is None:
            return  # the kept counts need the class counts: make_partition checks them
        counts = np.asarray(class_counts, dtype=np.int64)
        if (counts == 0).any():
            raise PartitionError(f"class(es) {np.flatnonzero(counts == 0).tolist()[:10]} have no sample, so no long "
                                 f"tail over the {num_classes} classes can be kept; use another scheme {ctx}")
        kept = long_tail_counts(counts, r)
        if kept[-1] < 1:
            raise PartitionError(f"imbalance_ratio={r} leaves the tail class {num_classes - 1} no sample (head "
                                 f"n_max={kept[0]}); use an imbalance_ratio of at most {kept[0]} {ctx}")
        if kept.sum() < p["min_size"] * p["clients"]:
            raise PartitionError(
                f"the long tail keeps {int(kept.sum())} of the {n} samples, fewer than min_size={p['min_size']} "
                f"for each of {p['clients']} clients; use a smaller imbalance_ratio, fewer clients or a smaller "
                f"min_size {ctx}")


def long_tail_counts(class_counts: np.ndarray, ratio: float) -> np.ndarray:
    """The kept count of each class: ``floor(n_max * ratio^(-c/(C-1)))``, the largest ``n_max`` that fits."""
    counts = np.asarray(class_counts, dtype=np.int64)
    c = counts.size
    exponent = np.arange(c) / (c - 1) if c > 1 else np.zeros(1)  # one class: nothing to thin
    n_max = int(np.floor(counts * ratio ** exponent + _GUARD).min())
    return np.minimum(counts, np.floor(n_max * ratio ** -exponent + _GUARD).astype(np.int64))


def keep_long_tail(labels: np.ndarray, num_classes: int, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """The sorted indices kept: a uniformly random ``n_c`` of each class (classes in label order)."""
    kept_counts = long_tail_counts(np.bincount(labels, minlength=num_classes), ratio)
    kept = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in enumerate(kept_counts)]
    return np.sort(np.concatenate(kept)).astype(np.int64)
