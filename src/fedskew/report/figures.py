"""The figures of each setting (dataset / partition) of a suite, from its run files.

``results/figures/<suite>/<dataset>_<partition>.png``: test accuracy (%) per evaluated
round, the mean over the seeds that finished with a ± one sample std band, clipped to
[0, 100]. Up to 8 methods share one panel; above that, small multiples: one panel per
method family (fedskew.report.method_families), a panel holding at most 10 methods. FedAvg
is the dashed grey reference line in every panel.

``results/figures/<suite>/<dataset>_<partition>_final.png``: the final-round accuracy of
each method (the number the tables report), best on top: the mean ± sample std over seeds
(error bar, clipped to [0, 100]), each seed as a small dot, the seed count and the diverged
seeds in the label. Where a paper prints a value for exactly this run (suite, dataset,
partition, method) under its main protocol, a hollow diamond marks it.

Runs are read through fedskew.runfiles (verified). A diverged seed is left out of the
curves and the means and counted in the labels, as in the tables. The best round is never
plotted.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedskew import metrics, paths
from fedskew.config import Params
from fedskew.report.drawing import pyplot, save_figure
from fedskew.report.method_families import (CALIBRATION, DRIFT, FAMILIES, OTHER, PLAIN, SPLIT, method_family, panels,
                                            reference_method)
from fedskew.runfiles import read_history, read_metrics

REFERENCE_STYLE = {"color": "0.35", "linestyle": "--", "linewidth": 1.6}
FAMILY_COLOURS = {PLAIN: "tab:blue", DRIFT: "tab:orange", CALIBRATION: "tab:green", SPLIT: "tab:purple",
                  OTHER: "tab:brown"}


@dataclass
class SeedRun:
    """One seed of one method: its final-round accuracy (%) and its curve, or that it diverged."""

    method: str
    seed: int
    diverged: bool
    final_acc: float | None      # %, None when diverged
    curve: pd.DataFrame          # columns round, acc (%); only evaluated rounds


@dataclass(frozen=True)
class PaperMark:
    """A paper's printed value for one run of ours (main protocol, final accuracy in %)."""

    table: str
    row: str
    column: str
    value: float
    pm: float | None


# ---------------------------------------------------------------------------------------------
# Reading and summarising


def load_runs(params: Params, suite: str, root: Path = Path(".")) -> dict[tuple[str, str], list[SeedRun]]:
    """Every run of the suite, grouped by setting (in params.yaml order), read through runfiles: the reported
    metric (fedskew.metrics) per evaluated round and at the final round, in percent."""
    reported = metrics.reported()
    column, final_key, scale = reported.column, metrics.reported_key(), reported.scale
    out: dict[tuple[str, str], list[SeedRun]] = {}
    for cfg in params.runs([suite]):
        record = read_metrics(cfg, root)
        history = read_history(cfg, root)
        rows = [(row["round"], scale.shown(float(row[column]))) for row in history if column in row]
        diverged = record.get("status") == "diverged"
        final = None if diverged or record.get(final_key) is None else scale.shown(float(record[final_key]))
        out.setdefault((cfg.dataset, cfg.partition), []).append(
            SeedRun(cfg.method, cfg.seed, diverged, final, pd.DataFrame(rows, columns=["round", "acc"])))
    return out


def clipped_band(mean, std, low: float = 0.0, high: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """mean ± std, clipped to [low, high]; a missing std (one seed) gives a band of width 0."""
    mean = np.asarray(mean, dtype=float)
    std = np.nan_to_num(np.asarray(std, dtype=float), nan=0.0)
    return np.clip(mean - std, low, high), np.clip(mean + std, low, high)


def curve_stats(runs: list[SeedRun]) -> pd.DataFrame:
    """Per evaluated round: mean, sample std, n and the clipped band over the seeds that finished."""
    frames = [r.curve.assign(seed=r.seed) for r in runs if not r.diverged and len(r.curve)]
    if not frames:
        return pd.DataFrame(columns=["mean", "std", "n", "lo", "hi"], index=pd.Index([], name="round"))
    stats = pd.concat(frames).groupby("round")["acc"].agg(["mean", "std", "count"]).rename(columns={"count": "n"})
    stats["lo"], stats["hi"] = clipped_band(stats["mean"], stats["std"])
    return stats


@dataclass
class FinalStats:
    method: str
    family: str
    seeds: list[float]           # final accuracy (%) of each seed that finished
    diverged: int

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.seeds) if self.seeds else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.seeds) if self.n >= 2 else None

    def label(self) -> str:
        if not self.seeds:
            return f"{self.method} (diverged: {self.diverged}/{self.diverged} seeds)"
        note = f", {self.diverged} diverged" if self.diverged else ""
        spread = f" ± {self.std:.1f}" if self.std is not None else ""
        return f"{self.method}  {self.mean:.1f}{spread} (n={self.n}{note})"


def final_stats(params: Params, runs: list[SeedRun]) -> list[FinalStats]:
    """One entry per method, sorted by mean final accuracy (best first); fully diverged ones last."""
    methods = list(dict.fromkeys(r.method for r in runs))
    out = [FinalStats(m, method_family(params, m),
                      [r.final_acc for r in runs if r.method == m and not r.diverged and r.final_acc is not None],
                      sum(r.diverged for r in runs if r.method == m))
           for m in methods]
    return sorted(out, key=lambda s: (s.mean is None, -(s.mean or 0.0)))  # stable: ties keep suite order


def paper_values(suite: str) -> dict[tuple[str, str, str], list[PaperMark]]:
    """(dataset, partition, method) -> the paper values printed for that run of `suite`.

    Only the main protocol of each layout, only cells reporting final accuracy (a cell read
    at an earlier `round`, or a loss, is left out), only printed numbers (not '-' or 'lost').
    A run that several tables print gets each distinct value once.
    """
    from fedskew.reproduce.layouts import load_layouts

    out: dict[tuple[str, str, str], list[PaperMark]] = {}
    for table_id, layout in sorted(load_layouts().items()):
        if layout.metric != metrics.reported_key():
            continue
        for row in layout.table.rows:
            for column in layout.table.columns:
                spec = layout.cell(row, column)
                paper = layout.table.cells.get((row, column))
                if (spec.not_run or spec.suite != suite or spec.round is not None or paper is None
                        or paper.value is None):
                    continue
                marks = out.setdefault((spec.dataset, spec.partition, spec.method), [])
                if all(m.value != paper.value for m in marks):
                    marks.append(PaperMark(table_id, row, column, float(paper.value), paper.pm))
    return out


# ---------------------------------------------------------------------------------------------
# Drawing


def _method_colours(count: int) -> list:
    plt = pyplot()
    tab10 = list(plt.get_cmap("tab10").colors)
    palette = tab10[:7] + tab10[8:] + [(0.0, 0.0, 0.0)]  # grey is the reference's: black instead
    if count > len(palette):
        palette = list(plt.get_cmap("tab20").colors)
    return [palette[i % len(palette)] for i in range(count)]


def _curve_label(method: str, runs: list[SeedRun], stats: pd.DataFrame) -> str:
    diverged = sum(r.method == method and r.diverged for r in runs)
    n = int(stats["n"].max()) if len(stats) else 0
    if n == 0:
        return f"{method} (no curve: {diverged} diverged)" if diverged else f"{method} (no evaluated round)"
    return f"{method} (n={n}" + (f", {diverged} diverged)" if diverged else ")")


def _draw_curve(ax, stats: pd.DataFrame, colour, band_alpha: float, label: str, **style) -> None:
    """One method's mean curve and its clipped band (a method with no evaluated round: a legend entry only)."""
    x, mean, lo, hi = (np.asarray(v, dtype=float) for v in (stats.index, stats["mean"], stats["lo"], stats["hi"]))
    ax.plot(x, mean, color=colour, label=label, **style)
    if len(x):
        ax.fill_between(x, lo, hi, color=colour, alpha=band_alpha, linewidth=0)


def _curve_panel(ax, title: str | None, members: list[str], reference: str | None,
                 by_method: dict[str, list[SeedRun]], stats: dict[str, pd.DataFrame]) -> None:
    """One panel: the reference method's dashed curve, then each member's."""
    if reference is not None:
        style = {k: v for k, v in REFERENCE_STYLE.items() if k != "color"}
        _draw_curve(ax, stats[reference], REFERENCE_STYLE["color"], 0.12, zorder=3, gid="reference", **style,
                    label=f"FedAvg reference: {_curve_label(reference, by_method[reference], stats[reference])}")
    for colour, method in zip(_method_colours(len(members)), members):
        _draw_curve(ax, stats[method], colour, 0.15, _curve_label(method, by_method[method], stats[method]),
                    linestyle="-", linewidth=1.4)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def _curve_axes(axes, panel_count: int, bands: list[pd.DataFrame]) -> None:
    """The axes every panel shares: empty slots hidden, the y range fitted to the bands, rounds and labels."""
    from matplotlib.ticker import MaxNLocator

    nrows, ncols = axes.shape
    for i in range(panel_count, nrows * ncols):  # an empty slot: the panel above it shows the rounds
        row, col = divmod(i, ncols)
        axes[row, col].set_visible(False)
        if row:
            axes[row - 1, col].xaxis.set_tick_params(labelbottom=True)
            axes[row - 1, col].set_xlabel("round")
    drawn = [band for band in bands if len(band)]
    if drawn:
        pad = 3.0
        low, high = min(band["lo"].min() for band in drawn), max(band["hi"].max() for band in drawn)
        axes.flat[0].set_ylim(max(0.0, low - pad), min(100.0, high + pad))
    else:
        axes.flat[0].set_ylim(0.0, 100.0)
        axes.flat[0].text(0.5, 0.5, "no evaluated round: every run diverged before its first evaluation",
                          ha="center", va="center", transform=axes.flat[0].transAxes)
    for ax in axes[-1, :]:
        ax.set_xlabel("round")
    axes.flat[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole (shared by every panel)
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy (%)")


def accuracy_curve_figure(params: Params, suite: str, dataset: str, partition: str, runs: list[SeedRun]):
    """The accuracy-curve figure of one setting (a matplotlib Figure; the caller saves and closes it)."""
    plt = pyplot()
    methods = list(dict.fromkeys(r.method for r in runs))
    reference = reference_method(params, methods)
    groups = panels(params, methods)
    by_method = {m: [r for r in runs if r.method == m] for m in methods}
    stats = {m: curve_stats(by_method[m]) for m in methods}
    ncols = 1 if len(groups) == 1 else 2
    nrows = math.ceil(len(groups) / ncols)
    height = max(3.6, 0.24 * max(len(g) for _, g in groups) + 1.2)
    fig, axes = plt.subplots(nrows, ncols, figsize=(8.6 * ncols, height * nrows), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (title, members) in zip(axes.flat, groups):
        _curve_panel(ax, title, members, reference, by_method, stats)
    _curve_axes(axes, len(groups), [stats[m] for _, members in groups
                                    for m in [*members, *([reference] if reference else [])]])
    seeds = params.raw["suites"][suite]["seeds"]
    fig.suptitle(f"{suite}: {dataset} / {partition}: test accuracy per evaluated round, mean ± std over seeds "
                 f"{seeds} (band clipped to [0, 100])", fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def final_accuracy_figure(params: Params, suite: str, dataset: str, partition: str, runs: list[SeedRun],
                          paper: dict[tuple[str, str, str], list[PaperMark]] | None = None):
    """The final-accuracy dot plot of one setting (a matplotlib Figure)."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    entries = final_stats(params, runs)
    paper = paper or {}
    n = len(entries)
    fig, ax = plt.subplots(figsize=(8.6, max(2.6, 0.3 * n + 1.6)))
    ys = np.arange(n)[::-1]   # best on top
    values = []
    for y, entry in zip(ys, entries):
        colour = FAMILY_COLOURS.get(entry.family, FAMILY_COLOURS[OTHER])
        if entry.mean is not None:
            lo, hi = clipped_band(entry.mean, entry.std if entry.std is not None else 0.0)
            ax.errorbar([entry.mean], [y], xerr=[[entry.mean - lo], [hi - entry.mean]], fmt="o", color=colour,
                        markersize=6, capsize=3, elinewidth=1.4, zorder=3)
            ax.scatter(entry.seeds, [y] * entry.n, s=10, color=colour, alpha=0.45, zorder=2, linewidths=0)
            values += [float(lo), float(hi), *entry.seeds]
        else:
            ax.text(0.01, y, "diverged on every seed", transform=ax.get_yaxis_transform(), va="center",
                    fontsize=8, color="tab:red")
        for mark in paper.get((dataset, partition, entry.method), []):
            ax.scatter([mark.value], [y], marker="D", s=46, facecolors="none", edgecolors="black",
                       linewidths=1.2, zorder=4, gid=f"paper:{entry.method}")
            values.append(mark.value)
    reference = next((e for e in entries if e.method == reference_method(params, [e.method for e in entries])),
                     None)
    if reference is not None and reference.mean is not None:
        ax.axvline(reference.mean, **{**REFERENCE_STYLE, "linewidth": 1.2}, zorder=1, gid="reference")
    ax.set_yticks(ys, [e.label() for e in entries], fontsize=8)
    ax.set_ylim(-0.7, n - 0.3)
    if values:
        pad = max(2.0, 0.05 * (max(values) - min(values)))
        ax.set_xlim(max(0.0, min(values) - pad), min(100.0, max(values) + pad))
    else:
        ax.set_xlim(0.0, 100.0)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("final-round test accuracy (%): mean ± sample std over seeds; dots: seeds")
    families = {e.family for e in entries if e.mean is not None}
    handles = [Line2D([], [], marker="o", linestyle="", color=FAMILY_COLOURS.get(f, FAMILY_COLOURS[OTHER]), label=f)
               for f in FAMILIES if f in families]
    if any(paper.get((dataset, partition, e.method)) for e in entries):
        handles.append(Line2D([], [], marker="D", linestyle="", markerfacecolor="none", markeredgecolor="black",
                              label="paper (main protocol)"))
    if reference is not None and reference.mean is not None:
        handles.append(Line2D([], [], **{**REFERENCE_STYLE, "linewidth": 1.2}, label="FedAvg mean"))
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              frameon=False)
    seeds = params.raw["suites"][suite]["seeds"]
    ax.set_title(f"{suite}: {dataset} / {partition}: final-round test accuracy, seeds {seeds} "
                 "(best round never reported)", fontsize=10, loc="left")
    fig.tight_layout()
    return fig


def write_figures(params: Params, suite: str, root: Path = Path(".")) -> list[Path]:
    """Both figures of every setting of the suite: <dataset>_<partition>.png and ..._final.png."""
    out_dir = root / paths.FIGURE_DIR.format(suite=suite)
    out_dir.mkdir(parents=True, exist_ok=True)
    paper = paper_values(suite)
    written = []
    for (dataset, partition), runs in load_runs(params, suite, root).items():
        stem = out_dir / f"{dataset}_{partition}"
        written.append(save_figure(accuracy_curve_figure(params, suite, dataset, partition, runs),
                             stem.with_name(stem.name + ".png")))
        written.append(save_figure(final_accuracy_figure(params, suite, dataset, partition, runs, paper),
                             stem.with_name(stem.name + "_final.png")))
    return written
