"""fedfocal: a fedskew method plugin, FedAvg with the focal loss (fedfocal.method.FedFocal).

fedskew finds it through the entry point in pyproject.toml (group `fedskew.methods`), once the package is
installed; importing this package imports no torch.
"""
