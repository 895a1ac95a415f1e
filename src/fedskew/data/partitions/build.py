"""Building a partition: the feasibility rules (check_feasible) and the seeded draw (make_partition)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from fedskew.data.partitions import registry
from fedskew.data.partitions.base import Partition, PartitionError, request_context
from fedskew.data.partitions.store import compute_hash

logger = logging.getLogger(__name__)


def check_feasible(scheme: str, params: dict[str, Any], n: int, num_classes: int,
                   class_counts: np.ndarray | None = None, dataset: str = "") -> dict[str, Any]:
    """Raise PartitionError unless ``scheme`` with ``params`` can split ``n`` samples of ``num_classes``
    classes without an empty client; return the params with defaults filled in.

    The one place of these rules: make_partition calls it with the real labels, and
    fedskew.config calls it for every (dataset, partition) pair of params.yaml, before any
    job runs, with sizes known in advance (fedskew.data.sizes). ``class_counts`` (training
    samples per class) may be None where they are not known in advance; the rules that need
    them then wait for make_partition. Only arithmetic is checked: whether Dirichlet draws
    reach min_size is decided by the draws themselves.
    """
    if scheme not in registry.SCHEME_CLASSES:
        raise PartitionError(
            f"unknown partition scheme {scheme!r}; choose one of {sorted(registry.SCHEME_CLASSES)} "
            f"{request_context(scheme, dict(params), n, dataset)}"
        )
    cls = registry.SCHEME_CLASSES[scheme]
    p = cls.normalise(params, n, dataset)
    cls.validate(p, n, int(num_classes), dataset, class_counts)
    return p


def _scheme_constant(scheme: str) -> int:
    """Stable 32-bit constant per scheme, mixed into the seed (independent streams)."""
    return int.from_bytes(hashlib.sha256(scheme.encode()).digest()[:4], "little")


def _check_labels(labels: np.ndarray, num_classes: int, n_ctx: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be 1-D, got shape {labels.shape} {n_ctx}")
    if labels.size == 0:
        raise PartitionError(f"labels is empty: nothing to partition {n_ctx}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(f"labels must be integers, got dtype {labels.dtype} {n_ctx}")
    if int(num_classes) < 1:
        raise PartitionError(f"num_classes must be >= 1, got {num_classes} {n_ctx}")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        raise PartitionError(
            f"labels must lie in [0, num_classes={num_classes}), found range [{lo}, {hi}] {n_ctx}"
        )
    return labels.astype(np.int64, copy=False)


def _label_counts(labels: np.ndarray, client_indices: list[np.ndarray], num_classes: int) -> np.ndarray:
    out = np.zeros((len(client_indices), num_classes), dtype=np.int64)
    for k, ix in enumerate(client_indices):
        out[k] = np.bincount(labels[ix], minlength=num_classes)
    return out


def make_partition(
    labels: np.ndarray,
    num_classes: int,
    scheme: str,
    params: dict[str, Any],
    seed: int,
    dataset: str = "",
    natural_groups: np.ndarray | None = None,
) -> Partition:
    """Partition the training set given by ``labels`` with ``scheme``; deterministic in ``seed``.

    Raises :class:`PartitionError` for unknown schemes, bad or missing parameters, and
    requests that cannot be met (the message names the scheme, parameters, dataset size
    and what to change).
    """
    params = dict(params or {})
    n_guess = int(np.asarray(labels).shape[0]) if np.asarray(labels).ndim else 0
    labels = _check_labels(labels, num_classes, request_context(scheme, params, n_guess, dataset))
    num_classes, n, seed = int(num_classes), int(labels.shape[0]), _check_seed(seed)
    p = check_feasible(scheme, params, n, num_classes, np.bincount(labels, minlength=num_classes), dataset)

    rng = np.random.default_rng([seed, _scheme_constant(scheme)])
    drawn = registry.SCHEMES[scheme](labels, num_classes, p, rng, natural_groups=natural_groups, dataset=dataset)
    client_indices = [np.sort(np.asarray(ix, dtype=np.int64)) for ix in drawn]
    client_indices, dropped = _drop_or_refuse_empty_clients(client_indices, scheme, p, n, dataset)
    _check_each_sample_once(client_indices, n, scheme, registry.SCHEME_CLASSES[scheme].leaves_samples_out)

    meta = {
        "dataset": str(dataset),
        "scheme": scheme,
        "params": p,
        "seed": seed,
        "num_samples": n,
        "num_classes": num_classes,
        "num_clients": len(client_indices),
    }
    if dropped:  # only then: other partitions keep their content hash
        meta["dropped_empty_groups"] = dropped
    part = Partition(client_indices, _label_counts(labels, client_indices, num_classes), meta)
    part.content_hash = compute_hash(part.client_indices, part.label_counts, meta)
    logger.debug("partition %s %s seed=%d -> %s", scheme, p, seed, part.content_hash[:12])
    return part


def _check_seed(seed: object) -> int:
    """``seed`` as a plain int; a bool, a non-integer or a negative number is a PartitionError."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _drop_or_refuse_empty_clients(client_indices: list[np.ndarray], scheme: str, p: dict[str, Any], n: int,
                                  dataset: str) -> tuple[list[np.ndarray], list[int]]:
    """The clients that hold a sample, and the ids of the empty ones dropped (none unless the scheme drops them).

    A client without samples has no batches: training would divide by zero or stall. A natural id that no
    sample carries is only a gap in the ids (a writer filtered out upstream): drop it (the scheme sets
    drops_empty_clients). Anywhere else it is a bug or a request check_feasible missed: PartitionError.
    """
    empty = [k for k, ix in enumerate(client_indices) if ix.size == 0]
    if not empty:
        return client_indices, []
    if not registry.SCHEME_CLASSES[scheme].drops_empty_clients:
        raise PartitionError(
            f"{len(empty)} client(s) would hold no sample (client ids {empty[:10]}); use fewer "
            f"clients (or, for quantity/shards, a smaller alpha / shards_per_client) "
            f"{request_context(scheme, p, n, dataset)}"
        )
    logger.info("%s partition%s: group id(s) %s hold no sample; dropped, later ids move down",
                scheme, f" of {dataset!r}" if dataset else "", empty[:20])
    return [ix for ix in client_indices if ix.size], empty


def _check_each_sample_once(client_indices: list[np.ndarray], n: int, scheme: str, leaves_out: bool) -> None:
    """The invariant of every scheme: each of the ``n`` samples is held by exactly one client, or by at most one
    where the scheme leaves samples out by design (`Scheme.leaves_samples_out`); else a bug."""
    held = np.sort(np.concatenate(client_indices)) if client_indices else np.zeros(0, np.int64)
    if leaves_out:
        if held.size and (held[0] < 0 or held[-1] >= n or np.any(held[1:] == held[:-1])):
            raise AssertionError(f"partition scheme {scheme!r} gave a sample to two clients, or one that is not there")
    elif held.size != n or not np.array_equal(held, np.arange(n)):
        raise AssertionError(f"partition scheme {scheme!r} did not assign each sample exactly once")
