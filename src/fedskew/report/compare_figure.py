"""The comparison's figure: each method's paired effect against the baseline, with its interval, per setting.

One panel per setting of the suite (dataset / partition), one row per method: the mean paired per-seed
difference (a dot) and its 95 % t-interval (a bar), a vertical line at the threshold `beats` must clear. A dot
is filled where the comparison holds ("beats"), hollow where it is inconclusive, and a cross where it does not
hold; a method that diverged on a seed is named in its row label. Written beside the comparison's tables as
`results/tables/compare/<suite>.png`.
"""

from __future__ import annotations

from pathlib import Path

from fedskew import metrics, paths
from fedskew.report.drawing import pyplot, save_figure
from fedskew.reproduce.policy import load_policy

# The comparisons drawn are fedskew.report.compare's `Comparison`s; that module writes this figure, so this one
# does not import it.

# A dot's style by the verdict of "beats" (fedskew.report.compare.VERDICTS' words)
STYLES = {"holds": dict(marker="o", facecolor="tab:blue"), "inconclusive": dict(marker="o", facecolor="white"),
          "does not hold": dict(marker="X", facecolor="tab:red")}


def _settings(comparisons: list) -> dict[tuple[str, str], list]:
    panels: dict[tuple[str, str], list] = {}
    for c in comparisons:
        panels.setdefault((c.dataset, c.partition), []).append(c)
    return panels


def _row_label(c) -> str:
    label = f"{c.method} (n={len(c.seeds)})"
    return label + "".join(f", {name} diverged on {list(seeds)}" for name, seeds in c.diverged.items())


def _panel(ax, title: str, rows: list) -> None:
    for y, c in enumerate(reversed(rows)):
        if c.effect is None:
            ax.annotate("no paired seed", (0, y), fontsize=8, va="center")
            continue
        style = STYLES[c.verdicts["beats"]]
        if c.effect.has_interval:
            ax.plot([c.effect.low, c.effect.high], [y, y], color="tab:blue", linewidth=2, solid_capstyle="butt")
        ax.scatter([c.effect.mean], [y], s=40, zorder=3, edgecolors="tab:blue", marker=style["marker"],
                   facecolors=style["facecolor"])
    ax.axvline(rows[0].threshold, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(rows)), [_row_label(c) for c in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def comparison_figure(comparisons: list):
    """The figure of one suite's comparisons (a matplotlib Figure; the caller saves and closes it)."""
    plt = pyplot()
    panels = _settings(comparisons)
    rows = max(len(p) for p in panels.values())
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, sharex=True,
                             figsize=(7.5, 0.9 + len(panels) * (0.55 + 0.28 * rows)))
    for ax, ((dataset, partition), members) in zip(axes[:, 0], panels.items()):
        _panel(ax, f"{dataset} / {partition}", members)
    first, metric = comparisons[0], metrics.reported()
    level = round(100 * load_policy().level)
    axes[-1, 0].set_xlabel(f"{metric.label} at the final round, method − {first.baseline} on the same seed "
                           f"({metric.scale.unit or 'shown units'}); bar: {level} % t-interval", fontsize=8)
    fig.suptitle(f"{first.suite}: each method against {first.baseline}, paired by seed (filled: beats; hollow: "
                 "inconclusive; cross: does not beat)", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def write_comparison_figure(comparisons: list, root: Path = Path(".")) -> Path:
    """results/tables/compare/<suite>.png, written atomically."""
    path = root / paths.COMPARISON.format(suite=comparisons[0].suite, ext="png")
    return save_figure(comparison_figure(comparisons), path)

