"""The shape every model has (a named body of stages plus a linear head) and the input checks.

Kept apart from the registry (`fedskew.models`) so that the model files (`paper_nets`,
`resnet`, `mobilenet`) can import it without importing the registry that imports them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from fedskew.data.registry import DatasetInfo


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


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(side) for side in shape)


@dataclass(frozen=True)
class InputNeeds:
    """What a model needs of a dataset's inputs.

    image: it needs images [C, H, W] (vectors are refused).
    shapes: the exact image shapes [C, H, W] it is defined for (empty: any channels and size);
        `why` says what pins them (a paper's table, a fixed flatten size).
    min_side: the smallest image side it takes; `why` says why.
    """

    image: bool = False
    shapes: tuple[tuple[int, int, int], ...] = ()
    min_side: int = 1
    why: str = ""

    def problem(self, name: str, info: DatasetInfo) -> str | None:
        """Why model `name` cannot take inputs like `info`'s, or None if it can."""
        given = (f"images of shape {_shape(info.input_shape)}" if info.is_image
                 else f"vectors of shape {info.input_shape}")
        if (self.image or self.shapes) and not info.is_image:
            return f"model {name!r} needs image inputs [C, H, W], but the dataset gives {given}"
        if self.shapes and tuple(info.input_shape) not in self.shapes:
            wanted = " or ".join(_shape(shape) for shape in self.shapes)
            return f"model {name!r} needs {wanted} images ({self.why}), but the dataset gives {given}"
        if info.is_image and min(info.input_shape[1:]) < self.min_side:
            reason = f" ({self.why})" if self.why else ""
            return (f"model {name!r} needs images of at least {self.min_side}×{self.min_side}{reason}, "
                    f"but the dataset gives {given}")
        return None
