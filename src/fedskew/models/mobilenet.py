"""MobileNetV2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks",
CVPR 2018) in its CIFAR form: FedED's backbone on CIFAR10/100 and TinyImageNet ("following
Shi et al., 2023a", i.e. FedDecorr; FedED's code README: "the same model structure of
Mobilenet_v2 as CCVR" — neither gives the layers, so the usual CIFAR variant is used:
docs/methods.md, "MobileNetV2 for CIFAR").

Written for this project (not copied) from the paper's Table 2 and §3–4.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from fedskew.data.registry import DatasetInfo
from fedskew.models.net import SplittableNet

# Sandler et al., Table 2: (expansion t, output channels c, repeats n, first stride s), with
# the CIFAR change (docs/methods.md, "MobileNetV2 for CIFAR"): the second stage's stride 2 → 1
# (and the stem's, below).
CIFAR_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),  # ImageNet: s = 2
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
STEM_CHANNELS = 32
LAST_CHANNELS = 1280


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1,
             relu: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
    ]
    if relu:
        layers.append(nn.ReLU6())
    return layers


class InvertedResidual(nn.Module):
    """Sandler et al.'s bottleneck (Table 1): 1×1 expansion to t·c_in channels + BN + ReLU6
    (left out when t = 1), 3×3 depthwise conv with the stride + BN + ReLU6, 1×1 linear
    projection to c_out + BN (no activation: the "linear bottleneck"). The input is added
    back only when stride is 1 and c_in = c_out, as in the paper."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_channels * expansion
        layers = [] if expansion == 1 else _conv_bn(in_channels, hidden, 1)
        layers += _conv_bn(hidden, hidden, 3, stride=stride, groups=hidden)
        layers += _conv_bn(hidden, out_channels, 1, relu=False)
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.residual else out


def mobilenetv2(info: DatasetInfo) -> SplittableNet:
    """MobileNetV2, CIFAR variant (FedED's backbone for CIFAR10/100 and TinyImageNet).

    Sandler et al.'s Table 2 at width 1.0: stem 3×3 conv 32 + BN + ReLU6; seven bottleneck
    stages (t, c, n, s) = (1,16,1,1), (6,24,2,·), (6,32,3,2), (6,64,4,2), (6,96,3,1),
    (6,160,3,2), (6,320,1,1); 1×1 conv 1280 + BN + ReLU6; global average pooling →
    1280 features → head fc 1280 → num_classes.

    CIFAR changes (docs/methods.md, "MobileNetV2 for CIFAR"): the stem's stride 2 → 1 and the
    second stage's (c = 24) stride 2 → 1, so a 32×32 image is downsampled 8× (to 4×4), not 32×.

    Readings: ReLU6 as in the paper; residual connections only where the shape is kept,
    as in the paper (some CIFAR re-implementations add 1×1 conv shortcuts elsewhere, which
    adds parameters); no dropout before the classifier (the paper's Table 2 has none;
    torchvision adds 0.2); convolutions without bias; He-normal init of the convolutions.
    The stem takes the dataset's channels.

    Needs images of side ≥ 16: the net downsamples by 8, and the last BatchNorms must see at
    least 2×2 maps to train on a batch of one sample.
    Split points (stage boundaries): "stage2" (default: the full-resolution part, stem and
    stages 1–2, on the client), "stem", "stage1", "stage3" … "stage7", "last" (the 1×1 conv).
    """
    stages: OrderedDict[str, nn.Module] = OrderedDict(
        stem=nn.Sequential(*_conv_bn(info.input_shape[0], STEM_CHANNELS, 3, stride=1)))
    in_channels = STEM_CHANNELS
    for i, (expansion, out_channels, repeats, stride) in enumerate(CIFAR_STAGES, start=1):
        blocks = [InvertedResidual(in_channels if j == 0 else out_channels, out_channels,
                                   stride if j == 0 else 1, expansion) for j in range(repeats)]
        stages[f"stage{i}"] = nn.Sequential(*blocks)
        in_channels = out_channels
    stages["last"] = nn.Sequential(*_conv_bn(in_channels, LAST_CHANNELS, 1))
    stages["pool"] = nn.AdaptiveAvgPool2d(1)
    stages["flatten"] = nn.Flatten()
    points = ("stage2", "stem", "stage1", *(f"stage{i}" for i in range(3, len(CIFAR_STAGES) + 1)), "last")
    net = SplittableNet(stages, LAST_CHANNELS, info.num_classes, points)
    for layer in net.body.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out")
    return net
