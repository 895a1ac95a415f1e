"""Every number a run reports, one entry each: the metrics registry.

An entry names a metric as evaluation returns it and says which history column(s) and which summary values
(metrics.json: `final_acc`, `best_acc`, `total_bytes_up`) it becomes, which way is better, its scale (how
pages show it, and the range its stored values lie in: fedskew.runfiles refuses a run file outside it) and the
MLflow section its chart is drawn in. Every consumer iterates the registry: the
engine's history rows and run summary (fedskew.engine.summary), a personalised evaluation's mean over
clients (SplitFedV3), the suite tables (fedskew.report.tables), the paper tables' cells (fedskew.reproduce),
the figures and MLflow's metric names (fedskew.tracking). A new metric is therefore one entry in `METRICS`
plus its computation in fedskew.engine.evaluate (`COMPUTATIONS`, which refuses a registered metric that has
none).

Torch-free and importing nothing of fedskew: validation, the tables and the tracking worker read it without
the engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

Item = TypeVar("Item")


class Kind(Enum):
    """Where a metric's values come from."""

    EVALUATED = "evaluated"   # the global model on the whole test set, at evaluated rounds: one number
    PER_CLASS = "per_class"   # the same, one number per class: history columns <column>0, <column>1, ...
    COUNTED = "counted"       # counted by the engine every round (traffic), summed over the run


class Better(Enum):
    """Which way a metric improves."""

    HIGHER = "higher"
    LOWER = "lower"

    @property
    def superlative(self) -> str:
        """The best value in words: "highest", "lowest"."""
        return "highest" if self is Better.HIGHER else "lowest"

    def best(self, items: Iterable[Item], key: Callable[[Item], Any] | None = None) -> Item:
        """The best of `items` (the first one on a tie, as max and min give it)."""
        return (max if self is Better.HIGHER else min)(items, key=key)


class Scale(Enum):
    """How a metric's value is stored, and the unit pages show it in."""

    FRACTION = "fraction"   # stored in [0, 1], shown in percent
    LOSS = "loss"           # a loss, shown as stored
    BYTES = "bytes"         # a count of bytes, shown in MB (10^6 bytes)

    @property
    def unit(self) -> str:
        return {Scale.FRACTION: "%", Scale.LOSS: "", Scale.BYTES: "MB"}[self]

    def shown(self, value: float) -> float:
        """`value` in the unit pages print it in, with the arithmetic the pages have always used (so their
        digits stay): 100 · fraction, bytes / 10^6."""
        if self is Scale.FRACTION:
            return 100 * value
        if self is Scale.BYTES:
            return value / 1e6
        return value

    @property
    def bounds(self) -> tuple[float, float]:
        """The range a stored value lies in: a fraction in [0, 1]; a loss (a cross-entropy) and a count of bytes
        are never negative."""
        return (0.0, 1.0) if self is Scale.FRACTION else (0.0, math.inf)

    @property
    def bounds_text(self) -> str:
        low, high = self.bounds
        return f"[{low:g}, {high:g}]" if math.isfinite(high) else f"[{low:g}, ∞)"


class Statistic(Enum):
    """A summary value of a run (metrics.json: `<statistic>_<metric name>`)."""

    FINAL = "final"   # at the last evaluated round: the number tables report
    BEST = "best"     # at the best evaluated round: recorded, labelled as such, never the reported number
    TOTAL = "total"   # summed over every round (a counted metric)


@dataclass(frozen=True)
class Metric:
    """One metric: what it is called at each stage, which way is better, and how it is shown."""

    name: str                 # the key evaluate returns; a counted metric's history column
    kind: Kind
    column: str               # its history column (a per-class metric: the prefix of its columns)
    better: Better
    scale: Scale
    section: str              # the MLflow section of its charts (`<section>/<column>`)
    label: str                # pages' words for it: "test accuracy"
    value_label: str | None = None   # pages' words for a shown value, where not `described`'s default
    statistics: tuple[Statistic, ...] = ()   # its summary values (metrics.json), in this order
    suite_table: bool = False  # its summary values are columns of the suite tables' CSV (mean, std over seeds)
    flat_key: str | None = None  # its first summary value's seed mean in the flat `<suite>.json`, shown unit

    def key(self, statistic: Statistic) -> str:
        """Its summary value's key in metrics.json: `final_acc`, `best_acc`, `total_bytes_up`."""
        return f"{statistic.value}_{self.name}"

    def history_values(self, value: Any) -> dict[str, Any]:
        """The history row's entries of one evaluated value: `{column: value}`, or one column per class."""
        if self.kind is Kind.PER_CLASS:
            return {f"{self.column}{c}": v for c, v in enumerate(value)}
        return {self.column: value}

    @property
    def described(self) -> str:
        """Pages' words for one of its shown values: `value_label`, else its label and unit ("test loss")."""
        if self.value_label:
            return self.value_label
        return f"{self.label} in {self.scale.unit}" if self.scale.unit else self.label

    def problem(self, value: Any) -> str | None:
        """Why `value` cannot be one of this metric's stored values, as a phrase ("is NaN, not a finite number in
        [0, 1]"); None when it can be. A stored value is a number, finite, in its scale's range; a per-class metric
        records NaN for a class the test set lacks (fedskew.engine.evaluate), which is no wrong number."""
        low, high = self.scale.bounds
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is {value!r}, not a number in {self.scale.bounds_text}"
        if math.isnan(value):
            return None if self.kind is Kind.PER_CLASS else f"is NaN, not a finite number in {self.scale.bounds_text}"
        if math.isinf(value):
            return f"is {'-' if value < 0 else ''}Infinity, not a finite number in {self.scale.bounds_text}"
        if not low <= value <= high:
            return f"is {value!r}, outside {self.scale.bounds_text}"
        return None

    def has_column(self, column: str) -> bool:
        """Whether a history column is this metric's (one of its per-class columns, for a per-class metric)."""
        if self.kind is Kind.PER_CLASS:
            return column.startswith(self.column) and column[len(self.column):].isdigit()
        return column == self.column


# The order is the history's column order (evaluate's entries: loss, accuracy, balanced accuracy, the classes).
METRICS: tuple[Metric, ...] = (
    Metric("loss", Kind.EVALUATED, "test_loss", Better.LOWER, Scale.LOSS, "loss", "test loss",
           statistics=(Statistic.FINAL,)),
    Metric("acc", Kind.EVALUATED, "test_acc", Better.HIGHER, Scale.FRACTION, "accuracy", "test accuracy",
           value_label="accuracy in %", statistics=(Statistic.FINAL, Statistic.BEST), suite_table=True),
    Metric("balanced_acc", Kind.EVALUATED, "test_balanced_acc", Better.HIGHER, Scale.FRACTION, "accuracy",
           "balanced test accuracy", statistics=(Statistic.FINAL,), suite_table=True),
    Metric("per_class_acc", Kind.PER_CLASS, "test_acc_class", Better.HIGHER, Scale.FRACTION, "per_class",
           "test accuracy of each class"),
    Metric("bytes_up", Kind.COUNTED, "bytes_up", Better.LOWER, Scale.BYTES, "traffic", "bytes sent up",
           statistics=(Statistic.TOTAL,), suite_table=True, flat_key="mb_up_mean"),
    Metric("bytes_down", Kind.COUNTED, "bytes_down", Better.LOWER, Scale.BYTES, "traffic", "bytes sent down",
           statistics=(Statistic.TOTAL,), suite_table=True, flat_key="mb_down_mean"),
)

REPORTED = "acc"   # the metric tables report (its final round) and whose best round is `best_round`

# The MLflow section of the history's other columns, by prefix: per-round counters, not metrics of the model.
# The MLflow UI draws a run's charts in sections named by the prefix before "/", in alphabetical order, with
# unprefixed metrics last (MLflow 3.17): the accuracies and losses go first (`accuracy/`, `loss/`), the many
# per-round counters after them; history.csv keeps the plain names.
ROUND_COLUMN_SECTIONS = (("train_loss", "loss"), ("bytes_", "traffic"), ("clients", "traffic"),
                         ("method_", "method"), ("local_", "local_drift"))


def metric(name: str) -> Metric:
    """The registered metric `name`; a KeyError naming the registered ones otherwise."""
    for entry in METRICS:
        if entry.name == name:
            return entry
    raise KeyError(f"no metric {name!r} in fedskew.metrics; registered: {[m.name for m in METRICS]}")


def reported() -> Metric:
    return metric(REPORTED)


def reported_key() -> str:
    """The metrics.json key of the number tables report: the reported metric at the final round, `final_acc`."""
    return reported().key(Statistic.FINAL)


def evaluated() -> list[Metric]:
    """The metrics evaluation returns (fedskew.engine.evaluate), in the history's column order."""
    return [m for m in METRICS if m.kind is not Kind.COUNTED]


def summarised(statistic: Statistic) -> list[Metric]:
    """The metrics with a `statistic` summary value, in metrics.json's order: the reported metric first, then
    the others the suite tables show, then the rest (each group in the registry's order)."""
    ordered = sorted(METRICS, key=lambda m: (m.name != REPORTED, not m.suite_table))   # a stable sort
    return [m for m in ordered if statistic in m.statistics]


def summary_key(key: str) -> tuple[Metric, Statistic]:
    """The metric and statistic of a metrics.json key (`final_loss`); a KeyError naming the keys otherwise."""
    for statistic in Statistic:
        for entry in summarised(statistic):
            if entry.key(statistic) == key:
                return entry, statistic
    known = [m.key(s) for s in Statistic for m in summarised(s)]
    raise KeyError(f"{key!r} is no summary value of fedskew.metrics; known: {known}")


def mean_of_evaluations(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of several evaluations (one per client's model), metric by metric; a per-class metric class
    by class."""
    mean: dict[str, Any] = {}
    for entry in evaluated():
        if entry.kind is Kind.PER_CLASS:
            classes = len(results[0][entry.name])
            mean[entry.name] = [sum(r[entry.name][c] for r in results) / len(results) for c in range(classes)]
        else:
            mean[entry.name] = sum(r[entry.name] for r in results) / len(results)
    return mean


def mlflow_section(column: str) -> str | None:
    """The MLflow section of a history column: its metric's, else its kind's by prefix; None for neither."""
    for entry in METRICS:
        if entry.has_column(column):
            return entry.section
    for prefix, section in ROUND_COLUMN_SECTIONS:
        if column.startswith(prefix):
            return section
    return None
