"""What a method declares about itself, as plain data that validation reads without importing torch.

A method class (fedskew.fl.base.Algorithm) is the one source of what it is: its name, its family, its
hyperparameters (`Hyperparameter`: default, allowed values, where the paper stands), the options another
option switches off (`Switch`), whether it needs SGD, its figure panel and its numerics version.
`describe_method` turns a class into the plain record that fedskew.catalog serves: for the built-in methods
from src/fedskew/catalog.json (written by `python -m fedskew catalog --write`), for a plugin's from its class
when it is loaded. The JSON schema of a method's entry in params.yaml is derived from the same record
(`method_schema`), so no list of methods or hyperparameters is written anywhere else.
"""

from __future__ import annotations

import math
import operator
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fedskew.families import Family, Panel

# The shared definitions of params.schema.yaml a hyperparameter may name instead of a range (`ref`).
SCHEMA_REFS = ("missing_classes", "epoch_count", "sample_count", "seed")

# A declaration's bounds by keyword, each with what a value must do to keep it.
BOUNDS = {"minimum": operator.ge, "maximum": operator.le, "exclusive_minimum": operator.gt,
          "exclusive_maximum": operator.lt}


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers_problem(default: Any, bounds: dict[str, Any]) -> str | None:
    """What is wrong with a declaration's numbers (a hyperparameter's, a dataset option's, a partition parameter's),
    or None: a default or a bound that is not a finite number, bounds that leave no value, a default that breaks its
    own bounds. A default that is no number (a switch, a word, None for a required parameter) is left to the
    declaration's own checks."""
    if is_number(default) and not math.isfinite(default):
        return f"the default {default!r} is not a finite number; give a finite one"
    given = {key: bound for key, bound in bounds.items() if bound is not None}
    for key, bound in given.items():
        if not is_number(bound) or not math.isfinite(bound):
            return f"{key}={bound!r} is not a finite number; leave the bound out, or give a finite int or float"
    for low in ("minimum", "exclusive_minimum"):
        for high in ("maximum", "exclusive_maximum"):
            if low not in given or high not in given:
                continue
            strict = "exclusive" in low or "exclusive" in high  # [1, 1] holds 1; [1, 1) holds nothing
            if not (given[high] > given[low] if strict else given[high] >= given[low]):
                return f"{low}={given[low]!r} and {high}={given[high]!r} leave no value between them"
    if is_number(default):
        broken = [f"{key}={bound}" for key, bound in given.items() if not BOUNDS[key](default, bound)]
        if broken:
            return f"the default {default!r} breaks its own {', '.join(broken)}"
    return None


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter: its default and the values params.yaml may give it.

    The type is the default's: a bool is a switch, an int an integer (which must have a `maximum`, as every
    integer of params.yaml has), a float a number, a str one of `choices`. A number or integer may also take
    the words in `choices` (FL-FCR's samples_per_class: a count, `balanced` or `class_sized`). `ref` names a
    definition of params.schema.yaml instead (SCHEMA_REFS), and `schema` any JSON schema (a dataset's
    `imagenet_dir`: a string or null). `status` says where the default comes from when it is not the paper's
    own value ("paper silent; ..."); empty means the paper states it.
    """

    default: Any
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    choices: tuple = ()
    ref: str = ""
    status: str = ""
    schema_: dict | None = None  # written `schema=` (Hyperparameter's __init__ below)

    def __init__(self, default: Any, *, minimum: float | None = None, maximum: float | None = None,
                 exclusive_minimum: float | None = None, exclusive_maximum: float | None = None,
                 choices: tuple = (), ref: str = "", status: str = "", schema: dict | None = None) -> None:
        for key, value in (("default", default), ("minimum", minimum), ("maximum", maximum),
                           ("exclusive_minimum", exclusive_minimum), ("exclusive_maximum", exclusive_maximum),
                           ("choices", tuple(choices)), ("ref", ref), ("status", status), ("schema_", schema)):
            object.__setattr__(self, key, value)

    def problem(self) -> str | None:
        """What makes this declaration unusable, or None."""
        bounds = {key: getattr(self, key) for key in BOUNDS}
        numbers = numbers_problem(self.default, bounds)
        if numbers:
            return numbers
        if self.schema_ is not None:
            return None
        if self.ref:
            return None if self.ref in SCHEMA_REFS else f"ref {self.ref!r} is not one of {', '.join(SCHEMA_REFS)}"
        if any(is_number(word) and not math.isfinite(word) for word in self.choices):
            return f"choices {list(self.choices)!r} hold a number that is not finite"
        if isinstance(self.default, str) and self.default not in self.choices:
            return f"the default {self.default!r} is a word, so `choices` must list it (and the other words allowed)"
        if isinstance(self.default, int) and not isinstance(self.default, bool) and self.maximum is None:
            return "an integer needs a `maximum` (params.yaml bounds every integer)"
        if not isinstance(self.default, (bool, int, float, str)):
            return f"the default {self.default!r} is a {type(self.default).__name__}; use a bool, int, float or str"
        return None

    def schema(self) -> dict:
        """The JSON schema of the values params.yaml may give it."""
        if self.schema_ is not None:
            return dict(self.schema_)
        if self.ref:
            return {"$ref": f"#/$defs/{self.ref}"}
        if isinstance(self.default, bool):
            return {"type": "boolean"}
        if isinstance(self.default, str):
            return {"enum": list(self.choices)}
        bounds = {"minimum": self.minimum, "maximum": self.maximum, "exclusiveMinimum": self.exclusive_minimum,
                  "exclusiveMaximum": self.exclusive_maximum}
        number = {"type": "integer" if isinstance(self.default, int) else "number",
                  **{key: value for key, value in bounds.items() if value is not None}}
        return {"oneOf": [number, {"enum": list(self.choices)}]} if self.choices else number


@dataclass(frozen=True)
class Switch:
    """An option that turns a part of the method off at 0, leaving `dependents` without effect (`meaning` says
    what 0 means). Validation refuses a dependent set to anything but its default while the switch is 0: the same
    computation as the default under another run id."""

    option: str
    meaning: str
    dependents: tuple[str, ...]


def declared_hyperparameters(cls: type, attribute: str = "hyperparameters") -> dict[str, Hyperparameter]:
    """The hyperparameters of a method class (or a dataset source's `options`) and of every class it derives
    from (a composition has the union of its parents'), a bare default read as `Hyperparameter(default)`; a
    declaration that cannot be used is a TypeError naming the class and the hyperparameter."""
    merged: dict[str, Hyperparameter] = {}
    for klass in reversed(cls.__mro__):
        for key, value in vars(klass).get(attribute, {}).items():
            declared = value if isinstance(value, Hyperparameter) else Hyperparameter(value)
            problem = declared.problem()
            if problem:
                raise TypeError(f"{klass.__module__}.{klass.__qualname__}: hyperparameter {key!r}: {problem}")
            merged[key] = declared
    return merged


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def summary(cls: type) -> str:
    """A method's description: its class docstring's first paragraph (which tells variants in one file apart),
    else its module's (which cites the paper)."""
    return first_paragraph(vars(cls).get("__doc__") or getattr(sys.modules.get(cls.__module__), "__doc__", None))


def describe_method(cls: type) -> dict:
    """The plain record of a method class that fedskew.catalog serves (and catalog.json stores)."""
    family = Family(cls.family)
    return {
        "family": family.value,
        "panel": Panel.SPLIT.value if family is Family.SPLIT else Panel(cls.panel).value,
        "summary": summary(cls),
        "sgd_only": cls.sgd_only,
        "switches": [[s.option, s.meaning, list(s.dependents)] for s in cls.switches],
        "hyperparameters": {key: {"default": h.default, "schema": h.schema(), "status": h.status}
                            for key, h in cls.hyperparameters.items()},
    }


def describe_source(cls: type) -> dict:
    """The plain record of a dataset source class (fedskew.data.datasets.base.DatasetSource) that
    fedskew.catalog serves: what it gives, how it arrives, its options, its fixed sizes, the files it fetches
    and the host of the first one's first URL."""
    files = cls.source_files()
    return {
        "input_shape": list(cls.input_shape), "num_classes": cls.num_classes,
        "natural_partition": cls.natural_partition, "arrives": cls.arrives,
        "options": {key: {"default": o.default, "schema": o.schema()} for key, o in cls.options.items()},
        "train_class_counts": list(cls.train_class_counts) if cls.train_class_counts is not None else None,
        "train_size": cls.train_size, "test_size": cls.test_size,
        "estimated_sizes": list(cls.estimated_sizes) if cls.estimated_sizes is not None else None,
        "raw_files": [f.filename for f in files],
        "host": urlsplit(files[0].urls[0]).hostname if files else None,
    }


def source_schema(name: str, options: dict[str, dict]) -> dict:
    """The if/then clause of params.schema.yaml's `dataset` for one source: exactly its options (name -> schema)."""
    properties = {"source": True, **options}
    return {"if": {"properties": {"source": {"const": name}}},
            "then": {"additionalProperties": False, "properties": properties}}


def method_schema(name: str, record: dict) -> dict:
    """The if/then clause of params.schema.yaml's `method` for one method: exactly its hyperparameters."""
    properties = {"algorithm": True, **{key: h["schema"] for key, h in record["hyperparameters"].items()}}
    return {"if": {"properties": {"algorithm": {"const": name}}},
            "then": {"additionalProperties": False, "properties": properties}}
