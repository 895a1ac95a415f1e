"""Seeded label-skew partitioners: assign every training sample to exactly one client.

One file per scheme, the ``scheme`` of params.yaml (``m`` clients, ``C`` classes, ``n`` samples);
each file's docstring says how its scheme draws:

* ``iid`` (clients), iid.py: uniformly random split into ``m`` equal-as-possible parts.
* ``dirichlet`` D(beta) (clients, beta, min_size=10, max_redraws=1000), dirichlet.py: FedLC §5.1 /
  NIID-Bench, with bounded redraws until every client holds ``>= min_size`` samples.
* ``quantity`` Q(alpha) (clients, alpha), quantity.py: FedLC §5.1, ``m * alpha`` single-class sets,
  ``alpha`` per client (cut within classes).
* ``quantity_per_label`` (clients, alpha), quantity_per_label.py: SCALA's variant, ``alpha`` portions
  of ``alpha`` distinct classes per client.
* ``shards`` (clients, shards_per_client), shards.py: FedED / FedNTD, ``s`` label-sorted shards per client.
* ``natural`` (no params), natural.py: the clients a dataset was generated with (``natural_groups``).

Shared code: base.py (the `Scheme` base class, `Partition`, `PartitionError`, the helpers several
schemes draw with), registry.py (the schemes by name), build.py (`check_feasible`, `make_partition`),
store.py (content hash, `save_partition` / `load_partition`), heatmap.py (`plot_heatmap`).

Adding a scheme is adding a file here plus its entry in workflow/schemas/params.schema.yaml (a test
keeps the two in sync): a `Scheme` subclass that sets ``name``, ``parameters`` (and ``defaults`` of
the optional ones), implements ``sample`` (the draw) and ``check`` (its feasibility rules). Every
module of the package is imported and every such subclass is registered.

No scheme may leave a client empty: :func:`check_feasible` refuses requests whose
arithmetic cannot give every client a sample (fedskew.config applies it to params.yaml
before any job runs), and :func:`make_partition` refuses a result with an empty client.

All randomness comes from ``np.random.default_rng([seed, <stable scheme constant>])``, so
the same inputs give the same partition and byte-identical saved artifacts.
"""

from fedskew.data.partitions.base import Partition, PartitionError
from fedskew.data.partitions.build import check_feasible, make_partition
from fedskew.data.partitions.heatmap import plot_heatmap
from fedskew.data.partitions.registry import SCHEME_DEFAULTS, SCHEME_PARAMS, SCHEMES
from fedskew.data.partitions.store import load_partition, save_partition

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
