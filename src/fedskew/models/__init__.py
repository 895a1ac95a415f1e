"""Model registry. Every model is a named body (feature extractor) plus a linear head.

Methods that use features (MOON, FedDecorr, FL-FCR, FedNTD) call `model.body` and
`model.head` separately; split learning cuts `model.body` at one of `split_points`
(a name → the body stage after which the cut falls; see `fedskew.models.split`).
"""

from __future__ import annotations

from collections import OrderedDict
from math import prod

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


def logreg(info: DatasetInfo) -> SplittableNet:
    """Multinomial logistic regression (FedLC's model for Synthetic)."""
    dim = prod(info.input_shape)
    # The only cut: the (parameter-free) flatten on the client, the linear layer on the server.
    return SplittableNet(OrderedDict(flatten=nn.Flatten()), dim, info.num_classes, ("flatten",))


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
    # Default cut after the conv block: the client keeps the convolutions (as AlexNet's S2 does).
    return SplittableNet(stages, hidden, info.num_classes, ("pool", "relu1", "relu3"))


def alexnet(info: DatasetInfo, hidden: int = 4096) -> SplittableNet:
    """SCALA's AlexNet (Appendix E), cut into client and server parts as in §5.1 and Appendix H.

    The figures of Appendix E (Figure 5 for Fashion-MNIST, Figure 6 for CIFAR10/100 and
    CINIC10) did not survive text extraction, so this is a reconstruction from the text and
    METHODS.md: conv 64→192→384→256→256, all 3×3 with padding 1, each followed by ReLU;
    2×2 max-pool after conv1, conv2 and conv5; flatten; dropout 0.5; fc 4096 + ReLU;
    dropout 0.5; fc 4096 + ReLU; head fc 4096 → num_classes. The Fashion-MNIST variant is
    our reconstruction too: the same net with one input channel on 28×28 inputs. The
    flatten size follows the input (256·4·4 for 32×32, 256·3·3 for 28×28, 256·1·1 for the
    offline 8×8 digits), so the net builds for any image at least 8×8.

    Layer count (SCALA: "the first 6 layers as the client-side model and the last 8 layers
    as the server-side model", 14 in all): a conv with its ReLU is one layer, and pools,
    flatten and dropouts each count as one:
        1 conv1, 2 pool1, 3 conv2, 4 pool2, 5 conv3, 6 conv4, 7 conv5, 8 pool3,
        9 flatten, 10 dropout, 11 fc1, 12 dropout, 13 fc2, 14 fc3 (the head).
    So the paper's default cut is after conv4 (stage relu4): split point S2, because
    Table 8's S2 row equals the default results of Table 5. Figure 8, which placed S1–S5,
    is lost; our S1 (after layer 4), S3 (8), S4 (11) and S5 (13) are a reconstruction
    chosen so that each point moves the cut deeper, matching Appendix H's statement that
    accuracy falls as the split gets deeper.
    """
    channels, height, width = info.input_shape
    pooled = (height // 2 // 2 // 2) * (width // 2 // 2 // 2)  # three 2×2 pools, floor each time
    stages = OrderedDict(
        conv1=nn.Conv2d(channels, 64, 3, padding=1), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(64, 192, 3, padding=1), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        conv3=nn.Conv2d(192, 384, 3, padding=1), relu3=nn.ReLU(),
        conv4=nn.Conv2d(384, 256, 3, padding=1), relu4=nn.ReLU(),
        conv5=nn.Conv2d(256, 256, 3, padding=1), relu5=nn.ReLU(), pool3=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        drop1=nn.Dropout(0.5), fc1=nn.Linear(256 * pooled, hidden), relu6=nn.ReLU(),
        drop2=nn.Dropout(0.5), fc2=nn.Linear(hidden, hidden), relu7=nn.ReLU(),
    )
    # S2 first: it is the default (SCALA's "first 6 layers on the client").
    split_points = {"S2": "relu4", "S1": "pool2", "S3": "pool3", "S4": "relu6", "S5": "relu7"}
    return SplittableNet(stages, hidden, info.num_classes, split_points)


MODELS = {"logreg": logreg, "mlp": mlp, "cnn": cnn, "alexnet": alexnet}
IMAGE_ONLY = {"cnn", "alexnet"}
# The smallest image side each image model can take: its pools must leave at least one pixel.
MIN_IMAGE_SIDE = {"cnn": 2, "alexnet": 8}


def incompatibility(name: str, info: DatasetInfo) -> str | None:
    """Why model `name` cannot run on a dataset like `info`, or None if it can."""
    if name not in MODELS:
        return f"unknown model {name!r}; known: {', '.join(MODELS)}"
    if name in IMAGE_ONLY and not info.is_image:
        return f"model {name!r} needs image inputs [C, H, W], but the dataset gives vectors of shape {info.input_shape}"
    if info.is_image and min(info.input_shape[1:]) < MIN_IMAGE_SIDE.get(name, 1):
        return (f"model {name!r} needs images of at least {MIN_IMAGE_SIDE[name]}×{MIN_IMAGE_SIDE[name]}, "
                f"but the dataset gives {info.input_shape}")
    return None


def build_model(name: str, info: DatasetInfo) -> SplittableNet:
    problem = incompatibility(name, info)
    if problem:
        raise ValueError(problem)
    return MODELS[name](info)
