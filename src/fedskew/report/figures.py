"""Accuracy curves per setting: mean over seeds with a ± std band, one line per method."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fedskew import paths
from fedskew.config import Params
from fedskew.runfiles import read_metrics


def accuracy_curves(params: Params, suite: str, root: Path = Path(".")) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = []
    for cfg in params.runs([suite]):
        read_metrics(cfg, root)  # refuses a history.csv that its metrics.json does not vouch for
        history = pd.read_csv(root / cfg.path(paths.RUN_HISTORY))
        if "test_acc" not in history:  # diverged before its first evaluation
            continue
        history = history.dropna(subset=["test_acc"])
        frames.append(history[["round", "test_acc"]].assign(**cfg.keys))
    out_dir = root / paths.FIGURE_DIR.format(suite=suite)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not frames:  # every run diverged before its first evaluation: nothing to draw
        return []
    runs = pd.concat(frames)
    written = []
    for (dataset, partition), setting in runs.groupby(["dataset", "partition"], sort=False):
        methods = list(dict.fromkeys(setting["method"]))
        # Up to 20 distinct colours, then the same colours dashed: 25 methods stay tellable apart.
        colours = plt.get_cmap("tab20").colors
        fig, ax = plt.subplots(figsize=(6, max(3.5, 0.25 * len(methods))))
        for i, method in enumerate(methods):
            curves = setting[setting["method"] == method]
            stats = curves.groupby("round")["test_acc"].agg(["mean", "std", "count"]).fillna(0.0)
            colour, style = colours[i % len(colours)], "-" if i < len(colours) else "--"
            ax.plot(stats.index, 100 * stats["mean"], style, color=colour,
                    label=f"{method} (n={int(stats['count'].max())})")
            ax.fill_between(stats.index, 100 * (stats["mean"] - stats["std"]),
                            100 * (stats["mean"] + stats["std"]), color=colour, alpha=0.12)
        ax.set(xlabel="round", ylabel="test accuracy (%)", title=f"{suite}: {dataset} / {partition}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        path = out_dir / f"{dataset}_{partition}.png"
        tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, path)
        written.append(path)
    return written
