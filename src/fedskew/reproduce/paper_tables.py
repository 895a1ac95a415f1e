"""The papers' result tables, transcribed into one YAML file per table (``papers/<id>.yaml``).

A file holds the table as the paper prints it and nothing of ours:

```yaml
id: fedlc_t4
paper: FedLC
table: "4"
source: "FedLC (Zhang et al., ICML 2022), Table 4"
paper_file: 000_3077ada198f91ab0.txt
caption: Test accuracy on various federated datasets.
metric: top-1 test accuracy (%)
rows: [FedAvg, FedProx, ...]            # top to bottom, exactly as printed
columns: ["Synthetic(0,0)", ...]        # left to right; levels joined by " / "
cells:                                  # one per (row, column), in row-major order
  - {row: FedAvg, column: "Synthetic(0,0)", value: 72.09, pm: 1.19}
  - {row: FedAvg, column: "...", value: "-", note: the paper's "-": fails to converge}
notes: [...]                            # transcription remarks
```

``value`` is the printed number, or a marker: ``"-"`` where the paper prints a dash (it
failed to converge, or was not run) and ``"lost"`` where neither text rendering of the
paper kept the number. ``pm`` is the printed ± (absent where the paper prints none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import yaml

PAPERS_DIR = Path(__file__).parent / "papers"
MARKERS = {"-": "the paper prints '-' (fails to converge)", "lost": "lost in the paper's text renderings"}
REQUIRED_KEYS = ("id", "paper", "table", "source", "paper_file", "caption", "metric", "rows", "columns", "cells")


class PaperTableError(ValueError):
    """A transcription file that does not have the documented shape."""


@dataclass(frozen=True)
class PaperCell:
    row: str
    column: str
    value: float | None        # None for a marker
    pm: float | None
    marker: str | None         # "-" or "lost", else None
    source: str
    note: str = ""
    decimals: int = 2          # the table's printed precision (`PaperTable.decimals`)

    @property
    def text(self) -> str:
        """The number as the paper prints it (trailing zeros restored to the table's precision)."""
        if self.marker is not None:
            return self.marker
        d = self.decimals
        return f"{self.value:.{d}f} ± {self.pm:.{d}f}" if self.pm is not None else f"{self.value:.{d}f}"


@dataclass(frozen=True)
class PaperTable:
    id: str
    paper: str
    table: str
    source: str
    caption: str
    metric: str
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: dict[tuple[str, str], PaperCell]
    notes: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), len(self.columns)

    def cell(self, row: str, column: str) -> PaperCell:
        try:
            return self.cells[(row, column)]
        except KeyError:
            raise KeyError(f"{self.id} has no cell ({row!r}, {column!r}); rows: {list(self.rows)}, "
                           f"columns: {list(self.columns)}") from None

    def value(self, row: str, column: str) -> float | None:
        return self.cell(row, column).value

    @property
    def decimals(self) -> int:
        """The precision the paper prints this table at: the most decimals any printed number has
        (YAML drops trailing zeros, so one cell's 72.1 is the paper's 72.10)."""
        return printed_decimals(v for c in self.cells.values() for v in (c.value, c.pm) if v is not None)


def printed_decimals(values) -> int:
    """The most decimals among numbers as transcribed (0.0058 -> 4, 72.09 -> 2, 97 -> 0)."""
    most = 0
    for value in values:
        text = repr(float(value))
        if "e" in text:  # repr switches to exponents below 1e-4: count from the exponent
            mantissa, exponent = text.split("e")
            places = len(mantissa.split(".")[1].rstrip("0")) if "." in mantissa else 0
            most = max(most, places - int(exponent))
        else:
            most = max(most, len(text.split(".")[1].rstrip("0")))
    return most


def _number(raw, what: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise PaperTableError(f"{what} is {raw!r}: expected a finite number")
    return float(raw)


def parse_paper_table(doc: dict, origin: str = "<memory>") -> PaperTable:
    """Check a transcription's structure and build a `PaperTable` (raises `PaperTableError`)."""
    if not isinstance(doc, dict):
        raise PaperTableError(f"{origin}: expected a mapping at the top level")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise PaperTableError(f"{origin}: missing keys {missing}")
    rows, columns = tuple(map(str, doc["rows"])), tuple(map(str, doc["columns"]))
    for name, labels in (("rows", rows), ("columns", columns)):
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise PaperTableError(f"{origin}: duplicate {name} {dupes}; make labels unique (e.g. 'E=1 / FedAvg')")
    source = str(doc["source"])
    cells: dict[tuple[str, str], PaperCell] = {}
    for i, raw in enumerate(doc["cells"]):
        where = f"{origin}: cell {i}"
        if not isinstance(raw, dict) or "row" not in raw or "column" not in raw or "value" not in raw:
            raise PaperTableError(f"{where}: expected {{row, column, value[, pm, note]}}, got {raw!r}")
        row, column = str(raw["row"]), str(raw["column"])
        if row not in rows or column not in columns:
            raise PaperTableError(f"{where}: ({row!r}, {column!r}) is not a declared row and column")
        if (row, column) in cells:
            raise PaperTableError(f"{where}: ({row!r}, {column!r}) is given twice")
        value, marker = raw["value"], None
        if isinstance(value, str):
            if value not in MARKERS:
                raise PaperTableError(f"{where}: value {value!r} is neither a number nor one of {sorted(MARKERS)}")
            marker, value = value, None
        else:
            value = _number(value, f"{where} value")
        pm = raw.get("pm")
        if pm is not None:
            pm = _number(pm, f"{where} pm")
            if pm < 0 or marker is not None:
                raise PaperTableError(f"{where}: pm must be >= 0 and only accompany a number")
        cells[(row, column)] = PaperCell(row, column, value, pm, marker, source, str(raw.get("note", "")))
    absent = [(r, c) for r in rows for c in columns if (r, c) not in cells]
    if absent:
        raise PaperTableError(f"{origin}: {len(absent)} cells missing, first {absent[:3]}; "
                              f"use value: lost for a number the rendering lost")
    decimals = printed_decimals(v for c in cells.values() for v in (c.value, c.pm) if v is not None)
    cells = {key: replace(cell, decimals=decimals) for key, cell in cells.items()}
    return PaperTable(id=str(doc["id"]), paper=str(doc["paper"]), table=str(doc["table"]), source=source,
                      caption=str(doc["caption"]), metric=str(doc["metric"]), rows=rows, columns=columns,
                      cells=cells, notes=tuple(map(str, doc.get("notes") or ())))


def paper_table_ids() -> list[str]:
    return sorted(p.stem for p in PAPERS_DIR.glob("*.yaml"))


@cache
def load_paper_table(table_id: str) -> PaperTable:
    path = PAPERS_DIR / f"{table_id}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no transcription {path}; known tables: {paper_table_ids()}")
    table = parse_paper_table(yaml.safe_load(path.read_text()), str(path))
    if table.id != table_id:
        raise PaperTableError(f"{path}: id {table.id!r} does not match the file name")
    return table
