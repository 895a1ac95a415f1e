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
Models likewise: `models()` serves the built-in ones from catalog.json, which the same command derives by building
each declared model (fedskew.models.BUILT_IN) on torch's meta device (describe_model), and a plugin's from its
declaration (`Model`); MODEL_NEEDS, SPLIT_POINTS, SPLIT_STAGES, MODEL_SUMMARIES and FEATURE_DIMS are views of it.
Datasets: the tables below restate their registries, and tests/unit/test_catalog.py compares every entry with
them and, when one disagrees, prints the entry to write here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cache
from math import prod
from pathlib import Path
from typing import Any

from fedskew import plugins
from fedskew.declarations import describe_method, describe_source, first_paragraph
from fedskew.families import Family

# --- dataset sources (fedskew.data.datasets) -------------------------------------------------

@dataclass(frozen=True)
class DatasetInfo:
    """What a model and a partitioner need to know about a dataset without loading it."""

    input_shape: tuple[int, ...]
    num_classes: int
    is_image: bool
    has_natural_partition: bool


@dataclass(frozen=True)
class Source:
    """A dataset source as its class declares itself (fedskew.data.datasets.base.DatasetSource): its inputs
    ([C, H, W] images or vectors) and classes, how it arrives ("embedded": generated here; "download": fetched
    and checked against pinned md5s, or placed by hand when offline; "by hand": no download exists), its
    options' defaults, the files it fetches with the host of the first, and the sizes of its fixed splits."""

    input_shape: tuple[int, ...]
    num_classes: int
    has_natural_partition: bool
    arrives: str
    defaults: dict[str, Any]
    schemas: dict[str, dict]            # each option's JSON schema
    raw_files: tuple[str, ...] = ()     # named as downloaded, as a local folder or data/raw/<source>/ holds them
    host: str | None = None
    train_class_counts: tuple[int, ...] | None = None
    train_size: int | None = None
    test_size: int | None = None
    estimated_sizes: tuple[int, int] | None = None  # what `fedskew cost` assumes where sizes are not fixed
    plugin: str | None = None           # the distribution of a plugin's source

    @classmethod
    def of(cls, record: dict, plugin: str | None = None) -> Source:
        counts, estimated = record["train_class_counts"], record["estimated_sizes"]
        return cls(tuple(record["input_shape"]), record["num_classes"], record["natural_partition"],
                   record["arrives"], {k: o["default"] for k, o in record["options"].items()},
                   {k: o["schema"] for k, o in record["options"].items()}, tuple(record["raw_files"]),
                   record["host"], tuple(counts) if counts is not None else None, record["train_size"],
                   record["test_size"], tuple(estimated) if estimated is not None else None, plugin)


@cache
def sources() -> dict[str, Source]:
    """Every dataset source by name: the built-in ones from catalog.json, then the plugins' (entry points of
    group fedskew.datasets), each described from its class. A plugin that is no source class, or takes a
    built-in source's name, is a PluginError."""
    out = {name: Source.of(record) for name, record in _written()["sources"].items()}
    for name, plugin in sorted(plugins.loaded("dataset").items()):
        if name in out:
            raise plugin.error(f"{name!r} is the name of a built-in dataset source; give the entry point another name")
        problem = plugins.source_problem(plugin)
        if problem:
            raise plugin.error(problem)
        out[name] = Source.of(describe_source(plugin.obj), plugin.distribution)
    return out


def dataset_defaults(source: str) -> dict[str, Any]:
    """A source's options with their defaults, in its class's order (what a dataset's spec fills in)."""
    return dict(sources()[source].defaults)


def dataset_info(spec: dict) -> DatasetInfo:
    """What a dataset of spec `spec` gives, without torch."""
    if spec["source"] not in sources():
        raise ValueError(f"unknown dataset source {spec['source']!r}")
    source = sources()[spec["source"]]
    shape, classes = source.input_shape, source.num_classes
    if spec["source"] == "synthetic":
        shape, classes = (spec["dim"],), spec["classes"]
    return DatasetInfo(shape, classes, len(shape) == 3, source.has_natural_partition)


# --- models (fedskew.models) ----------------------------------------------------------------

@dataclass(frozen=True)
class InputNeeds:
    """What a model needs of a dataset's inputs (validation refuses a dataset that gives other inputs).

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

    def example(self, num_classes: int = 10) -> DatasetInfo:
        """Inputs these needs allow, for showing a model's structure: its own shape if it has one, else 3×32×32
        images (larger where it needs larger) for an image model, 64-vectors for the others."""
        if self.shapes:
            return DatasetInfo(tuple(self.shapes[0]), num_classes, True, False)
        if self.image:
            side = max(32, self.min_side)
            return DatasetInfo((3, side, side), num_classes, True, False)
        return DatasetInfo((64,), num_classes, False, False)

    @classmethod
    def of(cls, record: dict) -> InputNeeds:
        """The needs a catalog.json record holds (dataclasses.asdict of one)."""
        return cls(record["image"], tuple(tuple(shape) for shape in record["shapes"]), record["min_side"],
                   record["why"])


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(side) for side in shape)


@dataclass(frozen=True)
class Model:
    """A model: `build(info)` makes its network (a fedskew.models.SplittableNet) for a dataset like `info` (a
    DatasetInfo); `needs` says which inputs it takes; `version` is its numerics version, raised when a change moves
    the bits it computes, which gives its runs new ids. What it is (`fedskew models`) is the first paragraph of
    build's docstring. fedskew.models.BUILT_IN declares the built-in ones so (their versions are
    fedskew.models.VERSIONS, which run ids read from its source), and a plugin's entry point of group
    fedskew.models names one."""

    build: Callable[[DatasetInfo], Any]
    needs: InputNeeds = InputNeeds()
    version: int = 1

    def problem(self) -> str | None:
        """What makes this declaration unusable, or None."""
        if not callable(self.build):
            return f"its build is a {type(self.build).__name__}, not a function of a DatasetInfo"
        if not isinstance(self.needs, InputNeeds):
            return f"its needs is a {type(self.needs).__name__}; write needs=InputNeeds(...) (fedskew.models)"
        if type(self.needs.min_side) is not int or self.needs.min_side < 1:  # NaN would let every image through
            return f"its needs' min_side is {self.needs.min_side!r}; write a whole number, 1 or more"
        shapes = self.needs.shapes
        if not isinstance(shapes, tuple) or any(not isinstance(shape, tuple) or len(shape) != 3 or
                                                any(type(side) is not int or side < 1 for side in shape)
                                                for shape in shapes):
            return f"its needs' shapes are {self.needs.shapes!r}; write (channels, height, width), whole numbers >= 1"
        if type(self.version) is not int or self.version < 1:
            return f"its version is {self.version!r}; write a whole number, 1 or more"
        return None


def model_summary(doc: str | None) -> str:
    """A model builder's docstring's first paragraph, on one line (what `fedskew models` prints)."""
    return first_paragraph(doc)


def describe_model(model: Model) -> dict:
    """A model's record, as catalog.json holds it: what it is, its needs, its split points (a point's name -> the body
    stage it cuts after, the default first) and its feature width, the input of its head (None: the flattened
    input). Built on torch's meta device (the structure, no weights) for a few inputs its needs allow, which must
    give the same split points and one width, or the flattened input's. A ValueError says what is wrong: the
    declaration (Model.problem), building it, or what differs between inputs."""
    import torch  # only where a model is described: writing catalog.json, loading a model plugin

    problem = model.problem()
    if problem:
        raise ValueError(problem)
    infos = _probe_infos(model.needs)
    if not infos:
        raise ValueError(f"its needs take no inputs ({model.needs}): an exact shape smaller than its min_side?")
    with torch.device("meta"):
        built = [(info, _built(model, info)) for info in infos]
    points = [list(net.split_points.items()) for _, net in built]
    if any(found != points[0] for found in points):
        raise ValueError(f"its split points change with the input ({_each(built, points)}); they must not")
    widths = [net.head.in_features for _, net in built]
    if len(set(widths)) > 1 and widths != [prod(info.input_shape) for info, _ in built]:
        raise ValueError(f"its feature width (head.in_features) changes with the input ({_each(built, widths)}); "
                         "it must be one width, or the flattened input's")
    needs = {**asdict(model.needs), "shapes": [list(shape) for shape in model.needs.shapes]}  # as JSON reads back
    return {"summary": model_summary(model.build.__doc__), "needs": needs,
            "split_points": dict(points[0]), "feature_dim": widths[0] if len(set(widths)) == 1 else None}


def _probe_infos(needs: InputNeeds) -> list[DatasetInfo]:
    """The inputs a model is described on: its example and the others of several sizes that its needs allow (its own
    shapes, its smallest images, odd ones, vectors), so that split points or a width that follow the input show."""
    side = needs.min_side
    shapes = [*needs.shapes, (3, side, side), (1, side + 3, side + 5), (7,)]
    candidates = [needs.example(), *(DatasetInfo(shape, 10, len(shape) == 3, False) for shape in shapes)]
    return list(dict.fromkeys(info for info in candidates if needs.problem("", info) is None))


def _built(model: Model, info: DatasetInfo) -> Any:
    given = _shape(info.input_shape) + (" images" if info.is_image else " vectors")
    try:
        net = model.build(info)
    except Exception as error:  # whatever a builder raises, reported with the inputs it was given
        raise ValueError(f"building it for {given} failed: {type(error).__name__}: {error}; if it cannot take "
                         f"such inputs, say so in its needs (InputNeeds)") from error
    if not all(hasattr(net, attribute) for attribute in ("body", "head", "split_points")):
        raise ValueError(f"its build returned a {type(net).__name__}, not a fedskew.models.SplittableNet")
    return net


def _each(built: list, values: list) -> str:
    return "; ".join(f"{value} on {_shape(info.input_shape)}" for (info, _), value in zip(built, values, strict=True))


@cache
def models() -> dict[str, dict]:
    """Every model by name, as describe_model records it: the built-in ones in fedskew.models' order, from
    catalog.json, then the plugins' (entry points of group fedskew.models), each described from its declaration
    when loaded, with its distribution and version. A plugin that takes a built-in model's name, or names no valid
    declaration, is a PluginError."""
    out = dict(_written()["models"])
    for name, plugin in sorted(plugins.loaded("model").items()):
        if name in out:
            raise plugin.error(f"{name!r} is the name of a built-in model; give the entry point another name")
        out[name] = {**_plugin_record(plugin), "plugin": plugin.distribution, "version": plugin.obj.version}
    return out


def _plugin_record(plugin: plugins.Plugin) -> dict:
    """describe_model of a plugin's declaration; a PluginError if it names none, or one that cannot be described."""
    if not isinstance(plugin.obj, Model):
        raise plugin.error(f"names a {type(plugin.obj).__name__}, not a model declaration: point it at a "
                           "fedskew.models.Model(build, needs=InputNeeds(...), version=1)")
    try:
        return describe_model(plugin.obj)
    except ValueError as error:
        raise plugin.error(str(error)) from error


# The models' facts as tables by name, derived from models(): made when first read, not when this module is
# imported (a model plugin's module imports fedskew.models, which imports this one), by __getattr__ below.
_MODEL_TABLES = ("MODEL_NEEDS", "SPLIT_POINTS", "SPLIT_STAGES", "MODEL_SUMMARIES", "FEATURE_DIMS")


@cache
def _model_tables() -> dict[str, dict]:
    records = models()
    aliased = {name: {point: stage for point, stage in record["split_points"].items() if point != stage}
               for name, record in records.items()}
    return {"MODEL_NEEDS": {name: InputNeeds.of(record["needs"]) for name, record in records.items()},
            # the default first; split points do not depend on the input
            "SPLIT_POINTS": {name: tuple(record["split_points"]) for name, record in records.items()},
            # the split points named apart from the body stage they cut after (model.split_points[point] = stage)
            "SPLIT_STAGES": {name: stages for name, stages in aliased.items() if stages},
            "MODEL_SUMMARIES": {name: record["summary"] for name, record in records.items()},
            # FL-FCR resamples features of this width; validation bounds their number (fedskew.config_checks)
            "FEATURE_DIMS": {name: record["feature_dim"] for name, record in records.items()}}


def __getattr__(name: str) -> dict:
    if name in _MODEL_TABLES:
        return _model_tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def feature_dim(name: str, info: DatasetInfo) -> int:
    """The width of model `name`'s features on a dataset like `info` (FEATURE_DIMS; None there: the flattened
    input's, prod(input_shape))."""
    width = _model_tables()["FEATURE_DIMS"][name]
    return prod(info.input_shape) if width is None else width


def incompatibility(name: str, info: DatasetInfo) -> str | None:
    """Why model `name` cannot run on a dataset like `info`, or None if it can (as fedskew.models.incompatibility)."""
    needs = _model_tables()["MODEL_NEEDS"]
    if name not in needs:
        return f"unknown model {name!r}; known: {', '.join(needs)}"
    return needs[name].problem(name, info)


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
