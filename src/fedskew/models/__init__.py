"""Model registry. Every model is a named body (feature extractor) plus a linear head.

Methods that use features (MOON, FedDecorr, FL-FCR, FedNTD) call `model.body` and
`model.head` separately; split learning cuts `model.body` at one of `split_points`
(a name → the body stage after which the cut falls; see `fedskew.models.split`).

The small generic nets and SCALA's AlexNet are here; the papers' other models live in
`paper_nets` (FedLC's CNNs, FedED's DNN, FL-FCR's MLP and CNN), `resnet` (ResNet-18/32)
and `mobilenet` (MobileNetV2). Each is declared in BUILT_IN as a `Model`: its builder and what it
needs of its inputs (`InputNeeds`), whose `problem` turns that into a message naming the model,
its need and the dataset's shape. An installed package adds a model by an entry point of group
`fedskew.models` that names a `Model` of its own (docs/configuration.md, **Models**); MODELS
and NEEDS hold those too. What validation and `fedskew models` know of each model (split points,
feature width, summary) is derived from these declarations (fedskew.catalog.describe_model), never
written by hand.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import cache
from math import prod

from torch import nn

from fedskew import catalog, plugins
from fedskew.catalog import Model
from fedskew.data.registry import DatasetInfo
from fedskew.models.dropout import Dropout
from fedskew.models.mobilenet import mobilenetv2
from fedskew.models.net import InputNeeds, SplittableNet
from fedskew.models.paper_nets import (
    FEDLC_CIFAR_SHAPE,
    FEDLC_MNIST_SHAPE,
    fed_dnn,
    fedlc_cnn_cifar,
    fedlc_cnn_mnist,
    flfcr_cnn,
    flfcr_mlp,
)
from fedskew.models.resnet import resnet18, resnet32
from fedskew.numerics import cpu_pin
from fedskew.numerics.gemm import portable_layers

__all__ = ["BUILT_IN", "MODELS", "NEEDS", "VERSIONS", "IMAGE_ONLY", "MIN_IMAGE_SIDE", "InputNeeds", "Model",
           "SplittableNet", "build_model", "declared", "example_info", "incompatibility"]


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
    CINIC10) did not survive text extraction, so this is a reconstruction from the text and the
    CIFAR AlexNet of public FL code (docs/methods.md, "SCALA's AlexNet"): conv
    64→192→384→256→256, all 3×3 with padding 1, each followed by ReLU; 2×2 max-pool after
    conv1, conv2 and conv5; flatten; dropout 0.5; fc 4096 + ReLU; dropout 0.5; fc 4096 + ReLU;
    head fc 4096 → num_classes. The Fashion-MNIST variant is
    our reconstruction too: the same net with one input channel on 28×28 inputs. The
    flatten size follows the input (256·4·4 for 32×32, 256·3·3 for 28×28, 256·1·1 for the
    offline 8×8 digits), so the net builds for any image at least 8×8. Its dropout layers are
    fedskew's `Dropout` (fedskew.models.dropout): a client's masks come from its own generator.

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
        drop1=Dropout(0.5), fc1=nn.Linear(256 * pooled, hidden), relu6=nn.ReLU(),
        drop2=Dropout(0.5), fc2=nn.Linear(hidden, hidden), relu7=nn.ReLU(),
    )
    # S2 first: it is the default (SCALA's "first 6 layers on the client").
    split_points = {"S2": "relu4", "S1": "pool2", "S3": "pool3", "S4": "relu6", "S5": "relu7"}
    return SplittableNet(stages, hidden, info.num_classes, split_points)


_POOLS = "its three 2×2 pools must leave a pixel"
_BN_MIN = "BatchNorm must see at least 2×2 maps after the net's {}× downsampling to train on a batch of one"
# The built-in models, in the order `fedskew models` lists them, each with what it needs of its inputs: the
# flattening models take anything (vectors, or images of any shape), the others are checked.
BUILT_IN: dict[str, Model] = {
    "logreg": Model(logreg),
    "mlp": Model(mlp),
    "cnn": Model(cnn, InputNeeds(image=True, min_side=2, why="its 2×2 pool must leave a pixel")),
    "alexnet": Model(alexnet, InputNeeds(image=True, min_side=8, why=_POOLS)),
    "fedlc_cnn_mnist": Model(fedlc_cnn_mnist, InputNeeds(
        image=True, shapes=(FEDLC_MNIST_SHAPE,),
        why="FedLC Table 8: conv1 takes 1 channel and fc1 320 = 20·4·4 features, which only 28×28 gives")),
    "fedlc_cnn_cifar": Model(fedlc_cnn_cifar, InputNeeds(
        image=True, shapes=(FEDLC_CIFAR_SHAPE,),
        why="FedLC Table 9: conv1 takes 3 channels and fc1 2048 = 128·4·4 features, which only 32×32 gives")),
    "resnet18": Model(resnet18, InputNeeds(image=True, min_side=16, why=_BN_MIN.format(8))),
    "resnet32": Model(resnet32, InputNeeds(image=True, min_side=8, why=_BN_MIN.format(4))),
    "mobilenetv2": Model(mobilenetv2, InputNeeds(image=True, min_side=16, why=_BN_MIN.format(8))),
    "fed_dnn": Model(fed_dnn),
    "flfcr_mlp": Model(flfcr_mlp),
    "flfcr_cnn": Model(flfcr_cnn, InputNeeds(image=True, min_side=8, why=_POOLS)),
}
# Each built-in model's numerics version (its layers, their initialisation, its forward pass): raised when a change
# moves the bits it computes (tests/fingerprints/), which gives its runs new ids. A literal: run ids read it from
# this file without importing it (fedskew.discovery.module_constant). A plugin's is its declaration's `version`.
VERSIONS: dict[str, int] = {
    "logreg": 1, "mlp": 1, "cnn": 1, "alexnet": 1, "fedlc_cnn_mnist": 1, "fedlc_cnn_cifar": 1, "resnet18": 1,
    "resnet32": 1, "mobilenetv2": 1, "fed_dnn": 1, "flfcr_mlp": 1, "flfcr_cnn": 1,
}
assert set(VERSIONS) == set(BUILT_IN) and all(model.version == 1 for model in BUILT_IN.values()), \
    "a built-in model's version is its entry in VERSIONS, not its declaration's"


@cache
def declared() -> dict[str, Model]:
    """Every model's declaration by name: the built-in ones, then the installed plugins' (entry points of group
    fedskew.models, checked and described by fedskew.catalog.models)."""
    loaded = plugins.loaded("model")
    return {**BUILT_IN, **{name: loaded[name].obj for name, record in catalog.models().items() if "plugin" in record}}


# The tables of every model, plugins' included, made from declared() when first read (module __getattr__), not
# on import: a plugin's module imports this package, so loading the plugins here would import it half-made.
_TABLES = {
    "MODELS": lambda: {name: model.build for name, model in declared().items()},  # name -> builder
    "NEEDS": lambda: {name: model.needs for name, model in declared().items()},
    "IMAGE_ONLY": lambda: {name for name, model in declared().items() if model.needs.image},
    # the smallest image side each image model can take (a fixed-shape model: its own side)
    "MIN_IMAGE_SIDE": lambda: {name: max([model.needs.min_side, *(min(shape[1:]) for shape in model.needs.shapes)])
                               for name, model in declared().items() if model.needs.image},
}


def __getattr__(name: str):
    if name in _TABLES:
        return _TABLES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def incompatibility(name: str, info: DatasetInfo) -> str | None:
    """Why model `name` cannot run on a dataset like `info`, or None if it can."""
    models = declared()
    if name not in models:
        return f"unknown model {name!r}; known: {', '.join(models)}"
    return models[name].needs.problem(name, info)


def example_info(name: str, num_classes: int = 10) -> DatasetInfo:
    """A dataset shape model `name` supports, for listing its structure: its own shape if it
    has one, else 3×32×32 images for image models and 64-vectors for the others (InputNeeds.example)."""
    return declared()[name].needs.example(num_classes)


def build_model(name: str, info: DatasetInfo) -> SplittableNet:
    """Model `name` for a dataset like `info`. Its Linear and Conv2d layers compute their CPU products
    under the portable kernels' recipe for this model (fedskew.numerics.cpu_pin.kernel_recipe, fedskew.numerics.gemm)."""
    problem = incompatibility(name, info)
    if problem:
        raise ValueError(problem)
    model = declared()[name].build(info)
    return portable_layers(model) if cpu_pin.kernel_recipe(name) >= 2 else model
