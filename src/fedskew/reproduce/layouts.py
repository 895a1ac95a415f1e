"""Where each cell of a paper's table comes from in fedskew: one layout file per paper.

`layouts/<paper>.yaml` maps every transcribed table (`papers/<id>.yaml`) onto runs:

```yaml
fedlc_t4:
  defaults: {suite: fedlc_t4_synthetic, partition: natural}   # fields every cell starts from
  rows:                                  # a paper row label (or one level of it) -> fields
    FedAvg: {method: fedavg}
    FedOPT: {method: fedadam}
    Difference: {difference: [FedOPT, FedAvg]}  # a row the paper computes from others
  columns:                               # a paper column label (or one level of it) -> fields
    "Synthetic(0,0)": {dataset: synthetic_0_0}
    FEMNIST: {dataset: femnist, suite: fedlc_federated_table}
    Avg.: {mean_of: ["Synthetic(0,0)", "Synthetic(1,1)"]}   # a column the paper computes from others
  extra_rows:                            # fedskew-only rows shown under the paper's (no paper value)
    "FedLC, missing classes floor": {method: fedlc_floor}
  protocols:                             # the same cells under other protocols the paper leaves open:
    "participation 1.0, E=1": {suite: {fedlc_t4_synthetic: fedlc_t4_p1}}   # field -> {old: new}
    "data redrawn": {suite: {fedlc_t4_synthetic: fedlc_t4_redraw}, dataset: {synthetic_1_1: synthetic_1_1_draw1}}
    "missing classes floor": {method: {fedlc: fedlc_floor}}   # swaps a method only: other cells stay
  proxies:                               # offline settings that test the direction of gap claims
    - {label: "digits Q(2), methods suite", suite: methods, dataset: digits, partition: q2}
  cross:                                 # a row level x a column level -> fields, applied after both
    "K=10": {"α=2": {partition: qpl2}}   # (for a field that depends on the row and the column together)
  metric: final_acc                      # a final-round value of fedskew.metrics: final_acc (default, in %), final_loss
  reported_round: silent                 # final / best / silent (default): which round the paper reports
  notes: ["how the mapping was chosen"]
```

Where the paper does not say which round it reports (`reported_round: silent`, true of all four
papers), the layout gains one more protocol, `BEST_ROUND_PROTOCOL`: every cell of the main protocol
read at its best evaluated round instead of its final one (the best-round statistic, labelled as such;
it never replaces the final round, which is the main protocol).

A label with several levels ("CIFAR10 / β=0.05", "E=1 / FedAvg") is looked up whole
first, then level by level, the fields of every level merged (later levels win). A cell's
fields are defaults ⊕ row ⊕ column: `suite`, `dataset`, `partition`, `method`, and
optionally `round` (the accuracy at that round of the run: with a constant learning rate,
exactly the result of a run that stops there), `statistic` (`final`, the default, or `best`: the
best evaluated round up to `round`) or `not_run` (a reason: the cell has no fedskew counterpart,
e.g. the paper does not name the dataset).

A row or column the paper computes from others is derived from the same runs, per seed: a
`difference: [A, B]` row level is A − B for each seed both have (row "MNIST / Difference" with
`Difference: {difference: [Ours, FedAvg]}` is "MNIST / Ours" − "MNIST / FedAvg"), and a `mean_of:
[columns]` column is the mean over those columns for each seed every one has. Mean ± std over seeds
follow as for any cell, so a derived cell is the paired comparison, not a difference of means; a cell
it derives from that has not run makes it not run for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from fedskew import metrics
from fedskew.metrics import Statistic
from fedskew.reproduce.paper_tables import PaperTable, load_paper_table

LAYOUTS_DIR = Path(__file__).parent / "layouts"
CELL_FIELDS = ("suite", "dataset", "partition", "method", "round", "statistic", "not_run", "difference", "mean_of")
STATISTICS = ("final", "best")
REPORTED_ROUNDS = ("final", "best", "silent")
BEST_ROUND_PROTOCOL = "main protocol, best round instead of the final one (the paper does not say which it reports)"


class LayoutError(ValueError):
    """A layout that does not fit its paper table or params.yaml."""


def paper_table_metrics() -> list[str]:
    """What a paper table's cells may read: the final-round value of any one-number metric of fedskew.metrics
    (a cell can also read it at an earlier round, or at the best round, from the history)."""
    return [m.key(Statistic.FINAL) for m in metrics.summarised(Statistic.FINAL) if m.kind is metrics.Kind.EVALUATED]


@dataclass(frozen=True)
class CellSpec:
    """What fedskew runs for one cell: a grid point of a suite, or a reason it has none."""

    suite: str | None = None
    dataset: str | None = None
    partition: str | None = None
    method: str | None = None
    round: int | None = None
    statistic: str = "final"   # "best": the best evaluated round (highest accuracy, lowest loss)
    not_run: str | None = None
    difference: tuple[str, str] | None = None   # derived: row A − row B, per seed (see the module's doc)
    mean_of: tuple[str, ...] | None = None      # derived: the mean over these columns, per seed

    @property
    def derived(self) -> bool:
        """Computed from other cells of the table, not read from runs of its own."""
        return self.difference is not None or self.mean_of is not None


@dataclass(frozen=True)
class Layout:
    table: PaperTable
    defaults: dict
    rows: dict
    columns: dict
    extra_rows: dict = field(default_factory=dict)
    protocols: dict = field(default_factory=dict)
    proxies: tuple = ()
    cross: dict = field(default_factory=dict)
    metric: str = field(default_factory=metrics.reported_key)   # a final-round value (`paper_table_metrics`)
    notes: tuple = ()
    reported_round: str = "silent"

    @property
    def measure(self) -> metrics.Metric:
        """The registered metric the cells read (fedskew.metrics)."""
        return metrics.summary_key(self.metric)[0]

    def _fields(self, label: str, mapping: dict, axis: str) -> dict:
        if label in mapping:
            return dict(mapping[label])
        merged: dict = {}
        for level in label.split(" / "):
            if level not in mapping:
                return {"not_run": f"no fedskew counterpart for the {axis} '{label}'"}
            merged.update(mapping[level])
        return merged

    def row_fields(self, row: str) -> dict:
        if row in self.extra_rows:
            return dict(self.extra_rows[row])
        return self._fields(row, self.rows, "row")

    def cell(self, row: str, column: str, protocol: str | None = None) -> CellSpec:
        """The spec of (row, column) under the main protocol or a named one."""
        fields = {"statistic": "final", **self.defaults}
        for part in (self.row_fields(row), self._fields(column, self.columns, "column")):
            reason = part.pop("not_run", None)
            fields.update(part)
            if reason and "not_run" not in fields:
                fields["not_run"] = reason
        for row_level in _levels(row):
            for column_level in _levels(column):
                fields.update(self.cross.get(row_level, {}).get(column_level, {}))
        for key in ("difference", "mean_of"):
            if key in fields:
                fields[key] = tuple(fields[key])
        if "difference" in fields:  # the whole row labels, as `difference_rows` resolves them
            fields["difference"] = self.difference_rows(row)
        derived = "difference" in fields or "mean_of" in fields
        # A derived cell takes each protocol through the cells it derives from.
        if protocol is not None and "not_run" not in fields and not derived:
            replaced = dict(fields)
            for key, mapping in self.protocols[protocol].items():
                if fields.get(key) in mapping:
                    replaced[key] = mapping[fields[key]]
            # A protocol that moves cells to other suites covers only the cells it moves; one that
            # only swaps a method (a reading of the method) keeps every other cell as it is.
            if "suite" in self.protocols[protocol] and replaced.get("suite") == fields.get("suite"):
                replaced["not_run"] = f"not part of the '{protocol}' sensitivity runs"
            fields = replaced
        return CellSpec(**fields)

    def difference_rows(self, row: str) -> tuple[str, str]:
        """The two whole row labels a difference row subtracts (A, B): its `difference` level replaced by each."""
        if "difference" in self.rows.get(row, {}):
            return tuple(self.rows[row]["difference"])
        levels = row.split(" / ")
        for i, level in enumerate(levels):
            if "difference" in self.rows.get(level, {}):
                return tuple(" / ".join([*levels[:i], other, *levels[i + 1:]])
                             for other in self.rows[level]["difference"])
        raise LayoutError(f"{self.table.id}: row {row!r} has no level with a difference")

    def method_of(self, row: str) -> str | None:
        """The method a row stands for (for proxies), if the row alone names one."""
        return self.row_fields(row).get("method")

    def suites(self) -> set[str]:
        """Every suite a cell of this layout reads, under any protocol."""
        out = set()
        for row in (*self.table.rows, *self.extra_rows):
            for column in self.table.columns:
                for protocol in (None, *self.protocols):
                    spec = self.cell(row, column, protocol)
                    if spec.suite and not spec.not_run and not spec.derived:
                        out.add(spec.suite)
        out.update(p["suite"] for p in self.proxies)
        return out


def _levels(label: str) -> list[str]:
    """A label and, if it has several, each of its levels."""
    return [label, *label.split(" / ")] if " / " in label else [label]


def _check_fields(where: str, fields: dict) -> None:
    if not isinstance(fields, dict):
        raise LayoutError(f"{where}: expected a mapping of {CELL_FIELDS}, got {fields!r}")
    unknown = set(fields) - set(CELL_FIELDS)
    if unknown:
        raise LayoutError(f"{where}: unknown fields {sorted(unknown)}; allowed: {list(CELL_FIELDS)}")
    difference, mean_of = fields.get("difference"), fields.get("mean_of")
    if difference is not None and not (isinstance(difference, list) and len(difference) == 2
                                       and all(isinstance(x, str) for x in difference)):
        raise LayoutError(f"{where}: difference must be two row labels [A, B] (A − B), got {difference!r}")
    if mean_of is not None and not (isinstance(mean_of, list) and mean_of and all(isinstance(x, str) for x in mean_of)):
        raise LayoutError(f"{where}: mean_of must be a list of column labels, got {mean_of!r}")


def parse_layout(table_id: str, doc: dict, origin: str) -> Layout:
    table = load_paper_table(table_id)
    allowed = {"defaults", "rows", "columns", "extra_rows", "protocols", "proxies", "cross", "metric", "notes",
               "reported_round"}
    unknown = set(doc) - allowed
    if unknown:
        raise LayoutError(f"{origin}: {table_id} has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in ("defaults", "rows", "columns", "extra_rows"):
        for label, fields in (doc.get(key) or {}).items() if key != "defaults" else [("", doc.get(key) or {})]:
            _check_fields(f"{origin}: {table_id}.{key}{'.' + label if label else ''}", fields)
    for row_level, by_column in (doc.get("cross") or {}).items():
        for column_level, fields in by_column.items():
            _check_fields(f"{origin}: {table_id}.cross.{row_level}.{column_level}", fields)
    metric = doc.get("metric", metrics.reported_key())
    if metric not in paper_table_metrics():
        raise LayoutError(f"{origin}: {table_id}.metric is {metric!r}; allowed: {paper_table_metrics()}")
    reported = doc.get("reported_round", "silent")
    if reported not in REPORTED_ROUNDS:
        raise LayoutError(f"{origin}: {table_id}.reported_round is {reported!r}; allowed: {list(REPORTED_ROUNDS)}")
    protocols = dict(doc.get("protocols") or {})
    for name, swaps in protocols.items():
        _check_fields(f"{origin}: {table_id}.protocols.{name}", swaps)
        if not all(isinstance(m, dict) for m in swaps.values()):
            raise LayoutError(f"{origin}: {table_id}.protocols.{name}: each field maps {{old: new}}, got {swaps}")
    if reported == "silent":
        # The paper does not say which round it reports: the best round is a sensitivity protocol.
        protocols[BEST_ROUND_PROTOCOL] = {"statistic": {"final": "best"}}
    layout = Layout(table=table, defaults=dict(doc.get("defaults") or {}), rows=dict(doc.get("rows") or {}),
                    columns=dict(doc.get("columns") or {}), extra_rows=dict(doc.get("extra_rows") or {}),
                    protocols=protocols, proxies=tuple(doc.get("proxies") or ()),
                    cross=dict(doc.get("cross") or {}),
                    metric=metric, notes=tuple(doc.get("notes") or ()), reported_round=reported)
    _check_derived(layout, origin)
    for proxy in layout.proxies:
        missing = {"label", "suite", "dataset", "partition"} - set(proxy)
        if missing:
            raise LayoutError(f"{origin}: {table_id}.proxies entry {proxy} lacks {sorted(missing)}")
    return layout


def _check_derived(layout: Layout, origin: str) -> None:
    """Every derived cell names cells of the table that are not derived themselves."""
    table = layout.table
    rows = (*table.rows, *layout.extra_rows)
    for label in layout.extra_rows:
        if "difference" in layout.extra_rows[label] or "mean_of" in layout.extra_rows[label]:
            raise LayoutError(f"{origin}: {table.id}.extra_rows.{label}: a derived row belongs under rows")
    for row in rows:
        for column in table.columns:
            spec = layout.cell(row, column)
            if spec.difference is not None:
                for other in spec.difference:
                    if other not in rows:
                        raise LayoutError(f"{origin}: {table.id}: row {row!r} subtracts {other!r}, which is not a "
                                          f"row of the table; rows: {list(rows)}")
                    if layout.cell(other, column).derived:
                        raise LayoutError(f"{origin}: {table.id}: row {row!r} subtracts {other!r}, itself derived")
            if spec.mean_of is not None:
                for other in spec.mean_of:
                    if other not in table.columns:
                        raise LayoutError(f"{origin}: {table.id}: column {column!r} averages {other!r}, which is "
                                          f"not a column of the table; columns: {list(table.columns)}")
                    if layout.cell(row, other).derived:
                        raise LayoutError(f"{origin}: {table.id}: column {column!r} averages {other!r}, "
                                          "itself derived")


@cache
def load_layouts() -> dict[str, Layout]:
    """Every table's layout, keyed by table id (each paper table must have one)."""
    out: dict[str, Layout] = {}
    for path in sorted(LAYOUTS_DIR.glob("*.yaml")):
        for table_id, doc in (yaml.safe_load(path.read_text()) or {}).items():
            if table_id in out:
                raise LayoutError(f"{path}: {table_id} is laid out twice")
            out[table_id] = parse_layout(table_id, doc or {}, str(path))
    return out


def check_against_params(layouts: dict[str, Layout], params) -> list[str]:
    """Every problem with suites, datasets, partitions and methods the layouts name (empty if none)."""
    problems = []
    raw = params.raw
    for table_id, layout in layouts.items():
        specs = [layout.cell(r, c, p) for r in (*layout.table.rows, *layout.extra_rows)
                 for c in layout.table.columns for p in (None, *layout.protocols)]
        specs += [CellSpec(p["suite"], p["dataset"], p["partition"]) for p in layout.proxies]
        for spec in specs:
            if (spec.not_run and not spec.suite) or spec.derived:
                continue
            for key, catalogue in (("suite", "suites"), ("dataset", "datasets"), ("partition", "partitions")):
                value = getattr(spec, key)
                if value is not None and value not in raw[catalogue]:
                    problems.append(f"{table_id}: {key} {value!r} is not defined in params.yaml {catalogue}")
            if spec.method is not None and spec.method not in raw["methods"]:
                from fedskew.algorithms import ALGORITHMS
                if spec.method not in ALGORITHMS:
                    problems.append(f"{table_id}: method {spec.method!r} is neither in params.yaml methods "
                                    "nor a registered algorithm")
    return sorted(set(problems))
