"""The local-drift figure: per-class accuracy before and after local training, by kind of class.

Drawn for the settings whose runs recorded training.local_diagnostics (see
fedskew.engine.diagnostics). One panel per kind of class (the client's majority, minority
and missing classes); in each, one line per method from the accuracy of the global model
the clients start from (hollow) to that of their models after local training (filled),
at the last evaluated round, mean over seeds. A long leftward line is a model forgetting
what its client does not hold: the effect FedLC Fig. 2 and FedED Fig. 1 show.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedskew import paths
from fedskew.config import Params
from fedskew.engine.diagnostics import GROUPS
from fedskew.runfiles import read_history, read_metrics


def local_drift_frame(params: Params, suite: str, root: Path = Path(".")) -> pd.DataFrame:
    """One row per (run, group) at the run's last round with diagnostics: before and after, in %."""
    rows = []
    for cfg in params.suite_runs(suite):
        if not cfg.train.local_diagnostics:
            continue
        read_metrics(cfg, root)  # verifies the history too
        diagnosed = [row for row in read_history(cfg, root) if any(k.startswith("local_after_") for k in row)]
        if not diagnosed:  # diverged before its first evaluation
            continue
        last = diagnosed[-1]
        for group in GROUPS:
            if f"local_after_{group}" in last:
                rows.append({**cfg.keys, "round": last["round"], "group": group,
                             "before": 100 * last[f"local_before_{group}"],
                             "after": 100 * last[f"local_after_{group}"]})
    return pd.DataFrame(rows)


def local_drift_figures(params: Params, suite: str, root: Path = Path(".")) -> list[Path]:
    """results/figures/<suite>/<dataset>_<partition>_local.png for each diagnosed setting."""
    frame = local_drift_frame(params, suite, root)
    if frame.empty:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = root / paths.FIGURE_DIR.format(suite=suite)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (dataset, partition), setting in frame.groupby(["dataset", "partition"], sort=False):
        means = setting.groupby(["method", "group"], sort=False)[["before", "after"]].mean().reset_index()
        seeds = setting.groupby("method", sort=False)["seed"].nunique()
        methods = list(dict.fromkeys(setting["method"]))
        groups = [g for g in GROUPS if g in set(setting["group"])]
        fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 1.5 + 0.38 * len(methods)),
                                 sharey=True, squeeze=False)
        for ax, group in zip(axes[0], groups):
            for i, method in enumerate(methods):
                cell = means[(means["method"] == method) & (means["group"] == group)]
                if cell.empty:
                    continue
                before, after = float(cell["before"].iloc[0]), float(cell["after"].iloc[0])
                ax.plot([before, after], [i, i], color="0.6", linewidth=1.5, zorder=1)
                ax.scatter([before], [i], facecolors="white", edgecolors="C0", zorder=2,
                           label="global model (before)" if i == 0 else None)
                ax.scatter([after], [i], color="C3", zorder=3, label="after local training" if i == 0 else None)
            ax.set_xlim(0, 100)
            ax.set_title(f"{group} classes")
            ax.set_xlabel("test accuracy on those classes (%)")
            ax.grid(axis="x", alpha=0.3)
        axes[0][0].set_yticks(range(len(methods)), [f"{m} (n={seeds[m]})" for m in methods])
        axes[0][0].invert_yaxis()
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize="small", frameon=False)
        rounds = sorted(set(setting["round"]))
        fig.suptitle(f"{dataset} / {partition}: local models before → after local training "
                     f"(round {', '.join(map(str, rounds))}, mean over seeds and participants)", fontsize="medium")
        fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend below the panels
        path = out_dir / f"{dataset}_{partition}_local.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
