"""What params.yaml can name, known without importing torch.

Validating params.yaml (every command's first step, `python -m fedskew validate` and the
Snakefile) and the listings need a few facts about the things params.yaml names: each
dataset source's input shape and classes, what each model needs of its inputs, where
it can be cut and how wide its features are, each method's hyperparameters with their
defaults and which of them another one turns off. The registries that build those things
(fedskew.data.registry, fedskew.models, fedskew.algorithms) import torch, which takes
seconds; these give the same answers in no time.

Methods: each class is the one source of what it is (fedskew.declarations). `methods()` serves the built-in
ones from catalog.json, which `python -m fedskew catalog --write` derives from the classes (a test fails while
it is stale, fedskew.derived), and a plugin's from its class (fedskew.plugins). Runs take their defaults from
here (Params.method_spec), so a default is changed in the class and the derived file rewritten.
Datasets and models: the tables below restate their registries, and tests/unit/test_catalog.py compares every
entry with them (it builds every model on the meta device; the feature widths are compared in
tests/unit/test_config.py) and, when one disagrees, prints the entry to write here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fedskew import plugins
from fedskew.declarations import describe_method, first_paragraph
from fedskew.families import Family

# --- dataset sources (fedskew.data.registry) ---------------------------------------------

DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": {"test_fraction": 0.2, "seed": 0},
    "synthetic": {"lam": 1.0, "mu": 1.0, "clients": 100, "dim": 60, "classes": 10, "seed": 0},
    "mnist": {}, "fashionmnist": {}, "cifar10": {}, "cifar100": {}, "svhn": {},
    "cinic10": {},
    "tinyimagenet": {},
    "femnist": {"writers": 100, "seed": 0},
    "adult": {},
    "imagenet_subset": {"imagenet_dir": None},
}


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and a partitioner need to know about a dataset without loading it."""

    input_shape: tuple[int, ...]
    num_classes: int
    is_image: bool
    has_natural_partition: bool


@dataclass(frozen=True)
class Source:
    """A dataset source: its inputs ([C, H, W] images or vectors), classes, and how it arrives:
    "embedded" (generated here, no network), "download" (fetched and checked against pinned
    md5s, or placed by hand when offline) or "by hand" (no download exists: files placed by hand)."""

    input_shape: tuple[int, ...]
    num_classes: int
    has_natural_partition: bool
    arrives: str


SOURCES: dict[str, Source] = {
    "digits": Source((1, 8, 8), 10, False, "embedded"),
    # synthetic's shape and classes are its spec's `dim` and `classes` (these are the defaults)
    "synthetic": Source((60,), 10, True, "embedded"),
    "mnist": Source((1, 28, 28), 10, False, "download"),
    "fashionmnist": Source((1, 28, 28), 10, False, "download"),
    "cifar10": Source((3, 32, 32), 10, False, "download"),
    "cifar100": Source((3, 32, 32), 100, False, "download"),
    "svhn": Source((3, 32, 32), 10, False, "download"),
    "cinic10": Source((3, 32, 32), 10, False, "download"),
    "tinyimagenet": Source((3, 64, 64), 200, False, "download"),
    "femnist": Source((1, 28, 28), 62, True, "by hand"),
    "adult": Source((105,), 2, False, "download"),  # fedskew.data.datasets.adult.NUM_FEATURES
    "imagenet_subset": Source((3, 64, 64), 12, False, "by hand"),
}


# The raw files of each source fedskew fetches (named as downloaded, and as a local folder or data/raw/<source>/
# must hold them) and the host its first URL names: what `python -m fedskew datasets` checks for and shows.
# femnist and imagenet_subset have no such files (a tree of JSON files, a local ILSVRC-2012 copy).
RAW_FILES: dict[str, tuple[str, ...]] = {
    "mnist": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
              "t10k-labels-idx1-ubyte.gz"),
    "fashionmnist": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                     "t10k-labels-idx1-ubyte.gz"),
    "cifar10": ("cifar-10-python.tar.gz",),
    "cifar100": ("cifar-100-python.tar.gz",),
    "svhn": ("train_32x32.mat", "test_32x32.mat"),
    "cinic10": ("CINIC-10.tar.gz",),
    "tinyimagenet": ("tiny-imagenet-200.zip",),
    "adult": ("adult.data", "adult.test"),
}
DOWNLOAD_HOSTS: dict[str, str] = {
    "mnist": "ossci-datasets.s3.amazonaws.com",
    "fashionmnist": "fashion-mnist.s3-website.eu-central-1.amazonaws.com",
    "cifar10": "www.cs.toronto.edu",
    "cifar100": "www.cs.toronto.edu",
    "svhn": "ufldl.stanford.edu",
    "cinic10": "datashare.ed.ac.uk",
    "tinyimagenet": "cs231n.stanford.edu",
    "adult": "archive.ics.uci.edu",
}


def dataset_info(spec: dict) -> DatasetInfo:
    """fedskew.data.registry.dataset_info without torch."""
    if spec["source"] not in SOURCES:
        raise ValueError(f"unknown dataset source {spec['source']!r}")
    source = SOURCES[spec["source"]]
    shape, classes = source.input_shape, source.num_classes
    if spec["source"] == "synthetic":
        shape, classes = (spec["dim"],), spec["classes"]
    return DatasetInfo(shape, classes, len(shape) == 3, source.has_natural_partition)


# --- models (fedskew.models) ----------------------------------------------------------------

@dataclass(frozen=True)
class InputNeeds:
    """What a model needs of a dataset's inputs (fedskew.models.NEEDS, whose `problem` this restates).

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


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(side) for side in shape)


_POOLS = "its three 2×2 pools must leave a pixel"
_BN_MIN = "BatchNorm must see at least 2×2 maps after the net's {}× downsampling to train on a batch of one"
MODEL_NEEDS: dict[str, InputNeeds] = {
    "logreg": InputNeeds(),
    "mlp": InputNeeds(),
    "cnn": InputNeeds(image=True, min_side=2, why="its 2×2 pool must leave a pixel"),
    "alexnet": InputNeeds(image=True, min_side=8, why=_POOLS),
    "fedlc_cnn_mnist": InputNeeds(image=True, shapes=((1, 28, 28),),
                                  why="FedLC Table 8: conv1 takes 1 channel and fc1 320 = 20·4·4 features, "
                                      "which only 28×28 gives"),
    "fedlc_cnn_cifar": InputNeeds(image=True, shapes=((3, 32, 32),),
                                  why="FedLC Table 9: conv1 takes 3 channels and fc1 2048 = 128·4·4 features, "
                                      "which only 32×32 gives"),
    "resnet18": InputNeeds(image=True, min_side=16, why=_BN_MIN.format(8)),
    "resnet32": InputNeeds(image=True, min_side=8, why=_BN_MIN.format(4)),
    "mobilenetv2": InputNeeds(image=True, min_side=16, why=_BN_MIN.format(8)),
    "fed_dnn": InputNeeds(),
    "flfcr_mlp": InputNeeds(),
    "flfcr_cnn": InputNeeds(image=True, min_side=8, why=_POOLS),
}

# Each model's split points (model.split_points), the default first; they do not depend on the input.
SPLIT_POINTS: dict[str, tuple[str, ...]] = {
    "logreg": ("flatten",),
    "mlp": ("relu1", "relu2"),
    "cnn": ("pool", "relu1", "relu3"),
    "alexnet": ("S2", "S1", "S3", "S4", "S5"),
    "fedlc_cnn_mnist": ("pool2", "pool1", "relu3"),
    "fedlc_cnn_cifar": ("pool2", "pool1", "pool3"),
    "resnet18": ("layer1", "stem", "layer2", "layer3", "layer4"),
    "resnet32": ("layer1", "stem", "layer2", "layer3"),
    "mobilenetv2": ("stage2", "stem", "stage1", "stage3", "stage4", "stage5", "stage6", "stage7", "last"),
    "fed_dnn": ("relu1", "relu2"),
    "flfcr_mlp": ("relu1", "relu2", "relu3", "relu4"),
    "flfcr_cnn": ("pool2", "pool1", "relu4", "pool3", "relu6"),
}


# Split points named apart from the body stage they cut after (model.split_points[point] = stage).
SPLIT_STAGES: dict[str, dict[str, str]] = {
    "alexnet": {"S2": "relu4", "S1": "pool2", "S3": "pool3", "S4": "relu6", "S5": "relu7"},
}


def model_summary(doc: str | None) -> str:
    """A model builder's docstring's first paragraph, on one line (what `fedskew models` prints)."""
    return first_paragraph(doc)


# Each model's summary: model_summary(fedskew.models.MODELS[name].__doc__).
MODEL_SUMMARIES: dict[str, str] = {
    "logreg": "Multinomial logistic regression (FedLC's model for Synthetic).",
    "mlp": "Two hidden layers of ReLU units.",
    "cnn": "A small CNN for small images (the offline digits): two 3×3 convs, one pool, one fc.",
    "alexnet": "SCALA's AlexNet (Appendix E), cut into client and server parts as in §5.1 and Appendix H.",
    "fedlc_cnn_mnist": "FedLC's CNN for MNIST and FMNIST (Zhang et al., ICML 2022, Appendix A.1, Table 8).",
    "fedlc_cnn_cifar": "FedLC's CNN for CIFAR10 (Zhang et al., ICML 2022, Appendix A.1, Table 9).",
    "resnet18": "ResNet-18, CIFAR variant (used by FedLC on ImageNet-subset 64×64, FedED's Table 3 on CIFAR10).",
    "resnet32": "ResNet-32 for CIFAR (He et al. 2016, §4.2; FedED's Table 3 on CIFAR10).",
    "mobilenetv2": "MobileNetV2, CIFAR variant (FedED's backbone for CIFAR10/100 and TinyImageNet).",
    "fed_dnn": "FedED's DNN for MNIST (Guo et al., FedED, \"Models and baselines\"): \"a deep neural network "
               "(DNN) containing three fully connected layers\".",
    "flfcr_mlp": "FL-FCR's MLP for MNIST and Adult Income (FL-FCR, §V-A-3 and Table I).",
    "flfcr_cnn": "FL-FCR's CNN for CIFAR-10 (FL-FCR, §V-A-3 and Table I).",
}


# The width of each model's features, the input of its linear head (model.head.in_features), which does not
# depend on the dataset except where None: the flattened input, prod(input_shape). FL-FCR resamples features
# of this width; validation bounds their number (fedskew.config).
FEATURE_DIMS: dict[str, int | None] = {
    "logreg": None, "mlp": 200, "cnn": 128, "alexnet": 4096, "fedlc_cnn_mnist": 50, "fedlc_cnn_cifar": 2048,
    "resnet18": 512, "resnet32": 64, "mobilenetv2": 1280, "fed_dnn": 200, "flfcr_mlp": 64, "flfcr_cnn": 128,
}


def feature_dim(name: str, info: DatasetInfo) -> int:
    """The width of model `name`'s features on a dataset like `info` (FEATURE_DIMS)."""
    width = FEATURE_DIMS[name]
    if width is None:
        width = 1
        for side in info.input_shape:
            width *= side
    return width


def incompatibility(name: str, info: DatasetInfo) -> str | None:
    """fedskew.models.incompatibility without torch: why model `name` cannot run on a dataset like `info`."""
    if name not in MODEL_NEEDS:
        return f"unknown model {name!r}; known: {', '.join(MODEL_NEEDS)}"
    return MODEL_NEEDS[name].problem(name, info)


# --- methods (fedskew.algorithms) -----------------------------------------------------------

CATALOG_FILE = Path(__file__).parent / "catalog.json"


@cache
def _written() -> dict:
    """catalog.json: what `python -m fedskew catalog --write` derived from the built-in pieces' classes."""
    return json.loads(CATALOG_FILE.read_text())


@cache
def methods() -> dict[str, dict]:
    """Every method by name, as its class describes itself (fedskew.declarations.describe_method): the built-in
    ones in fedskew.algorithms' order, from catalog.json, then the plugins' (fedskew.plugins), from their classes."""
    built_in = _written()["methods"]
    return {**built_in, **{name: {**describe_method(plugin.obj), "plugin": plugin.distribution,
                                  "version": plugin.obj.version}
                           for name, plugin in plugin_methods(set(built_in)).items()}}


def plugin_methods(built_in: set[str]) -> dict[str, plugins.Plugin]:
    """The installed plugins' methods by name, sorted; one that is no method class, or takes the name of one of
    the `built_in` methods, is a PluginError."""
    out = {}
    for name, plugin in sorted(plugins.loaded("method").items()):
        if name in built_in:
            raise plugin.error(f"{name!r} is the name of a built-in method; give the entry point another name")
        problem = plugins.method_problem(plugin)
        if problem:
            raise plugin.error(problem)
        out[name] = plugin
    return out


def defaults(algorithm: str) -> dict[str, Any]:
    """A method's hyperparameters with their defaults, in its class's order (what a run fills in)."""
    return {key: declared["default"] for key, declared in methods()[algorithm]["hyperparameters"].items()}


def family(algorithm: str) -> Family | None:
    """A method's family (its class's `family`), None for a name that is no method."""
    record = methods().get(algorithm)
    return Family(record["family"]) if record else None
