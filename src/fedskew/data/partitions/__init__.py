"""Seeded label-skew partitioners: assign every training sample to exactly one client.

One file per scheme, the ``scheme`` of params.yaml; each file's docstring says how its scheme draws
(``m`` clients, ``C`` classes, ``n`` samples).

Shared code: base.py (the `Scheme` base class, `Partition`, `PartitionError`, the helpers several
schemes draw with), parameters.py (`Parameter`, what a scheme declares of each parameter, and the
schema clause derived from it), registry.py (the schemes by name, built-in and plugins'), build.py
(`check_feasible`, `make_partition`), store.py (content hash, `save_partition` / `load_partition`),
heatmap.py (`plot_heatmap`).

Adding a scheme is adding a file here and its test: a `Scheme` subclass that sets ``name``, declares
``parameters`` (a `Parameter` each: type, allowed values, default; one without a default is required),
implements ``sample`` (the draw) and ``check`` (its feasibility rules). Every module of the package is
imported and every such subclass is registered; params.yaml's schema takes its clause from the class
(fedskew.config_schema.params_schema). A scheme of a package of one's own is the same subclass, declared
as an entry point of group ``fedskew.partitions`` (``python -m fedskew new partition NAME`` writes one).

No scheme may leave a client empty: :func:`check_feasible` refuses requests whose
arithmetic cannot give every client a sample (fedskew.config applies it to params.yaml
before any job runs), and :func:`make_partition` refuses a result with an empty client.

All randomness comes from ``np.random.default_rng([seed, <stable scheme constant>])``, so
the same inputs give the same partition and byte-identical saved artifacts.
"""

from fedskew.data.partitions import registry
from fedskew.data.partitions.base import Partition, PartitionError, Scheme
from fedskew.data.partitions.build import check_feasible, make_partition
from fedskew.data.partitions.heatmap import plot_heatmap
from fedskew.data.partitions.parameters import Parameter
from fedskew.data.partitions.store import load_partition, save_partition

__all__ = [
    "SCHEMES",
    "SCHEME_PARAMS",
    "SCHEME_DEFAULTS",
    "Scheme",
    "Parameter",
    "PartitionError",
    "Partition",
    "check_feasible",
    "make_partition",
    "save_partition",
    "load_partition",
    "plot_heatmap",
]


def __getattr__(name: str) -> dict:
    """SCHEMES, SCHEME_PARAMS and SCHEME_DEFAULTS: the registry's, which include the plugins' schemes and so are
    made when first read (fedskew.data.partitions.registry)."""
    if name in ("SCHEMES", "SCHEME_PARAMS", "SCHEME_DEFAULTS"):
        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
