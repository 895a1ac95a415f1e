"""Federated algorithms, one file each; `ALGORITHMS` maps the names used in params.yaml.

Every module of this package is imported and every FederatedAlgorithm subclass that
sets its own `name` is registered, so adding a method is adding a file (and running
`python -m fedskew catalog --write`, which derives what validation reads from the class).
The other modules hold no method: the API (`base`), shared maths (`server_math`,
`losses`), FL-FCR's parts (`flfcr_features`, `flfcr_retraining`) and traffic counting.
"""

from fedskew.discovery import discover
from fedskew.fl.base import FederatedAlgorithm

_NOT_METHODS = {"base", "losses"}

# FedAvg first (the baseline), then alphabetical.
ALGORITHMS: dict[str, type[FederatedAlgorithm]] = dict(sorted(
    discover(__name__, __path__, FederatedAlgorithm, _NOT_METHODS).items(),
    key=lambda item: (item[0] != "fedavg", item[0])))
