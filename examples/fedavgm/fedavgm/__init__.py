"""fedavgm: a fedskew method plugin, FedAvg with server momentum (fedavgm.method.FedAvgM).

fedskew finds it through the entry point in pyproject.toml (group `fedskew.methods`), once the package is
installed; importing this package imports no torch.
"""
