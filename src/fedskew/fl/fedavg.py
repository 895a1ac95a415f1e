"""FedAvg (McMahan et al., 2017): local SGD, sample-weighted averaging. All of it is the base."""

from fedskew.fl.base import FederatedAlgorithm


class FedAvg(FederatedAlgorithm):
    name = "fedavg"
