"""Training-set sizes known before any data exists, for the feasibility checks of params.yaml.

fedskew.config checks every (dataset, partition) pair of every suite with
fedskew.data.partitions.check_feasible before a job runs (5000 clients on 1437 digits fail
there, not in the partition job). These are the numbers it needs, and every one is exact:

* digits and synthetic are computed the way fedskew.data.datasets.digits and .synthetic build them, without
  importing scikit-learn (1.4 s) or generating features (tests compare them with the real
  thing);
* the downloaded sources are the fixed sizes of the published training splits as fedskew
  decodes them, which each source's class declares (`train_class_counts`, `train_size`; fedskew.catalog).

Where the size depends on something not visible here (FEMNIST's writer draw, a local
ImageNet copy), the answer is None and the partition job checks it on the real labels.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from fedskew import catalog

# scikit-learn's 8x8 digits: 1797 images, per class 0..9.
DIGITS_CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)



def digits_split_sizes(test_fraction: float) -> tuple[int, int]:
    """(train, test) sizes of datasets.digits.load_digits_split: scikit-learn's train_test_split arithmetic."""
    n = sum(DIGITS_CLASS_COUNTS)
    n_test = math.ceil(test_fraction * n)
    return n - n_test, n_test


def _digits_train_class_counts(test_fraction: float, seed: int) -> np.ndarray:
    """Per-class train counts of the stratified split: StratifiedShuffleSplit's first step,
    sklearn.utils.extmath._approximate_mode(class_counts, n_train, RandomState(seed)), restated.

    Proportional counts rounded down, the remaining samples going to the largest remainders
    (ties broken by the seeded generator, as scikit-learn does).
    """
    class_counts = np.array(DIGITS_CLASS_COUNTS)
    n_train, _ = digits_split_sizes(test_fraction)
    rng = np.random.RandomState(seed)
    continuous = class_counts / class_counts.sum() * n_train
    floored = np.floor(continuous)
    need_to_add = int(n_train - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            floored[rng.choice(inds, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(np.int64)


def _synthetic_client_sizes(spec: dict) -> np.ndarray:
    """Train samples per client of datasets.synthetic.generate_synthetic: the generator's first draw, 90 % of it."""
    sizes = np.random.default_rng(spec["seed"]).lognormal(4, 2, spec["clients"]).astype(np.int64) + 50
    return np.array([int(0.9 * size) for size in sizes], dtype=np.int64)


@lru_cache(maxsize=32)
def _synthetic_class_counts(lam: float, mu: float, clients: int, dim: int, classes: int, seed: int) -> np.ndarray:
    # The labels need the features: generate (tens of milliseconds for 100 clients), once per spec.
    from fedskew.data.datasets.synthetic import generate_synthetic

    labels = generate_synthetic(lam, mu, clients, dim, classes, seed)["y_train"].numpy()
    return np.bincount(labels, minlength=classes)


def train_size(spec: dict) -> int | None:
    """Training samples of a dataset spec (defaults filled in); None where not known in advance."""
    source = spec["source"]
    if source == "digits":
        return digits_split_sizes(spec["test_fraction"])[0]
    if source == "synthetic":
        return int(_synthetic_client_sizes(spec).sum())
    return catalog.sources()[source].train_size


def class_counts(spec: dict) -> np.ndarray | None:
    """Training samples per class of a dataset spec (defaults filled in); None where not known in advance."""
    source = spec["source"]
    if source == "digits":
        return _digits_train_class_counts(spec["test_fraction"], spec["seed"])
    if source == "synthetic":
        return _synthetic_class_counts(spec["lam"], spec["mu"], spec["clients"], spec["dim"], spec["classes"],
                                       spec["seed"]).copy()
    counts = catalog.sources()[source].train_class_counts
    return None if counts is None else np.array(counts, dtype=np.int64)

