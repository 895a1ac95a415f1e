"""fedskew: a reproducible benchmark of federated and split-federated learning under label skew."""

__version__ = "0.1.0"
