"""Seeded label-skew partitioners: assign every training sample to exactly one client.

Schemes (``m`` clients, ``C`` classes, ``n`` samples):

* ``iid`` (clients): uniformly random split into ``m`` equal-as-possible parts.
* ``dirichlet`` D(beta) (clients, beta, min_size=10, max_redraws=1000): FedLC §5.1 /
  NIID-Bench. For each class (in class order) draw ``p ~ Dir(beta * 1_m)``; a client that
  already holds ``>= n/m`` samples gets ``p_j = 0`` for that draw (renormalised); the
  class's shuffled indices are split at ``cumsum(p)``. The whole draw is repeated until
  every client holds ``>= min_size`` samples: one initial draw plus at most
  ``max_redraws`` redraws, then :class:`PartitionError`.
* ``quantity`` Q(alpha) (clients, alpha): FedLC §5.1. Cut the label-sorted data into
  ``m * alpha`` sets of about ``n / (m * alpha)`` samples and hand ``alpha`` random sets to
  each client; no sample is shared. FedLC cuts the sorted array at equal offsets, which
  on imbalanced data lets a set straddle two classes (a client could then hold more than
  ``alpha`` classes). We cut *within* classes instead: class ``c`` gets ``s_c`` sets, with
  ``s_c >= 1`` and ``s_c`` proportional to its size (largest remainder), and its shuffled
  indices are split into ``s_c`` near-equal sets. Every set holds one class, so every
  client holds at most ``alpha`` classes (fewer when it draws two sets of one class, as in
  FedLC). On balanced data whose set size divides the class size (CIFAR-10, 20 clients,
  alpha = 2) this is exactly FedLC's cut. Needs ``m * alpha >= C`` (every class in a set).
* ``quantity_per_label`` (clients, alpha): SCALA's variant. Each class's shuffled data is
  split into ``P = m * alpha / C`` near-equal portions (requires ``C | m * alpha``); every
  client receives ``alpha`` portions of ``alpha`` *distinct* classes and every class hands
  out exactly ``P`` portions. The client-class incidence starts from a cyclic layout (a
  random class order repeated, ``alpha`` consecutive entries per client, hence distinct as
  ``alpha <= C``) and is then randomised by degree-preserving swaps, which keep both
  guarantees.
* ``shards`` (clients, shards_per_client): FedED / FedNTD. Shuffle within each class,
  sort by label, cut into ``m * s`` shards (remainder spread as in ``quantity``), and give
  ``s`` random shards to each client; the same class may repeat. Algorithmically the same
  as ``quantity`` but without the ``alpha <= C`` bound (FedED uses s = 20, 40 for 100/200
  classes) and with its own random stream.
* ``natural`` (no params): client ``k`` holds the samples whose ``natural_groups`` value is
  ``k`` (datasets generated per client, e.g. Synthetic). A group id that no sample carries
  is dropped and the later ids move down by one; the dropped ids are logged and recorded
  in ``meta["dropped_empty_groups"]``.

No scheme may leave a client empty: :func:`check_feasible` refuses requests whose
arithmetic cannot give every client a sample (fedskew.config applies it to params.yaml
before any job runs), and :func:`make_partition` refuses a result with an empty client.

All randomness comes from ``np.random.default_rng([seed, <stable scheme constant>])``, so
the same inputs give the same partition and byte-identical saved artifacts.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMES",
    "SCHEME_PARAMS",
    "SCHEME_DEFAULTS",
    "PartitionError",
    "Partition",
    "check_feasible",
    "make_partition",
    "save_partition",
    "load_partition",
    "plot_heatmap",
]

_FORMAT_VERSION = "fedskew-partition-v1"
# Fixed zip entry timestamp so that saved .npz files are byte-identical across runs.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
# Cells are annotated with counts only when the grid is small enough to read.
_ANNOTATE_MAX_CELLS = 600
_ANNOTATE_MAX_SIDE = 40


class PartitionError(ValueError):
    """An impossible or malformed partition request, or a corrupted partition file."""


@dataclass
class Partition:
    """A client assignment of a training set.

    ``client_indices[k]`` are the sorted int64 training-set indices held by client ``k``;
    ``label_counts[k, c]`` is how many of them have label ``c``; ``meta`` records dataset,
    scheme, params (defaults filled in), seed, num_samples, num_classes and num_clients;
    ``content_hash`` is a sha256 (hex) over meta and the assignment.
    """

    client_indices: list[np.ndarray]
    label_counts: np.ndarray
    meta: dict[str, Any]
    content_hash: str = field(default="")

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.client_indices)

    @property
    def client_sizes(self) -> np.ndarray:
        """Number of samples per client (int64)."""
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)


# --------------------------------------------------------------------------------------
# Parameter specification and validation
# --------------------------------------------------------------------------------------

SCHEME_PARAMS: dict[str, dict[str, type]] = {
    "iid": {"clients": int},
    "dirichlet": {"clients": int, "beta": float, "min_size": int, "max_redraws": int},
    "quantity": {"clients": int, "alpha": int},
    "quantity_per_label": {"clients": int, "alpha": int},
    "shards": {"clients": int, "shards_per_client": int},
    "natural": {},
}
"""Parameter names and types per scheme; names absent from SCHEME_DEFAULTS are required."""

SCHEME_DEFAULTS: dict[str, dict[str, Any]] = {
    "iid": {},
    "dirichlet": {"min_size": 10, "max_redraws": 1000},
    "quantity": {},
    "quantity_per_label": {},
    "shards": {},
    "natural": {},
}
"""Defaults of the optional parameters per scheme."""


def _describe(scheme: str, params: dict[str, Any], n: int, dataset: str) -> str:
    """Context string for error messages: scheme, params, dataset and its size."""
    ds = f"dataset {dataset!r}, " if dataset else ""
    return f"[scheme={scheme!r}, params={params}, {ds}n={n} training samples]"


def _normalise_params(scheme: str, params: dict[str, Any], n: int, dataset: str) -> dict[str, Any]:
    """Check names and types, fill defaults, and cast values to plain Python types."""
    spec = SCHEME_PARAMS[scheme]
    defaults = SCHEME_DEFAULTS[scheme]
    ctx = _describe(scheme, dict(params), n, dataset)
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise PartitionError(
            f"unknown parameter(s) {unknown} for scheme {scheme!r}; allowed: {sorted(spec)} {ctx}"
        )
    missing = sorted(k for k in spec if k not in params and k not in defaults)
    if missing:
        raise PartitionError(f"missing required parameter(s) {missing} for scheme {scheme!r} {ctx}")
    out: dict[str, Any] = {}
    for name, typ in spec.items():
        value = params.get(name, defaults.get(name))
        if isinstance(value, (bool, np.bool_)):
            raise PartitionError(f"parameter {name!r} must be {typ.__name__}, got a bool {ctx}")
        if typ is int:
            if isinstance(value, (int, np.integer)):
                out[name] = int(value)
            elif isinstance(value, (float, np.floating)) and float(value).is_integer():
                out[name] = int(value)
            else:
                raise PartitionError(f"parameter {name!r} must be an integer, got {value!r} {ctx}")
        else:
            if isinstance(value, (int, float, np.integer, np.floating)) and np.isfinite(value):
                out[name] = float(value)
            else:
                raise PartitionError(f"parameter {name!r} must be a finite number, got {value!r} {ctx}")
    return out


def _validate(
    scheme: str, p: dict[str, Any], n: int, num_classes: int, dataset: str, class_counts: np.ndarray | None
) -> None:
    """Reject impossible requests with a message saying what to change (see check_feasible)."""
    ctx = _describe(scheme, p, n, dataset)
    if "clients" in p:
        m = p["clients"]
        if m < 1:
            raise PartitionError(f"clients must be >= 1, got {m} {ctx}")
        if m > n:
            raise PartitionError(
                f"more clients ({m}) than training samples ({n}); use at most {n} clients {ctx}"
            )
    if scheme == "dirichlet":
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
    if scheme in ("quantity", "quantity_per_label"):
        a = p["alpha"]
        if a < 1 or a > num_classes:
            raise PartitionError(
                f"alpha must be in [1, num_classes={num_classes}], got {a} {ctx}"
            )
        present = None if class_counts is None else int((class_counts > 0).sum())
        if scheme == "quantity" and present is not None and p["clients"] * a < present:
            raise PartitionError(
                f"clients*alpha = {p['clients'] * a} single-class sets cannot cover the {present} "
                f"classes present; use more clients or a larger alpha {ctx}"
            )
        if scheme == "quantity" and p["clients"] * a > n:
            raise PartitionError(
                f"clients*alpha = {p['clients'] * a} sets exceed the {n} samples (a set would be "
                f"empty); use fewer clients or a smaller alpha {ctx}"
            )
    if scheme == "quantity_per_label":
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
    if scheme == "shards":
        s = p["shards_per_client"]
        if s < 1:
            raise PartitionError(f"shards_per_client must be >= 1, got {s} {ctx}")
        if p["clients"] * s > n:
            raise PartitionError(
                f"clients*shards_per_client = {p['clients'] * s} shards exceed the {n} samples "
                f"(a shard would be empty); use fewer clients or fewer shards per client {ctx}"
            )


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
    if scheme not in SCHEMES:
        raise PartitionError(
            f"unknown partition scheme {scheme!r}; choose one of {sorted(SCHEMES)} "
            f"{_describe(scheme, dict(params), n, dataset)}"
        )
    p = _normalise_params(scheme, params, n, dataset)
    _validate(scheme, p, n, int(num_classes), dataset, class_counts)
    return p


# --------------------------------------------------------------------------------------
# Schemes. Each takes (labels, num_classes, params, rng, natural_groups, dataset) and
# returns one int64 index array per client (order irrelevant; sorted afterwards).
# --------------------------------------------------------------------------------------

SchemeFn = Callable[..., list[np.ndarray]]


def _class_indices(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of each class, shuffled within the class (classes in label order)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    out = []
    for c in range(num_classes):
        ix = order[bounds[c] : bounds[c + 1]].astype(np.int64, copy=True)
        rng.shuffle(ix)
        out.append(ix)
    return out


def _iid(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
         natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
    """Random permutation cut into ``clients`` parts whose sizes differ by at most one."""
    perm = rng.permutation(len(labels)).astype(np.int64)
    return list(np.array_split(perm, params["clients"]))


def _dirichlet(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
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
        f"more max_redraws {_describe('dirichlet', params, n, dataset)}"
    )


def _sorted_sets(labels: np.ndarray, num_classes: int, num_sets: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Label-sorted (shuffled within class) indices cut into ``num_sets`` contiguous sets.

    The remainder ``n mod num_sets`` goes to the first sets in label order, one each.
    """
    flat = np.concatenate(_class_indices(labels, num_classes, rng))
    return list(np.array_split(flat, num_sets))


def _deal_sets(sets: list[np.ndarray], m: int, per_client: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Give ``per_client`` random sets to each of ``m`` clients, without replacement."""
    perm = rng.permutation(len(sets))
    return [
        np.concatenate([sets[i] for i in perm[k * per_client : (k + 1) * per_client]])
        for k in range(m)
    ]


def _class_pure_sets(labels: np.ndarray, num_classes: int, num_sets: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """``num_sets`` near-equal sets, each from one class; set counts per class ∝ class size.

    Every non-empty class gets at least one set; the remaining sets go by largest
    remainder of ``num_sets * n_c / n`` (ties to the smaller class index).
    """
    by_class = _class_indices(labels, num_classes, rng)
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


def _quantity(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
              natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
    """FedLC's Q(alpha): m*alpha single-class sets, alpha random sets per client."""
    m, a = params["clients"], params["alpha"]
    return _deal_sets(_class_pure_sets(labels, num_classes, m * a, rng), m, a, rng)


def _shards(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
            natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
    """FedED/FedNTD shards(s): m*s label-sorted shards, s random shards per client."""
    m, s = params["clients"], params["shards_per_client"]
    return _deal_sets(_sorted_sets(labels, num_classes, m * s, rng), m, s, rng)


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


def _quantity_per_label(labels: np.ndarray, num_classes: int, params: dict[str, Any],
                        rng: np.random.Generator, natural_groups: np.ndarray | None = None,
                        dataset: str = "") -> list[np.ndarray]:
    """SCALA's Q(alpha): each class cut into m*alpha/C portions, alpha distinct classes per client."""
    m, a = params["clients"], params["alpha"]
    portions_per_class = m * a // num_classes
    portions = [list(np.array_split(ix, portions_per_class))
                for ix in _class_indices(labels, num_classes, rng)]
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


def _natural(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
             natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
    """Client k = samples with natural_groups == k, for k = 0..max id (make_partition drops empty ones)."""
    n = len(labels)
    ctx = _describe("natural", params, n, dataset)
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


SCHEMES: dict[str, SchemeFn] = {
    "iid": _iid,
    "dirichlet": _dirichlet,
    "quantity": _quantity,
    "quantity_per_label": _quantity_per_label,
    "shards": _shards,
    "natural": _natural,
}
"""Scheme name -> fn(labels, num_classes, params, rng, natural_groups, dataset) -> client index arrays."""


# --------------------------------------------------------------------------------------
# Building, hashing, saving, loading
# --------------------------------------------------------------------------------------


def _scheme_constant(scheme: str) -> int:
    """Stable 32-bit constant per scheme, mixed into the seed (independent streams)."""
    return int.from_bytes(hashlib.sha256(scheme.encode()).digest()[:4], "little")


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _compute_hash(client_indices: list[np.ndarray], label_counts: np.ndarray, meta: dict[str, Any]) -> str:
    """sha256 over format version, canonical meta, per-client indices and label counts."""
    h = hashlib.sha256()
    h.update(_FORMAT_VERSION.encode())
    h.update(_canonical_json(meta).encode())
    h.update(np.int64(len(client_indices)).astype("<i8").tobytes())
    for ix in client_indices:
        h.update(np.int64(len(ix)).astype("<i8").tobytes())
        h.update(np.ascontiguousarray(ix, dtype="<i8").tobytes())
    lc = np.ascontiguousarray(label_counts, dtype="<i8")
    h.update(np.array(lc.shape, dtype="<i8").tobytes())
    h.update(lc.tobytes())
    return h.hexdigest()


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
    labels = _check_labels(labels, num_classes, _describe(scheme, params, n_guess, dataset))
    num_classes = int(num_classes)
    n = int(labels.shape[0])
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    p = check_feasible(scheme, params, n, num_classes, np.bincount(labels, minlength=num_classes), dataset)

    rng = np.random.default_rng([seed, _scheme_constant(scheme)])
    raw = SCHEMES[scheme](labels, num_classes, p, rng, natural_groups=natural_groups, dataset=dataset)
    client_indices = [np.sort(np.asarray(ix, dtype=np.int64)) for ix in raw]
    # A client without samples has no batches: training would divide by zero or stall. A
    # natural id that no sample carries is only a gap in the ids (a writer filtered out
    # upstream): drop it. Anywhere else it is a bug or a request check_feasible missed.
    empty = [k for k, ix in enumerate(client_indices) if ix.size == 0]
    if empty and scheme == "natural":
        logger.info("natural partition%s: group id(s) %s hold no sample; dropped, later ids move down",
                    f" of {dataset!r}" if dataset else "", empty[:20])
        client_indices = [ix for ix in client_indices if ix.size]
    elif empty:
        raise PartitionError(
            f"{len(empty)} client(s) would hold no sample (client ids {empty[:10]}); use fewer "
            f"clients (or, for quantity/shards, a smaller alpha / shards_per_client) "
            f"{_describe(scheme, p, n, dataset)}"
        )

    # Internal invariant: every sample exactly once.
    allix = np.concatenate(client_indices) if client_indices else np.zeros(0, np.int64)
    if allix.size != n or not np.array_equal(np.sort(allix), np.arange(n)):
        raise AssertionError(f"partition scheme {scheme!r} did not assign each sample exactly once")

    label_counts = _label_counts(labels, client_indices, num_classes)
    meta = {
        "dataset": str(dataset),
        "scheme": scheme,
        "params": p,
        "seed": seed,
        "num_samples": n,
        "num_classes": num_classes,
        "num_clients": len(client_indices),
    }
    if empty and scheme == "natural":  # only then: other partitions keep their content hash
        meta["dropped_empty_groups"] = empty
    part = Partition(client_indices, label_counts, meta)
    part.content_hash = _compute_hash(client_indices, label_counts, meta)
    logger.debug("partition %s %s seed=%d -> %s", scheme, p, seed, part.content_hash[:12])
    return part


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _npz_bytes(arrays: list[tuple[str, np.ndarray]]) -> bytes:
    """A deterministic .npz (zip, stored, fixed timestamps) readable by ``np.load``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays:
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.create_system = 3
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def _summary_json(p: Partition) -> str:
    """Human-readable summary: meta, hash, per-client sizes and label counts (one row per line)."""
    doc = {
        "format": _FORMAT_VERSION,
        "meta": p.meta,
        "content_hash": p.content_hash,
        "client_sizes": p.client_sizes.tolist(),
        "label_counts": p.label_counts.tolist(),
    }
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True)
    # Collapse lists of integers onto one line so that label_counts reads as a table.
    text = re.sub(
        r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]",
        lambda mt: "[" + ", ".join(s.strip() for s in mt.group(1).split(",")) + "]",
        text,
    )
    return text + "\n"


def save_partition(p: Partition, npz_path: Path) -> None:
    """Write ``npz_path`` (arrays + meta + hash) and its ``.json`` summary, each atomically.

    Same partition -> byte-identical files (fixed key order, no timestamps).
    """
    npz_path = Path(npz_path)
    sizes = p.client_sizes
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = (np.concatenate(p.client_indices) if p.client_indices else np.zeros(0)).astype(np.int64)
    arrays = [
        ("indices", flat),
        ("offsets", offsets),
        ("label_counts", np.asarray(p.label_counts, dtype=np.int64)),
        ("meta_json", np.frombuffer(_canonical_json(p.meta).encode(), dtype=np.uint8)),
        ("content_hash", np.frombuffer(p.content_hash.encode(), dtype=np.uint8)),
        ("format", np.frombuffer(_FORMAT_VERSION.encode(), dtype=np.uint8)),
    ]
    _atomic_write_bytes(npz_path, _npz_bytes(arrays))
    _atomic_write_bytes(npz_path.with_suffix(".json"), _summary_json(p).encode())


def load_partition(npz_path: Path) -> Partition:
    """Read a partition written by :func:`save_partition` and verify its content hash.

    A missing key, a hash mismatch (tampered indices, counts or meta) or a ``.json``
    sidecar whose hash disagrees raises :class:`PartitionError`.
    """
    npz_path = Path(npz_path)
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            flat = z["indices"].astype(np.int64)
            offsets = z["offsets"].astype(np.int64)
            label_counts = z["label_counts"].astype(np.int64)
            meta = json.loads(z["meta_json"].tobytes().decode())
            stored = z["content_hash"].tobytes().decode()
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise PartitionError(f"cannot read partition file {npz_path}: {exc}") from exc
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != flat.size \
            or np.any(np.diff(offsets) < 0):
        raise PartitionError(f"corrupted partition file {npz_path}: inconsistent offsets")
    client_indices = [flat[offsets[k] : offsets[k + 1]].copy() for k in range(offsets.size - 1)]
    actual = _compute_hash(client_indices, label_counts, meta)
    if actual != stored:
        raise PartitionError(
            f"content hash mismatch for {npz_path}: stored {stored[:16]}..., recomputed "
            f"{actual[:16]}...; the file was modified or corrupted, regenerate the partition"
        )
    side = npz_path.with_suffix(".json")
    if side.exists():
        try:
            side_hash = json.loads(side.read_text()).get("content_hash")
        except (ValueError, OSError) as exc:
            raise PartitionError(f"cannot read partition summary {side}: {exc}") from exc
        if side_hash != stored:
            raise PartitionError(
                f"{side} records content hash {str(side_hash)[:16]}... but {npz_path} holds "
                f"{stored[:16]}...; the two files do not belong together, regenerate them"
            )
    return Partition(client_indices, label_counts, meta, stored)


def plot_heatmap(p: Partition, png_path: Path, title: str | None = None) -> None:
    """Clients x classes heatmap of sample counts (like FedLC Figure 4), written atomically.

    Counts are written in the cells when the grid is small enough to read. Uses the Agg
    canvas directly, so the pyplot backend of the caller is left untouched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(p.label_counts)
    m, c = counts.shape
    annotate = m * c <= _ANNOTATE_MAX_CELLS and max(m, c) <= _ANNOTATE_MAX_SIDE
    cell = 0.55 if annotate else 0.14
    width = min(max(4.0, c * cell + 2.0), 30.0)
    height = min(max(3.0, m * cell + 1.5), 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title is None:
        meta = p.meta
        title = f"{meta.get('dataset', '') or 'data'}: {meta.get('scheme', '')} {meta.get('params', {})}"
    ax.set_title(title, fontsize=9)
    if c <= 50:
        ax.set_xticks(range(c))
    if m <= 50:
        ax.set_yticks(range(m))
    if annotate:
        vmax = counts.max() if counts.size else 0
        font = 7 if max(m, c) > 20 else 8
        for i in range(m):
            for j in range(c):
                v = int(counts[i, j])
                color = "black" if vmax and v > 0.6 * vmax else "white"
                ax.text(j, i, str(v), ha="center", va="center", fontsize=font, color=color)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    _atomic_write_bytes(Path(png_path), buf.getvalue())
