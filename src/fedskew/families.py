"""The families of methods, known without importing torch.

A family decides which round the engine runs (fedskew.engine.simulation): a federated method
trains a copy of the whole model on each client (fedskew.fl), a split one cuts the model
between the clients and the server (fedskew.sfl). Every algorithm class names its family
(`Algorithm.family`), which fedskew.catalog serves to validation; a new family is one member here.
A method also names the panel the accuracy-curve figures draw it in (`Algorithm.panel`, fedskew.report.figures).
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """A method family; its value is the word params.yaml, listings and reports print."""

    FEDERATED = "federated"  # each client trains the whole model; the server folds their uploads
    SPLIT = "split"          # each client trains the layers below a cut; the server trains the rest


class Panel(StrEnum):
    """The panel of the accuracy-curve figures a method is drawn in when a suite has many methods
    (fedskew.report.method_families); its value is the panel's title. A composition takes its first parent's."""

    PLAIN = "plain FL"
    DRIFT = "drift correction"
    CALIBRATION = "logit calibration (label skew)"
    SPLIT = "split learning"
