"""The numbers a claim is judged on: a paper table's cells as printed, or ours per seed.

Both are `CellSource`s, so `verdicts` (and `side_evidence`'s proxies) judge a claim the same way on
either: `combined_effect` turns a weighted sum of cells into one effect, paired per seed on our runs,
a point at the printed precision on the paper's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fedskew.reproduce.paper_tables import PaperTable
from fedskew.reproduce.policy import Effect, paired_effect, point_effect
from fedskew.reproduce.tables import OurCell


class CellSource(Protocol):
    """The numbers of a table's cells: the paper's printed ones, or ours per seed."""

    point: bool      # True: one printed number per cell, compared as points at the printed precision
    decimals: int    # the paper's printed precision

    def values(self, row: str, column: str) -> dict[int, float] | None:
        """seed -> value (the paper: {0: printed value}); None where the cell has no number."""

    def diverged(self, row: str, column: str) -> list[int]:
        """The seeds whose run of this cell diverged (none for the paper's printed numbers)."""


@dataclass
class PaperSource:
    table: PaperTable
    point: bool = True

    @property
    def decimals(self) -> int:
        return self.table.decimals

    def values(self, row: str, column: str) -> dict[int, float] | None:
        value = self.table.value(row, column)
        return None if value is None else {0: value}

    def diverged(self, row: str, column: str) -> list[int]:
        return []


@dataclass
class OursSource:
    cells: dict[tuple[str, str], OurCell]
    decimals: int
    point: bool = False

    def values(self, row: str, column: str) -> dict[int, float] | None:
        cell = self.cells[(row, column)]
        return dict(cell.seeds) if cell.seeds else None

    def diverged(self, row: str, column: str) -> list[int]:
        return sorted(self.cells[(row, column)].diverged_seeds)


def combined_effect(source: CellSource, terms: list[tuple[float, dict[int, float]]]) -> Effect | None:
    """The effect Σ coefficient · cell, paired per seed (seeds every cell has), or a printed point."""
    if source.point:
        return point_effect(sum(c * v[0] for c, v in terms), source.decimals)
    common = set.intersection(*(set(v) for _, v in terms))
    if not common:
        return None
    return paired_effect([sum(c * v[k] for c, v in terms) for k in sorted(common)])


def mean_value(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)
