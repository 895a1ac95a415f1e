"""Each paper table in the paper's own layout: ours (mean ± std, n) beside the paper's value and Δ.

A cell is built from run files only (`results/runs/.../metrics.json`, `history.csv`):

- the suite is in `reproduce.suites` of params.yaml and its runs exist → our numbers;
- the suite is in `reproduce.imported` (trained elsewhere, a GPU, and committed as `packed ship`
  archives under `results/imported/<suite>/`) → the numbers of the seeds imported so far, marked
  "imported";
- the suite is in neither → `not run: <reason>`: whether its runs need a GPU or train on a CPU at the
  measured rate (`cost.CPU_RATES`), and where its data comes from;
- the layout says the cell has no counterpart → `not run: <reason>`;
- the cell is a difference row or an average column the paper computes from others → the same
  arithmetic per seed on the cells it names (`layouts`' module doc), then mean ± std over seeds.

Final-round numbers, as everywhere in fedskew; where the paper does not say which round it
reports, one sensitivity protocol reads each run's best evaluated round instead, labelled as such
(`layouts.BEST_ROUND_PROTOCOL`). A diverged seed is counted apart. Numbers print at the paper's
precision, or at 3 significant digits where that is coarser (`policy.decimals_for`): a loss of
0.0058 keeps its digits.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fedskew import metrics, paths
from fedskew.config import Params, RunConfig
from fedskew.reproduce.cost import CPU_RATES, data_origin, run_flops, table_runs
from fedskew.reproduce.layouts import BEST_ROUND_PROTOCOL, STATISTICS, CellSpec, Layout, load_layouts
from fedskew.reproduce.policy import decimals_for
from fedskew.runfiles import read_history, read_metrics, recorded_run_id

OFFLINE_SOURCES = {"digits", "synthetic"}


@dataclass
class OurCell:
    """Our numbers for one cell (per seed), or why there are none."""

    spec: CellSpec
    seeds: dict[int, float] = field(default_factory=dict)   # seed -> metric, as shown (accuracy in %, a loss)
    diverged_seeds: set[int] = field(default_factory=set)   # seeds whose run diverged (no metric)
    stale_seeds: set[int] = field(default_factory=set)      # seeds whose run is out of date (not used: fedskew.stale)
    not_run: str | None = None
    imported: bool = False   # read from runs trained elsewhere (reproduce.imported)

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def diverged(self) -> int:
        return len(self.diverged_seeds)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.seeds.values()) if self.seeds else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.seeds.values()) if self.n >= 2 else None

    def places(self, decimals: int) -> int:
        """Decimals to print at: the paper's, or 3 significant digits where finer (a loss of 0.0058); a
        difference keeps the paper's, since one near 0 is a small gap, not a small quantity."""
        return decimals if self.spec.difference is not None else decimals_for(self.mean, decimals)

    def text(self, decimals: int = 2) -> str:
        """mean ± std (n) at the paper's precision `decimals`, or 3 significant digits where finer."""
        if self.not_run:
            return f"not run: {self.not_run}"
        if not self.seeds:
            return f"diverged ({self.diverged} seeds)"
        places = self.places(decimals)
        spread = f" ± {self.std:.{places}f}" if self.std is not None else ""
        extra = f", {self.diverged} diverged" if self.diverged else ""
        extra += f", {len(self.stale_seeds)} out of date" if self.stale_seeds else ""
        best = ", best round" if self.spec.statistic == "best" else ""
        imported = ", imported" if self.imported else ""
        sign = "+" if self.spec.difference is not None else ""   # a difference says which way it goes
        return f"{self.mean:{sign}.{places}f}{spread} (n={self.n}{best}{imported}{extra})"


def cell_runs(params: Params, spec: CellSpec) -> list[RunConfig]:
    """The runs (one a seed) of the suite's grid point that a cell names."""
    if spec.suite not in params.raw["suites"]:  # a project whose params.yaml leaves the paper suites out
        return []
    return [cfg for cfg in params.suite_runs(spec.suite)
            if (cfg.dataset, cfg.partition, cfg.method) == (spec.dataset, spec.partition, spec.method)]


def not_run_reason(params: Params, spec: CellSpec) -> str:
    """Why a cell's suite is not part of the reproduction, and what it would take (short: it sits in a cell):
    a CPU at the measured rate where there is one for its model and data, else a GPU; and where the data
    comes from."""
    runs = cell_runs(params, spec)
    source = runs[0].dataset_spec["source"] if runs else None
    if source is None or source in OFFLINE_SOURCES:
        return f"{spec.suite} is not in reproduce.suites"
    rate = CPU_RATES.get((runs[0].train.model, source))
    if rate is None:
        return f"needs a GPU; data: {data_origin(source)} ({spec.suite})"
    minutes = sum(run_flops(cfg) for cfg in runs) / len(runs) / (rate * 1e9) / 60
    return (f"trains on a CPU, about {minutes:.2g} CPU-minutes a run; data: {data_origin(source)} "
            f"({spec.suite} is not in reproduce.suites)")


def read_cell(params: Params, spec: CellSpec, metric: str, reproduce_suites: set[str],
              root: Path = Path(".")) -> OurCell:
    """Our numbers for one cell: `metric` (a final-round summary value, `layouts.paper_table_metrics`) of each
    seed's run, in the unit pages show it in, at the round or statistic the spec names; or why there are none."""
    if spec.not_run:
        return OurCell(spec, not_run=spec.not_run)
    imported = spec.suite in params.imported_suites
    if spec.suite not in reproduce_suites and not imported:
        return OurCell(spec, not_run=not_run_reason(params, spec))
    runs = cell_runs(params, spec)
    if not runs:
        return OurCell(spec, not_run=f"{spec.suite} does not run {spec.method} on {spec.dataset}/{spec.partition}")
    stale: set[int] = set()
    if imported:  # trained elsewhere: the seeds imported so far (a run's metrics.json is written last)
        wanted, left_out = len(runs), _left_out_as_stale(spec.suite, root)
        # Out of date: left out by the import, or here from an earlier one under another id (fedskew.stale).
        stale = {cfg.seed for cfg in runs if cfg.path(paths.RUN_DIR).as_posix() in left_out
                 or recorded_run_id(cfg, root) not in (None, cfg.run_id)}
        runs = [cfg for cfg in runs if cfg.seed not in stale and (root / cfg.path(paths.RUN_METRICS)).exists()]
        if not runs:
            reason = f"{len(stale)} of its {wanted} runs out of date" if stale else f"0 of its {wanted} runs imported"
            return OurCell(spec, not_run=f"{reason} ({spec.suite})", stale_seeds=stale)
    measure = metrics.summary_key(metric)[0]
    cell = OurCell(spec, imported=imported, stale_seeds=stale)
    for cfg in runs:
        record = read_metrics(cfg, root)
        if record.get("status") == "diverged":
            cell.diverged_seeds.add(cfg.seed)
            continue
        if spec.statistic not in STATISTICS:
            raise ValueError(f"cell {spec}: statistic {spec.statistic!r} is not one of {STATISTICS}")
        if spec.statistic == "best":
            value = _best_value(cfg, root, spec.round, measure)
        elif spec.round is not None:
            value = _history_value(cfg, root, spec.round, measure)
        else:
            value = float(record[metric])
        cell.seeds[cfg.seed] = measure.scale.shown(value)
    return cell


def _left_out_as_stale(suite: str, root: Path) -> set[str]:
    """The run folders the import of an imported suite left out as out of date (its mark: `packed import --mark`)."""
    try:
        mark = json.loads((root / paths.IMPORTED.format(suite=suite)).read_text())
    except (OSError, ValueError):  # not imported yet, or a mark written before marks listed anything
        return set()
    return {entry["run"] for entry in mark.get("stale", [])} if isinstance(mark, dict) else set()


def _history_value(cfg: RunConfig, root: Path, rnd: int, measure: metrics.Metric) -> float:
    column = measure.column
    for row in read_history(cfg, root):
        if row["round"] == rnd and column in row:
            return float(row[column])
    raise ValueError(f"{cfg.path(paths.RUN_HISTORY)} has no evaluated round {rnd}: "
                     f"set eval_every to a divisor of {rnd}")


def _best_value(cfg: RunConfig, root: Path, last_round: int | None, measure: metrics.Metric) -> float:
    """The best evaluated round up to `last_round` (all rounds if None): the highest accuracy, or the
    lowest loss. A statistic of its own, labelled as such: it never replaces the final round."""
    column = measure.column
    values = [float(row[column]) for row in read_history(cfg, root)
              if column in row and row[column] not in ("", None) and (last_round is None or row["round"] <= last_round)]
    if not values:
        raise ValueError(f"{cfg.path(paths.RUN_HISTORY)} has no evaluated round"
                         + (f" up to {last_round}" if last_round is not None else ""))
    return measure.better.best(values)


def our_cells(params: Params, layout: Layout, protocol: str | None, root: Path = Path("."),
              suites: set[str] | None = None) -> dict[tuple[str, str], OurCell]:
    """Our cells of a layout under one protocol, read from the runs of `suites` (default: reproduce.suites; a
    suite of reproduce.imported reads the runs imported so far)."""
    suites = set(params.reproduce_suites) if suites is None else suites
    rows = (*layout.table.rows, *layout.extra_rows)
    cells = {(r, c): read_cell(params, spec, layout.metric, suites, root)
             for r in rows for c in layout.table.columns
             if not (spec := layout.cell(r, c, protocol)).derived or spec.not_run}
    for r in rows:
        for c in layout.table.columns:
            if (r, c) not in cells:   # derived from cells read above (a layout never derives from a derived cell)
                spec = layout.cell(r, c, protocol)
                if spec.difference is not None:
                    first, second = (cells[(row, c)] for row in spec.difference)
                    cells[(r, c)] = derive(spec, [first, second], lambda v: v[0] - v[1])
                else:
                    cells[(r, c)] = derive(spec, [cells[(r, column)] for column in spec.mean_of], statistics.fmean)
    return cells


def derive(spec: CellSpec, parts: list[OurCell], combine) -> OurCell:
    """A cell computed per seed from other cells (`combine` maps their values for one seed to one value),
    over the seeds every part has. Not run, for the first part's reason, if any part has not run."""
    missing = next((part for part in parts if part.not_run), None)
    if missing is not None:
        return OurCell(spec, not_run=missing.not_run)
    common = set.intersection(*(set(part.seeds) for part in parts))
    # a seed on which any part diverged has no derived value either
    cell = OurCell(spec, seeds={seed: combine([part.seeds[seed] for part in parts]) for seed in sorted(common)},
                   diverged_seeds=set().union(*(part.diverged_seeds for part in parts)),
                   imported=any(part.imported for part in parts))
    if not cell.seeds and not cell.diverged:
        cell.not_run = "its cells share no seed"
    return cell


def delta(ours: OurCell, paper_value: float | None) -> float | None:
    return None if ours.mean is None or paper_value is None else ours.mean - paper_value


def _uncovered(ours: OurCell) -> bool:
    """A cell a sensitivity protocol leaves out (as opposed to one that cannot run here)."""
    return bool(ours.not_run) and (ours.not_run.startswith("not part of") or " does not run " in ours.not_run)


def _cell_md(ours: OurCell, paper_text: str | None, d: float | None, decimals: int) -> str:
    parts = [ours.text(decimals)]
    if paper_text is not None:
        parts.append(f"paper {paper_text}")
    if d is not None:
        parts.append(f"Δ {d:+.{ours.places(decimals)}f}")
    return "<br>".join(parts)


def protocol_label(protocol: str | None) -> str:
    return protocol or "main protocol"


def _page_head(layout: Layout, table_id: str) -> list[str]:
    """The page's title, caption and how to read a cell."""
    table = layout.table
    lines = [f"# {table.source} — ours beside the paper's", "",
             f"*{table.caption}*", "",
             f"Each cell: fedskew's final-round {layout.measure.described} (mean ± sample std over seeds, n), the "
             "paper's value, and Δ = ours − paper, at the paper's precision (or 3 significant digits where that is "
             "finer). `not run` says why a cell has no number here. Built from the run files by "
             f"`snakemake --cores all results/papers/{table_id}.md`.", ""]
    if any(layout.cell(r, c).derived for r in table.rows for c in table.columns):
        lines[-1:-1] = ["", "A row or column the paper computes from others (a difference, an average) is computed "
                        "the same way for each seed from our cells it names, then mean ± sample std over seeds: "
                        "a difference row is the paired per-seed difference."]
    return lines


def _protocol_heading(layout: Layout, protocol: str | None) -> list[str]:
    """The heading of one protocol's grid, and what the protocol changes."""
    label = protocol_label(protocol)
    if protocol == BEST_ROUND_PROTOCOL:
        best = f"{layout.measure.better.superlative} {layout.measure.label}"
        return [f"## Sensitivity: {label}", "",
                f"Every cell of the main protocol read at its run's best evaluated round ({best}; runs are "
                "evaluated every `eval_every` rounds) instead of the final one. The paper does not say which "
                "round it reports. Picking the best round inflates numbers, most where seeds vary most: this "
                "statistic is labelled as such and never replaces the final round above.", ""]
    if protocol is not None:
        return [f"## Sensitivity: {label}", "",
                "The same cells under a protocol the paper leaves open; — marks a cell this protocol "
                "does not cover.", ""]
    return [f"## {label.capitalize()}", ""]


def _cell_record(row: str, column: str, ours: OurCell, paper, d: float | None) -> dict:
    """One cell in the JSON twin: the paper's value, ours per seed and summarised, and the spec it reads."""
    return {"row": row, "column": column, "paper": paper.value if paper else None,
            "paper_pm": paper.pm if paper else None, "ours_mean": ours.mean,
            "ours_std": ours.std, "n": ours.n, "seeds": ours.seeds,
            "diverged": ours.diverged, "delta": d, "not_run": ours.not_run,
            "spec": asdict(ours.spec),
            **({"stale": sorted(ours.stale_seeds)} if ours.stale_seeds else {})}


def _protocol_grid(layout: Layout, protocol: str | None, cells: dict[tuple[str, str], OurCell]
                   ) -> tuple[list[str], list[dict]]:
    """One protocol's grid (markdown lines) and its cells' records; a sensitivity protocol none of whose cells
    runs here is one line, not a grid of "not run", and no records (the main protocol lists the runs)."""
    table = layout.table
    if protocol is not None and not any(cell.n for cell in cells.values()):
        return ["No cell of this protocol has been run (its suites are not in `reproduce.suites`).", ""], []
    header = ["", *table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for row in (*table.rows, *layout.extra_rows):
        texts = []
        for column in table.columns:
            ours = cells[(row, column)]
            paper = table.cells.get((row, column))
            d = delta(ours, paper.value if paper is not None else None)
            if protocol is not None and _uncovered(ours):
                texts.append("—")  # the sensitivity protocol does not cover this cell
            else:
                texts.append(_cell_md(ours, paper.text if paper is not None else None, d, table.decimals))
            records.append(_cell_record(row, column, ours, paper, d))
        name = row if row in table.rows else f"{row} *(fedskew only)*"
        lines.append("| " + " | ".join([name, *texts]) + " |")
    return [*lines, ""], records


def _protocol_notes(params: Params, layout: Layout, record: dict, root: Path) -> list[str]:
    """The page's last sections: the suites its cells read (imported ones with their machines), the suites not
    in the reproduction, and the layout's and the transcription's notes."""
    table_id = layout.table.id
    lines = ["## Protocol", ""]
    suites = sorted({c["spec"]["suite"] for cells in record["protocols"].values() for c in cells
                     if c["spec"]["suite"] and not c["not_run"]})
    for suite in suites:
        lines.append(f"- `{suite}`: {params.raw['suites'][suite].get('description', '')} "
                     f"(table: [results/tables/{suite}.md](../tables/{suite}.md))")
    for suite in (s for s in suites if s in params.imported_suites):
        lines.append(f"- `{suite}` is imported: {_imported_summary(params, table_id, suite, root)}, shipped "
                     f"as archives in `results/imported/{suite}/` ([docs/gpu.md](../../docs/gpu.md)); its "
                     "cells read the seeds imported so far.")
    if not suites:
        lines.append("- No cell of this table is in the reproduction; the suites each cell would use are in "
                     "the JSON twin (`spec`).")
    absent = sorted({c["spec"]["suite"] for cells in record["protocols"].values() for c in cells
                     if c["spec"]["suite"] and c["not_run"] and c["spec"]["suite"] not in params.reproduce_suites
                     and c["spec"]["suite"] not in params.imported_suites and not c["spec"]["not_run"]})
    if absent:
        lines.append(f"- Not in the reproduction: {', '.join(f'`{s}`' for s in absent)}. Each cell says "
                     "whether its runs need a GPU or train on a CPU, and where its data comes from; add a "
                     "suite to `reproduce.suites` in params.yaml and the same target trains it and fills its "
                     "cells (`python -m fedskew cost` gives each table's compute).")
    if layout.notes or layout.table.notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {note}" for note in layout.notes]
        lines += [f"- Transcription: {note}" for note in layout.table.notes]
    return lines


def render(params: Params, table_id: str, root: Path = Path(".")) -> tuple[str, dict]:
    """The markdown page and the JSON twin of one paper table: a grid per protocol, then the protocol notes."""
    layout = load_layouts()[table_id]
    table = layout.table
    lines = _page_head(layout, table_id)
    record = {"table": table_id, "source": table.source, "caption": table.caption, "metric": layout.metric,
              "protocols": {}}
    for protocol in (None, *layout.protocols):
        grid, cells = _protocol_grid(layout, protocol, our_cells(params, layout, protocol, root))
        lines += [*_protocol_heading(layout, protocol), *grid]
        record["protocols"][protocol_label(protocol)] = cells
    lines += _protocol_notes(params, layout, record, root)
    return "\n".join(lines) + "\n", record


def _imported_summary(params: Params, table_id: str, suite: str, root: Path) -> str:
    """How many of the table's runs of an imported suite are here, and what trained them."""
    runs = [cfg for cfg in table_runs(params, table_id).values() if cfg.suite == suite]
    left_out = _left_out_as_stale(suite, root)
    stale = [cfg for cfg in runs if cfg.path(paths.RUN_DIR).as_posix() in left_out
             or recorded_run_id(cfg, root) not in (None, cfg.run_id)]
    present = [cfg for cfg in runs if cfg not in stale and (root / cfg.path(paths.RUN_METRICS)).exists()]
    machines = sorted({f"{p.get('device_name', p.get('device', 'an unrecorded device'))} "
                       f"({p.get('precision', '?')}, torch {p.get('torch', '?')})"
                       for p in (read_metrics(cfg, root).get("provenance", {}) for cfg in present)})
    out_of_date = (f", {len(stale)} more out of date (trained under another run id: `python -m fedskew stale` says "
                   "why)" if stale else "")
    return (f"{len(present)} of its {len(runs)} runs in this table, trained on {', '.join(machines) or 'none yet'}"
            f"{out_of_date}")


def write_paper_table(params: Params, table_id: str, out_md: Path, out_json: Path, root: Path = Path(".")) -> None:
    from fedskew.runfiles import atomic_write_text

    text, record = render(params, table_id, root)
    atomic_write_text(out_md, text)
    atomic_write_text(out_json, json.dumps(record, indent=1, default=_json_default, allow_nan=False) + "\n")


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"cannot serialise {value!r}")
