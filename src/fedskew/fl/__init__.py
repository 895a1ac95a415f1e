"""Federated algorithms, one file each; `ALGORITHMS` maps the names used in params.yaml."""

from fedskew.fl.base import FederatedAlgorithm
from fedskew.fl.fedavg import FedAvg
from fedskew.fl.fedlc import FedLC
from fedskew.fl.fedprox import FedProx

ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {cls.name: cls for cls in (FedAvg, FedProx, FedLC)}
