"""The training settings of a run (params.yaml's `training.<suite>`), typed, with their defaults in one place.

Each field of `TrainingConfig` is one setting: its type, its default, and how a run's configuration records it
(its `kind`). The constants the rest of fedskew reads are derived from those fields, so that a setting is
added, or its default changed, in one line:

- `TRAINING_DEFAULTS`: the settings filled in for every run (kinds `filled` and `execution`), in the order
  config.yaml lists them;
- `EXECUTION_SETTINGS`: those left out of run ids, since they do not change what a converging run computes
  (kind `execution`: the thread count, how a divergence is reported);
- `LATER_TRAINING_OPTIONS`: settings added after results were published, with the behaviour those results had
  (kind `later`). A run records one only where params.yaml writes it, and its id includes it only when it is
  set to something else, so that adding a setting orphans no run;
- the remaining kind, `written`: recorded, and part of the run id, only where params.yaml writes it.

A run's configuration keeps the resolved section as a dict (`RunConfig.training`, what config.yaml and MLflow
record and the run id hashes: the keys written stay exactly those written); `TrainingConfig.from_record` reads
it once into typed fields (`RunConfig.train`), refusing a key it does not know. Without torch, and importing
nothing of fedskew but the shape of a problem, so that the configuration, the engine, the methods and the
reports can all import it. tests/unit/test_training_config.py keeps the fields and the schema's
`$defs.training_fields` (workflow/schemas/params.schema.yaml) the same.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Literal, get_args, get_origin

from fedskew.config_errors import ConfigError, short_value, suggestion

FILLED, EXECUTION, LATER, WRITTEN = "filled", "execution", "later", "written"


def _setting(default: Any, kind: str) -> Any:
    return field(default=default, metadata={"kind": kind})


@dataclass(frozen=True)
class TrainingConfig:
    """How one run trains: every setting of params.yaml's `training.<suite>` with its default filled in."""

    model: str = _setting("mlp", FILLED)                      # a model of fedskew.models (`fedskew models`)
    rounds: int = _setting(50, FILLED)
    participation: float = _setting(1.0, FILLED)              # fraction of clients per round
    local_epochs: int = _setting(1, FILLED)
    batch_size: int = _setting(32, FILLED)
    lr: float = _setting(0.05, FILLED)
    momentum: float = _setting(0.0, FILLED)
    weight_decay: float = _setting(0.0, FILLED)
    eval_every: int = _setting(1, FILLED)
    checkpoint_every: int = _setting(10, FILLED)
    threads: int = _setting(1, EXECUTION)                     # ATen's threads; the count used is tagged in MLflow
    device: Literal["cpu", "cuda", "auto"] = _setting("cpu", FILLED)
    on_divergence: Literal["fail", "record"] = _setting("fail", EXECUTION)
    execution: Literal["sequential", "vectorised", "auto"] = _setting("sequential", LATER)
    precision: Literal["fp32", "tf32", "bf16"] = _setting("fp32", LATER)
    optimizer: Literal["sgd", "adam"] = _setting("sgd", LATER)
    augmentation: Literal["none", "crop_flip", "autoaugment_cifar10", "autoaugment_imagenet"] = _setting(
        "none", WRITTEN)                                      # training batches only
    split_point: str | None = _setting(None, WRITTEN)         # split methods; None: the model's default cut
    local_diagnostics: bool = _setting(False, WRITTEN)        # local models' per-class accuracy, before and after

    @classmethod
    def from_record(cls, record: Mapping[str, Any], where: str = "training") -> TrainingConfig:
        """The typed settings of a resolved training section (RunConfig.training, a run's config.yaml): a key it
        does not know, or a value of the wrong type, is a one-line ConfigError naming it under `where`."""
        unknown = [key for key in record if key not in TRAINING_KEYS]
        if unknown:
            named = ", ".join(f"{key!r}{suggestion(key, TRAINING_KEYS)}" for key in unknown)
            raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {named}; "
                              f"allowed: {', '.join(sorted(TRAINING_KEYS))}")
        hints = _type_hints()
        for key, value in record.items():
            if (problem := _type_problem(value, hints[key])) is not None:
                raise ConfigError(f"{where}.{key}: {short_value(value)} {problem}")
        return cls(**record)


TRAINING_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainingConfig))
TRAINING_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TrainingConfig)
                                     if f.metadata["kind"] in (FILLED, EXECUTION)}
EXECUTION_SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(TrainingConfig) if f.metadata["kind"] == EXECUTION)
LATER_TRAINING_OPTIONS: dict[str, Any] = {f.name: f.default for f in fields(TrainingConfig)
                                          if f.metadata["kind"] == LATER}


def resolve_training(section: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """The training settings of one dataset of a suite as its runs record them: TRAINING_DEFAULTS, then the
    suite's section as written, then the section's `overrides.<dataset>`."""
    written = copy.deepcopy(dict(section))
    overrides = written.pop("overrides", {}).get(dataset, {})
    return {**TRAINING_DEFAULTS, **written, **overrides}


@cache
def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainingConfig)


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` is not of the field type `hint` (a class, a Literal, or `X | None`), or None when it is."""
    if get_origin(hint) is Literal:
        allowed = get_args(hint)
        return None if value in allowed else (f"is not allowed{suggestion(value, allowed)}; "
                                              f"allowed: {', '.join(map(str, allowed))}")
    if isinstance(hint, types.UnionType):
        arms = get_args(hint)
        return None if any(_type_problem(value, arm) is None for arm in arms) else \
            f"has the wrong type; expected {' or '.join(_type_name(arm) for arm in arms)}"
    if hint is type(None):
        return None if value is None else "has the wrong type; expected null"
    # bool is an int to Python but not a count; an int is a float (`lr: 1`), as JSON Schema's number says
    fits = (isinstance(value, bool) if hint is bool else
            isinstance(value, (int, float)) and not isinstance(value, bool) if hint is float else
            isinstance(value, hint) and not isinstance(value, bool) if hint is int else isinstance(value, hint))
    return None if fits else f"has the wrong type; expected {_type_name(hint)}"


def _type_name(hint: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}.get(hint, str(hint))
