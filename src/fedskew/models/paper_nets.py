"""The papers' own small networks: FedLC's two CNNs (Tables 8–9), FedED's DNN for MNIST and
FL-FCR's MLP and CNN (Table I). Each docstring cites its source and lists every reading we
made where the text is incomplete or inconsistent."""

from __future__ import annotations

from collections import OrderedDict
from math import prod

from torch import nn

from fedskew.data.registry import DatasetInfo
from fedskew.models.net import SplittableNet

FEDLC_MNIST_SHAPE = (1, 28, 28)
FEDLC_CIFAR_SHAPE = (3, 32, 32)


def _require_shape(name: str, info: DatasetInfo, shape: tuple[int, int, int]) -> None:
    if not info.is_image or tuple(info.input_shape) != shape:
        raise ValueError(f"model {name!r} is defined for {shape} images only, not {info.input_shape}")


def fedlc_cnn_mnist(info: DatasetInfo) -> SplittableNet:
    """FedLC's CNN for MNIST and FMNIST (Zhang et al., ICML 2022, Appendix A.1, Table 8).

    Table 8 (shapes written (c_in, c_out, k, k) and (c_in, c_out)):
    conv1 [1, 10, 5, 5] stride 1 padding 0; max-pool; conv2 [10, 20, 5, 5] stride 1
    padding 0; max-pool; fc1 [320, 50]; fc2 [50, 10]. "All non-linear activation function
    in these architectures is ReLu."

    Readings:
    - The pools: the table gives "stride=2, padding=2" and no window. A 2×2 window with
      padding 2 is impossible (PyTorch allows at most half the window) and would not give
      320; we read "2" as the 2×2 window: kernel 2, stride 2, no padding. Then
      28 → conv 24 → pool 12 → conv 8 → pool 4, and 20·4·4 = 320 as fc1 needs.
    - ReLU after conv1, conv2 and fc1 (every layer but the logits); conv → ReLU → pool
      (max-pool and ReLU commute, so the order does not change the function).
    - No dropout: the table lists every layer, parameter-free pools included, and no dropout.
    - fc2 is the head (50 → num_classes: 10 for MNIST/FMNIST, 62 for FEMNIST, which FedLC
      also runs with "two CNN architectures"); the feature vector is fc1's ReLU output (50).

    Only 1×28×28 inputs: fc1's 320 inputs pin the image shape.
    Split points: "pool2" (default: the client keeps both convolutions), "pool1", "relu3".
    """
    _require_shape("fedlc_cnn_mnist", info, FEDLC_MNIST_SHAPE)
    stages = OrderedDict(
        conv1=nn.Conv2d(1, 10, 5), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2, 2),
        conv2=nn.Conv2d(10, 20, 5), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2, 2),
        flatten=nn.Flatten(),
        fc1=nn.Linear(320, 50), relu3=nn.ReLU(),
    )
    return SplittableNet(stages, 50, info.num_classes, ("pool2", "pool1", "relu3"))


def fedlc_cnn_cifar(info: DatasetInfo) -> SplittableNet:
    """FedLC's CNN for CIFAR10 (Zhang et al., ICML 2022, Appendix A.1, Table 9).

    Table 9: conv1 [3, 128, 3, 3]; max-pool; conv2 [128, 128, 3, 3]; max-pool;
    conv3 [128, 128, 3, 3]; max-pool; fc1 [2048, 10]. ReLU is the only non-linearity.

    Readings:
    - Convolution padding 1, against the table's "padding=0": 2048 = 128·4·4 needs the 32×32
      input halved three times exactly (32 → 16 → 8 → 4), which only "same" 3×3 convolutions
      give; with padding 0 the maps shrink 32 → 30 → 15 → 13 → 6 → 4 → 2 and fc1 would take
      512 (docs/methods.md, "FedLC's CIFAR CNN").
    - The pools: "stride=2, padding=2" read as for Table 8: a 2×2 window, stride 2, no padding.
    - ReLU after each convolution (conv → ReLU → pool); no dropout (none is listed).
    - fc1 is the only fully connected layer, so it is the head (2048 → num_classes: 10 for
      CIFAR10/SVHN, 100 for CIFAR100, where FedLC also uses this net); the feature vector is
      the flattened conv3 block (2048).

    Only 3×32×32 inputs: fc1's 2048 inputs pin the image shape.
    Split points: "pool2" (default: the client keeps two of the three convolutions),
    "pool1", "pool3".
    """
    _require_shape("fedlc_cnn_cifar", info, FEDLC_CIFAR_SHAPE)
    stages = OrderedDict(
        conv1=nn.Conv2d(3, 128, 3, padding=1), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2, 2),
        conv2=nn.Conv2d(128, 128, 3, padding=1), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2, 2),
        conv3=nn.Conv2d(128, 128, 3, padding=1), relu3=nn.ReLU(), pool3=nn.MaxPool2d(2, 2),
        flatten=nn.Flatten(),
    )
    return SplittableNet(stages, 128 * 4 * 4, info.num_classes, ("pool2", "pool1", "pool3"))


def fed_dnn(info: DatasetInfo, hidden: tuple[int, int] = (200, 200)) -> SplittableNet:
    """FedED's DNN for MNIST (Guo et al., FedED, "Models and baselines"): "a deep neural
    network (DNN) containing three fully connected layers".

    Readings: the paper (and its code's README) gives no layer sizes. We take McMahan et
    al.'s (2017) MNIST "2NN", the standard three-fully-connected-layer net of federated
    learning: flatten → fc 200 + ReLU → fc 200 + ReLU → head fc 200 → num_classes. It
    takes any input (the flatten size follows the input), vectors included; FedED uses it
    only for MNIST (1×28×28 → 784 inputs).
    Split points: "relu1" (default: the client keeps the first layer), "relu2".
    """
    first, second = hidden
    stages = OrderedDict(
        flatten=nn.Flatten(),
        fc1=nn.Linear(prod(info.input_shape), first), relu1=nn.ReLU(),
        fc2=nn.Linear(first, second), relu2=nn.ReLU(),
    )
    return SplittableNet(stages, second, info.num_classes, ("relu1", "relu2"))


FLFCR_MLP_HIDDEN = (512, 256, 128, 64)


def flfcr_mlp(info: DatasetInfo) -> SplittableNet:
    """FL-FCR's MLP for MNIST and Adult Income (FL-FCR, §V-A-3 and Table I).

    Table I: Input; Hidden-512 + ReLU; Hidden-256 + ReLU; Hidden-128 + ReLU;
    Hidden-64 + ReLU; Output. So: flatten → 512 → 256 → 128 → 64 (each + ReLU) → head
    64 → num_classes; the feature vector is the 64-wide last hidden layer.

    Readings:
    - The input size follows the dataset: prod(input_shape). FL-FCR states 2352 input
      features for MNIST (= 3·28·28, so MNIST apparently converted to RGB); our MNIST is
      1×28×28, hence 784. Adult Income: the paper's 14 raw attributes; we take whatever
      vector the dataset gives (after its encoding).
    - Output: FL-FCR trains Adult Income with one output and binary cross-entropy; here
      every model ends in num_classes logits and cross-entropy, so Adult has 2 outputs
      (softmax over two logits is the same model family as a sigmoid over their difference).
    Split points: "relu1" (default: the client keeps the first hidden layer), "relu2",
    "relu3", "relu4".
    """
    stages: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = prod(info.input_shape)
    for i, out in enumerate(FLFCR_MLP_HIDDEN, start=1):
        stages[f"fc{i}"] = nn.Linear(width, out)
        stages[f"relu{i}"] = nn.ReLU()
        width = out
    points = tuple(f"relu{i}" for i in range(1, len(FLFCR_MLP_HIDDEN) + 1))
    return SplittableNet(stages, width, info.num_classes, points)


def flfcr_cnn(info: DatasetInfo) -> SplittableNet:
    """FL-FCR's CNN for CIFAR-10 (FL-FCR, §V-A-3 and Table I).

    Table I (VGG notation, "conv3-N" = 3×3 convolution with N output channels):
    conv3-128 + maxpool; conv3-256 + maxpool; 2 × conv3-512; conv3-256 + maxpool;
    FC-512; FC-256; FC-128; FC-10 (+ ReLU).

    Readings:
    - The extracted table interleaves the MLP's and the CNN's rows; we read the CNN as the
      conv rows followed by the FC rows, in the order printed.
    - Convolutions as in VGG, whose notation the table uses: stride 1, padding 1, each
      followed by ReLU (the table names no activation for them, and a CNN without one is
      linear up to its pools); max-pools 2×2, stride 2. No BatchNorm, no dropout (none listed).
    - FC-512, FC-256, FC-128 each + ReLU; "FC-10 + ReLu" is read as the 10 logits (the
      head, 128 → num_classes) with the ReLU belonging to the hidden FCs: a ReLU on logits
      would clip every negative logit, which cross-entropy and logit calibration need.
      The feature vector is FC-128's ReLU output.
    - The flatten size follows the input (256·4·4 = 4096 for CIFAR's 32×32; 256·3·3 for
      28×28), so the net takes any image whose three pools leave a pixel (side ≥ 8) and any
      number of channels; FL-FCR uses it on CIFAR-10 only.
    Split points: "pool2" (default: the client keeps the first two conv blocks), "pool1",
    "relu4", "pool3", "relu6".
    """
    channels, height, width = info.input_shape
    pooled = (height // 2 // 2 // 2) * (width // 2 // 2 // 2)
    stages = OrderedDict(
        conv1=nn.Conv2d(channels, 128, 3, padding=1), relu1=nn.ReLU(), pool1=nn.MaxPool2d(2, 2),
        conv2=nn.Conv2d(128, 256, 3, padding=1), relu2=nn.ReLU(), pool2=nn.MaxPool2d(2, 2),
        conv3=nn.Conv2d(256, 512, 3, padding=1), relu3=nn.ReLU(),
        conv4=nn.Conv2d(512, 512, 3, padding=1), relu4=nn.ReLU(),
        conv5=nn.Conv2d(512, 256, 3, padding=1), relu5=nn.ReLU(), pool3=nn.MaxPool2d(2, 2),
        flatten=nn.Flatten(),
        fc1=nn.Linear(256 * pooled, 512), relu6=nn.ReLU(),
        fc2=nn.Linear(512, 256), relu7=nn.ReLU(),
        fc3=nn.Linear(256, 128), relu8=nn.ReLU(),
    )
    return SplittableNet(stages, 128, info.num_classes, ("pool2", "pool1", "relu4", "pool3", "relu6"))
