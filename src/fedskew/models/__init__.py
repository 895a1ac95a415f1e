"""Model registry. Every model is a named body (feature extractor) plus a linear head.

Methods that use features (MOON, FedDecorr, FL-FCR, FedNTD) call `model.body` and
`model.head` separately; split learning cuts `model.body` at one of `split_points`
(the names of the body's stages after which a cut is allowed).
"""

from __future__ import annotations

from collections import OrderedDict
from math import prod

import torch
from torch import nn

from fedskew.data.registry import DatasetInfo


class SplittableNet(nn.Module):
    """body: nn.Sequential of named stages producing features; head: the linear classifier."""

    def __init__(self, stages: OrderedDict[str, nn.Module], feature_dim: int, num_classes: int,
                 split_points: tuple[str, ...]):
        super().__init__()
        self.body = nn.Sequential(stages)
        self.head = nn.Linear(feature_dim, num_classes)
        unknown = set(split_points) - set(stages)
        if unknown:
            raise ValueError(f"split points {sorted(unknown)} are not stages of the body")
        self.split_points = split_points

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def logreg(info: DatasetInfo) -> SplittableNet:
    """Multinomial logistic regression (FedLC's model for Synthetic)."""
    dim = prod(info.input_shape)
    return SplittableNet(OrderedDict(flatten=nn.Flatten()), dim, info.num_classes, ())


def mlp(info: DatasetInfo, hidden: int = 200) -> SplittableNet:
    """Two hidden layers of ReLU units."""
    stages = OrderedDict(
        flatten=nn.Flatten(),
        fc1=nn.Linear(prod(info.input_shape), hidden), relu1=nn.ReLU(),
        fc2=nn.Linear(hidden, hidden), relu2=nn.ReLU(),
    )
    return SplittableNet(stages, hidden, info.num_classes, ("relu1", "relu2"))


def cnn(info: DatasetInfo, hidden: int = 128) -> SplittableNet:
    """A small CNN for small images (the offline digits): two 3×3 convs, one pool, one fc.

    Sized for CPU runs of the default suite (16/32 channels); the papers' CNNs live
    beside it once the full-scale datasets are added.
    """
    channels, height, width = info.input_shape
    stages = OrderedDict(
        conv1=nn.Conv2d(channels, 16, 3, padding=1), relu1=nn.ReLU(),
        conv2=nn.Conv2d(16, 32, 3, padding=1), relu2=nn.ReLU(),
        pool=nn.MaxPool2d(2), flatten=nn.Flatten(),
        fc1=nn.Linear(32 * (height // 2) * (width // 2), hidden), relu3=nn.ReLU(),
    )
    return SplittableNet(stages, hidden, info.num_classes, ("relu1", "pool", "relu3"))


MODELS = {"logreg": logreg, "mlp": mlp, "cnn": cnn}
IMAGE_ONLY = {"cnn"}


def incompatibility(name: str, info: DatasetInfo) -> str | None:
    """Why model `name` cannot run on a dataset like `info`, or None if it can."""
    if name not in MODELS:
        return f"unknown model {name!r}; known: {', '.join(MODELS)}"
    if name in IMAGE_ONLY and not info.is_image:
        return f"model {name!r} needs image inputs [C, H, W], but the dataset gives vectors of shape {info.input_shape}"
    return None


def build_model(name: str, info: DatasetInfo) -> SplittableNet:
    problem = incompatibility(name, info)
    if problem:
        raise ValueError(problem)
    return MODELS[name](info)
