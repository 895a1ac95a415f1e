"""The families of methods, known without importing torch.

A family decides which round the engine runs (fedskew.engine.simulation): a federated method
trains a copy of the whole model on each client (fedskew.fl), a split one cuts the model
between the clients and the server (fedskew.sfl). Every algorithm class names its family
(`Algorithm.family`) and fedskew.catalog.FAMILIES restates it for validation; a new family is
one member here.
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """A method family; its value is the word params.yaml, listings and reports print."""

    FEDERATED = "federated"  # each client trains the whole model; the server folds their uploads
    SPLIT = "split"          # each client trains the layers below a cut; the server trains the rest
