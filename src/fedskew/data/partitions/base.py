"""What every partition scheme shares: the `Scheme` base class, the `Partition` record, `PartitionError`,
and what more than one scheme draws with (`class_indices`; `DealtSets`, the base of quantity and shards).

A `Scheme` subclass that sets its own ``name`` in a module of the package, or that an installed package declares
as an entry point of group ``fedskew.partitions``, is registered under that name
(fedskew.data.partitions.registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedskew.data.partitions.parameters import Parameter


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


def request_context(scheme: str, params: dict[str, Any], n: int, dataset: str) -> str:
    """Context string for error messages: scheme, params, dataset and its size."""
    ds = f"dataset {dataset!r}, " if dataset else ""
    return f"[scheme={scheme!r}, params={params}, {ds}n={n} training samples]"


class Scheme:
    """A partition scheme: its name, its parameters, its feasibility rules and its draw.

    The class is the one source of what the scheme is: validation (the schema's clause of the scheme, derived
    from ``parameters``), the listings and the partition job read it. Subclass it in a module of
    fedskew.data.partitions, or in a package of your own declared as an entry point of group
    ``fedskew.partitions``, and set ``name`` (the ``scheme`` of params.yaml) and ``parameters``; implement
    ``sample`` and, for rules of its own, ``check``. The class is never instantiated: its methods are class and
    static methods.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    """The numerics version of the draw: raised when a change moves the partitions it draws (tests/fingerprints/),
    which redraws them and retrains the runs on them. The `version` a class sets in its own body, 1 if it sets
    none (read without importing: fedskew.discovery.declared_versions)."""
    parameters: ClassVar[dict[str, Parameter]] = {}
    """Each parameter's declaration (`Parameter`: type, allowed values, default); one without a default is
    required."""
    defaults: ClassVar[dict[str, Any]] = {}
    """The defaults of the optional parameters (derived from ``parameters``)."""
    drops_empty_clients: ClassVar[bool] = False
    """Whether a client that receives no sample is dropped (a gap in given ids) rather than refused."""
    leaves_samples_out: ClassVar[bool] = False
    """Whether the draw leaves some samples to no client by design (a long tail thins its classes); every
    other scheme gives each sample to exactly one client. No scheme gives a sample to two."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.version = vars(cls).get("version", 1)
        # Whatever `parameters` holds: a declaration that is not a Parameter is refused, with its reason, when
        # the class is registered (registry.scheme_problem), where a plugin's error can name its entry point.
        declared = cls.parameters if isinstance(cls.parameters, dict) else {}
        cls.defaults = {key: p.default for key, p in declared.items() if isinstance(p, Parameter) and not p.required}

    @classmethod
    def normalise(cls, params: dict[str, Any], n: int, dataset: str) -> dict[str, Any]:
        """Check names and types, fill defaults, and cast values to plain Python types."""
        spec = cls.parameters
        defaults = cls.defaults
        ctx = request_context(cls.name, dict(params), n, dataset)
        unknown = sorted(set(params) - set(spec))
        if unknown:
            raise PartitionError(
                f"unknown parameter(s) {unknown} for scheme {cls.name!r}; allowed: {sorted(spec)} {ctx}"
            )
        missing = sorted(k for k in spec if k not in params and k not in defaults)
        if missing:
            raise PartitionError(f"missing required parameter(s) {missing} for scheme {cls.name!r} {ctx}")
        out: dict[str, Any] = {}
        for name, declared in spec.items():
            typ = declared.type
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

    @classmethod
    def validate(cls, p: dict[str, Any], n: int, num_classes: int, dataset: str,
                 class_counts: np.ndarray | None) -> None:
        """Reject impossible requests with a message saying what to change (see check_feasible).

        ``p`` are the normalised params; ``class_counts`` may be None (not known in advance). The
        rules of the parameters several schemes share (``clients``, ``alpha``) come first, then the
        scheme's own (``check``).
        """
        ctx = request_context(cls.name, p, n, dataset)
        if "clients" in p:
            m = p["clients"]
            if m < 1:
                raise PartitionError(f"clients must be >= 1, got {m} {ctx}")
            if m > n:
                raise PartitionError(
                    f"more clients ({m}) than training samples ({n}); use at most {n} clients {ctx}"
                )
        if "alpha" in p:  # classes per client
            a = p["alpha"]
            if a < 1 or a > num_classes:
                raise PartitionError(
                    f"alpha must be in [1, num_classes={num_classes}], got {a} {ctx}"
                )
        cls.check(p, n, num_classes, class_counts, ctx)

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        """The scheme's own feasibility rules; ``ctx`` ends every message (see request_context)."""

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """One int64 index array per client (order irrelevant; sorted afterwards), drawn from ``rng``."""
        raise NotImplementedError


def class_indices(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of each class, shuffled within the class (classes in label order)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    out = []
    for c in range(num_classes):
        ix = order[bounds[c] : bounds[c + 1]].astype(np.int64, copy=True)
        rng.shuffle(ix)
        out.append(ix)
    return out


def _deal_sets(sets: list[np.ndarray], m: int, per_client: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Give ``per_client`` random sets to each of ``m`` clients, without replacement."""
    perm = rng.permutation(len(sets))
    return [
        np.concatenate([sets[i] for i in perm[k * per_client : (k + 1) * per_client]])
        for k in range(m)
    ]


class DealtSets(Scheme):
    """Cut the data into ``clients * k`` sets and deal ``k`` random sets to each client (quantity, shards).

    A scheme sets ``per_client`` (the name of its ``k``), ``set_word`` and ``remedy`` (for the message
    of a request with more sets than samples) and implements ``cut``.
    """

    per_client: ClassVar[str]
    set_word: ClassVar[str]
    remedy: ClassVar[str]

    @classmethod
    def check(cls, p: dict[str, Any], n: int, num_classes: int, class_counts: np.ndarray | None, ctx: str) -> None:
        k = cls.per_client
        if p[k] < 1:
            raise PartitionError(f"{k} must be >= 1, got {p[k]} {ctx}")
        if p["clients"] * p[k] > n:
            raise PartitionError(
                f"clients*{k} = {p['clients'] * p[k]} {cls.set_word}s exceed the {n} samples (a {cls.set_word} "
                f"would be empty); use fewer clients or {cls.remedy} {ctx}"
            )

    @classmethod
    def sample(cls, labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """``clients * k`` sets from ``cut``, ``k`` random ones per client."""
        m, k = params["clients"], params[cls.per_client]
        return _deal_sets(cls.cut(labels, num_classes, m * k, rng), m, k, rng)

    @staticmethod
    def cut(labels: np.ndarray, num_classes: int, num_sets: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The data cut into ``num_sets`` non-empty sets."""
        raise NotImplementedError
