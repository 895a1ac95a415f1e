"""ResNets in their CIFAR form (He et al., "Deep Residual Learning for Image Recognition",
CVPR 2016): ResNet-18 with a 3×3 stride-1 stem and no max-pool, and ResNet-32 of §4.2.

Written for this project (not copied): the layers follow the paper's description. Both end
in global average pooling, so they take any image size (see `MIN_SIDE`) and any number of
input channels (the stem takes C channels).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.data.registry import DatasetInfo
from fedskew.models.net import SplittableNet


class ZeroPadShortcut(nn.Module):
    """He et al.'s option A shortcut: identity, subsampled by `stride`, with the extra
    channels filled with zeros (half before and half after the input's). No parameters."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.stride = stride
        extra = out_channels - in_channels
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, *self.pad))


class BasicBlock(nn.Module):
    """Two 3×3 conv + BatchNorm layers with a shortcut: relu(bn2(conv2(relu(bn1(conv1 x)))) + s(x)).

    s is the identity when the shape is kept; when it changes, a 1×1 conv + BatchNorm
    (option B, "projection") or `ZeroPadShortcut` (option A).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, shortcut: str):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride == 1 and in_channels == out_channels:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "A":
            self.shortcut = ZeroPadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _init_convs(module: nn.Module) -> None:
    """He et al.'s initialisation ("as in [13]", i.e. He et al. 2015) for every convolution;
    BatchNorm starts at weight 1, bias 0 (PyTorch's default)."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")


def _resnet(info: DatasetInfo, widths: tuple[int, ...], blocks: int, shortcut: str) -> SplittableNet:
    channels = info.input_shape[0]
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=nn.Sequential(OrderedDict(
        conv=nn.Conv2d(channels, widths[0], 3, stride=1, padding=1, bias=False),
        bn=nn.BatchNorm2d(widths[0]), relu=nn.ReLU())))
    in_channels = widths[0]
    for i, width in enumerate(widths, start=1):
        stride = 1 if i == 1 else 2
        layer = [BasicBlock(in_channels, width, stride, shortcut)]
        layer += [BasicBlock(width, width, 1, shortcut) for _ in range(blocks - 1)]
        stages[f"layer{i}"] = nn.Sequential(*layer)
        in_channels = width
    stages["pool"] = nn.AdaptiveAvgPool2d(1)
    stages["flatten"] = nn.Flatten()
    # Default cut: at the end of the full-resolution part (layer1), before the first downsampling.
    points = ("layer1", "stem", *(f"layer{i}" for i in range(2, len(widths) + 1)))
    net = SplittableNet(stages, in_channels, info.num_classes, points)
    _init_convs(net.body)
    return net


def resnet18(info: DatasetInfo) -> SplittableNet:
    """ResNet-18, CIFAR variant (used by FedLC on ImageNet-subset 64×64, FedED's Table 3 on CIFAR10).

    He et al.'s ResNet-18 (Table 1: BasicBlocks [2, 2, 2, 2], widths 64/128/256/512, stages
    2–4 start with stride 2) with the CIFAR stem used throughout the FL literature: one 3×3
    conv, stride 1, padding 1, 64 channels, BatchNorm, ReLU, and no max-pool (the ImageNet
    stem's 7×7 stride-2 conv and max-pool would shrink 32×32 inputs to 8×8 at once). Then
    global average pooling → 512 features → head fc 512 → num_classes.

    Readings: shortcuts where the shape changes are 1×1 conv + BatchNorm projections (option
    B, as in He et al.'s ImageNet ResNets and torchvision), which the usual 11.17M count
    assumes; convolutions carry no bias (BatchNorm follows each); He-normal init. On 64×64
    inputs (ImageNet-subset, TinyImageNet) the same net leaves 8×8 maps before the pool:
    FedLC does not say which stem it used there; we keep the CIFAR one.

    Needs images of side ≥ 16: the net downsamples by 8, and the last BatchNorms must see at
    least 2×2 maps to train on a batch of one sample (the engine's last batch can be one).
    Split points (stage boundaries): "layer1" (default: the full-resolution part, stem and
    layer1, on the client), "stem", "layer2", "layer3", "layer4".
    """
    return _resnet(info, (64, 128, 256, 512), 2, shortcut="B")


def resnet32(info: DatasetInfo) -> SplittableNet:
    """ResNet-32 for CIFAR (He et al. 2016, §4.2; FedED's Table 3 on CIFAR10).

    6n + 2 layers with n = 5: a 3×3 conv with 16 channels (stride 1, padding 1) + BatchNorm +
    ReLU; three stages of n BasicBlocks with 16, 32, 64 channels on 32×32, 16×16 and 8×8
    maps (stages 2 and 3 start with stride 2); global average pooling → 64 features →
    head fc 64 → num_classes.

    Readings: option A shortcuts, as He et al. use on CIFAR ("we use identity shortcuts in
    all cases (i.e., option A)"): parameter-free, subsampled identity with the new channels
    zero-padded; so the net has exactly the paper's 0.46M parameters (464,154 for 10
    classes). Convolutions without bias; He-normal init.

    Needs images of side ≥ 8: the net downsamples by 4, and the last BatchNorms must see at
    least 2×2 maps to train on a batch of one sample.
    Split points: "layer1" (default: the full-resolution part on the client), "stem",
    "layer2", "layer3".
    """
    return _resnet(info, (16, 32, 64), 5, shortcut="A")
