"""A suite's rebuilt tables checked against what they are compared with, and the line that says so.

`make run`, `fedskew run --suite S` and `make verify` compare each table file of a suite (its tables, and its
comparison's where it has one: `fedskew compare`'s md, csv and json) with a reference read before anything is
built, so that a build cannot overwrite what it is compared with:

- the committed tables (git HEAD), when every one of the suite's files is committed: a shipped suite;
- else the previous build's tables, the files as they were before this build, not committed: a researcher's
  own suite (experiments/) built before. A difference there lists the cells that changed since;
- else nothing: a suite built for the first time, "built; no committed table to compare".

Each suite is reported against its own reference, never another's: the closing line claims "identical, byte for
byte, to the committed tables" only of suites that were compared with them.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import metrics, paths

TABLE_EXTS = ("md", "csv", "tex", "json")
COMPARISON_EXTS = ("md", "csv", "json")  # a suite's comparison (fedskew compare), where it has one
# The figures are rebuilt but not compared: a PNG's bytes follow the matplotlib and libpng build, not the numbers.

COMMITTED, PREVIOUS, NOTHING = "committed", "previous build", "nothing"
PREVIOUS_LABEL = "the previous build's tables (not committed)"
NOTHING_TO_COMPARE = "built; no committed table to compare"


@dataclass(frozen=True)
class Reference:
    """What a suite's table files are compared with: `kind` (COMMITTED, PREVIOUS or NOTHING), as the closing line
    names it (`label`), and each file's bytes by name (None: no such file there)."""

    kind: str
    label: str
    files: dict[str, bytes | None]


@dataclass(frozen=True)
class CellDiff:
    """One cell of a suite's table that differs: `key` is dataset/partition/method."""

    key: str
    field: str
    committed: float | None
    rebuilt: float | None

    def text(self) -> str:
        if self.committed is None or self.rebuilt is None:
            return f"{self.key} {self.field}: {_show(self.committed)} -> {_show(self.rebuilt)}"
        scale = 100.0 if "acc" in self.field else 1.0
        delta = (self.rebuilt - self.committed) * scale
        unit = " points" if scale == 100.0 else ""
        return (f"{self.key} {self.field}: {_show(self.committed, scale)} -> {_show(self.rebuilt, scale)} "
                f"({delta:+.4g}{unit})")


def _show(value: float | None, scale: float = 1.0) -> str:
    return "absent" if value is None else f"{value * scale:.6g}"


@dataclass
class TableCheck:
    """The check of one suite's table files (and its comparison's) against their reference."""

    suite: str
    reference: Reference
    files: int = len(TABLE_EXTS)  # the files compared: its tables, and its comparison's
    differing_files: list[str] = field(default_factory=list)
    missing_reference: list[str] = field(default_factory=list)
    cells: list[CellDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differing_files and not self.missing_reference

    @property
    def differs(self) -> bool:
        """A table differs from its reference (a table with nothing to compare with does not differ: it is new)."""
        return bool(self.differing_files)

    @property
    def differs_from_committed(self) -> bool:
        """A committed table is not what the build gives: the proof failed (a previous build's is only earlier)."""
        return self.differs and self.reference.kind == COMMITTED

    def summary(self) -> str:
        """The suite, and what its tables were compared with and found."""
        if self.reference.kind == NOTHING:
            return f"{self.suite}: {NOTHING_TO_COMPARE}"
        if self.identical:
            return f"{self.suite}: identical, byte for byte, to {self.reference.label}"
        parts = []
        if self.differing_files:
            what = f"{len(self.cells)} cell(s) differ" if self.cells else "the numbers agree, the text differs"
            parts.append(f"{', '.join(self.differing_files)} differ from {self.reference.label}: {what}")
        if self.missing_reference:
            parts.append(f"{', '.join(self.missing_reference)} new (nothing to compare with)")
        return f"{self.suite}: " + "; ".join(parts)


def table_files(suite: str, root: Path = Path("."), compared: bool = False) -> dict[str, Path]:
    """A suite's table files by name (`default.md`), and its comparison's (`compare/default.md`) if `compared`."""
    files = {f"{suite}.{ext}": root / paths.TABLE.format(suite=suite, ext=ext) for ext in TABLE_EXTS}
    return files | ({f"compare/{suite}.{ext}": root / paths.COMPARISON.format(suite=suite, ext=ext)
                     for ext in COMPARISON_EXTS} if compared else {})


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)


def _committed(root: Path, files: dict[str, Path]) -> Reference | None:
    """The files as committed at HEAD, when every one of them is there; else None."""
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        blobs: dict[str, bytes | None] = {}
        for name, path in files.items():  # `./`: the path from root, wherever root is in its repository
            shown = _git(root, "show", f"HEAD:./{path.relative_to(root).as_posix()}")
            if shown.returncode != 0:
                return None
            blobs[name] = shown.stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return Reference(COMMITTED, f"the committed tables (HEAD {head.stdout.decode().strip()})", blobs)


def read_references(suite: str, root: Path = Path("."), compared: bool = False) -> Reference:
    """What each table file of `suite` (and its comparison's if `compared`) is to be compared with (module
    docstring): read before a build, so that the build cannot overwrite it."""
    files = table_files(suite, root, compared)
    if (committed := _committed(root, files)) is not None:
        return committed
    present = {name: (path.read_bytes() if path.exists() else None) for name, path in files.items()}
    if any(data is not None for data in present.values()):
        return Reference(PREVIOUS, PREVIOUS_LABEL, present)
    return Reference(NOTHING, "nothing", present)


def cell_differences(committed_json: bytes, rebuilt_json: bytes) -> list[CellDiff]:
    """The numbers that differ between two `<suite>.json` tables, cell by cell (exact comparison)."""
    try:
        committed, rebuilt = json.loads(committed_json), json.loads(rebuilt_json)
    except ValueError:
        return []
    cells = []
    for key in sorted(set(committed) | set(rebuilt)):
        old, new = committed.get(key, {}), rebuilt.get(key, {})
        for name in sorted(set(old) | set(new), key=_field_order):
            a, b = old.get(name), new.get(name)
            if a != b and not (_is_nan(a) and _is_nan(b)):
                cells.append(CellDiff(key, name, a, b))
    return cells


def _field_order(name: str) -> tuple[int, str]:
    """The reported metric's fields first (its mean, then its std), then the others by name."""
    return (0 if name.startswith(metrics.reported_key()) else 1, name)


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare(suite: str, built_root: Path, reference: Reference) -> TableCheck:
    """Compare the table files built under `built_root` with `reference` (read by `read_references`)."""
    check = TableCheck(suite, reference, len(reference.files))
    files = table_files(suite, built_root, compared=len(reference.files) > len(TABLE_EXTS))
    built = {name: path.read_bytes() for name, path in files.items()}
    for name in files:
        if reference.files.get(name) is None:
            check.missing_reference.append(name)
        elif reference.files[name] != built[name]:
            check.differing_files.append(name)
    table = f"{suite}.json"
    if reference.files.get(table) is not None and reference.files[table] != built[table]:
        check.cells = cell_differences(reference.files[table], built[table])
    return check


def closing_line(checks: list[TableCheck], how: str) -> str:
    """The one line a rebuild ends with: a claim of identity only where every suite was compared with the same
    reference; else each suite with what it was compared with."""
    names = ", ".join(c.suite for c in checks)
    tables = sum(c.files for c in checks)
    labels = {c.reference.label for c in checks}
    if all(c.identical for c in checks) and len(labels) == 1:
        return f"fedskew: {how} {names}: all {tables} tables are identical, byte for byte, to {labels.pop()}."
    if all(c.reference.kind == NOTHING for c in checks):
        return f"fedskew: {how} {names}: {NOTHING_TO_COMPARE} ({tables} tables written)."
    differing = sum(c.differs for c in checks)
    if differing:
        verdict = f"{differing} of {len(checks)} suite(s) differ"
    elif all(c.identical for c in checks):
        verdict = "every table is identical, byte for byte, to what it was compared with"
    else:
        verdict = "no table differs, but not every table had one to compare with"
    return f"fedskew: {how}: {verdict}: " + " | ".join(c.summary() for c in checks)  # each with its reference


def report(checks: list[TableCheck], how: str, max_cells: int = 40) -> str:
    """The cells that differ (at most `max_cells` per suite), then the closing line."""
    lines = []
    for check in checks:
        for cell in check.cells[:max_cells]:
            lines.append(f"  {check.suite}: {cell.text()}")
        if len(check.cells) > max_cells:
            lines.append(f"  {check.suite}: ... and {len(check.cells) - max_cells} more (compare the .json tables)")
    lines.append(closing_line(checks, how))
    return "\n".join(lines)
