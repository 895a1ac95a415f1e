"""The shape every model has (a named body of stages plus a linear head) and the input checks.

Kept apart from the registry (`fedskew.models`) so that the model files (`paper_nets`,
`resnet`, `mobilenet`) can import it without importing the registry that imports them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from fedskew.catalog import InputNeeds  # noqa: F401 - defined torch-free, re-exported for the models


class SplittableNet(nn.Module):
    """body: nn.Sequential of named stages producing features; head: the linear classifier.

    `split_points` maps a split point's name to the body stage after which the model is cut
    (a model's own names, e.g. AlexNet's S1–S5, or simply the stage name); the first
    entry is the default split.
    """

    def __init__(self, stages: OrderedDict[str, nn.Module], feature_dim: int, num_classes: int,
                 split_points: dict[str, str] | tuple[str, ...]):
        super().__init__()
        self.body = nn.Sequential(stages)
        self.head = nn.Linear(feature_dim, num_classes)
        if not isinstance(split_points, dict):
            split_points = {stage: stage for stage in split_points}
        unknown = set(split_points.values()) - set(stages)
        if unknown or not split_points:
            raise ValueError(f"split points must name stages of the body; unknown: {sorted(unknown)}")
        self.split_points = dict(split_points)

    @property
    def default_split(self) -> str:
        return next(iter(self.split_points))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


