"""Tables per suite, built from the run files alone (no tracker needed).

Rows are methods, columns are settings (dataset / partition), cells are the
final-round test accuracy in %, mean ± sample standard deviation over seeds, with
the seed count. Under it, the same grid gives each method's traffic over the whole run
(MB up / down: weights, activations, labels, gradients, statistics — whatever the
method sends), so that FL and split-FL methods can be read side by side. The CSV adds
balanced accuracy and the best-round accuracy, labelled as such: best-round figures
are never the reported number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from fedskew import paths
from fedskew.config import Params
from fedskew.runfiles import atomic_write_text, read_metrics

REPORTED = "final_acc"


def collect(params: Params, suite: str, root: Path = Path(".")) -> pd.DataFrame:
    """One row per run of the suite, read from results/runs/.../metrics.json (verified)."""
    rows = []
    for cfg in params.runs([suite]):
        rows.append({"status": "finished", **cfg.keys, **read_metrics(cfg, root)})
    return pd.DataFrame(rows)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std (ddof=1) over the seeds that finished; diverged seeds are counted apart."""
    metrics = ["final_acc", "final_balanced_acc", "best_acc", "total_bytes_up", "total_bytes_down"]
    runs = runs.assign(diverged=runs["status"] == "diverged")
    runs[metrics] = runs[metrics].astype(float)  # a diverged run has no accuracy (NaN)
    # nor a whole run's traffic: it stopped early, and its bytes would make the method look cheaper
    runs.loc[runs["diverged"], metrics] = math.nan
    grouped = runs.groupby(["dataset", "partition", "method"], sort=False)
    out = grouped[metrics].agg(["mean", "std"])
    out.columns = [f"{metric}_{stat}" for metric, stat in out.columns]
    out["seeds"] = grouped["seed"].count() - grouped["diverged"].sum()
    out["diverged"] = grouped["diverged"].sum()
    return out.reset_index()


def _cell(mean: float, std: float, n: int, diverged: int = 0) -> str:
    if n == 0:
        return f"diverged ({diverged}/{diverged} seeds)"
    spread = "n/a" if n < 2 or math.isnan(std) else f"{100 * std:.2f}"
    note = f"; {diverged} diverged" if diverged else ""
    return f"{100 * mean:.2f} ± {spread} (n={n}{note})"


def _traffic_cell(up: float, down: float) -> str:
    return "n/a" if math.isnan(up) else f"{up / 1e6:.2f} / {down / 1e6:.2f}"


def wide_table(summary: pd.DataFrame, traffic: bool = False) -> pd.DataFrame:
    """Methods x settings: accuracy cells, or (traffic=True) MB up / down over the run."""
    summary = summary.assign(setting=summary["dataset"] + " / " + summary["partition"])
    if traffic:
        summary["cell"] = [_traffic_cell(u, d) for u, d in
                           zip(summary["total_bytes_up_mean"], summary["total_bytes_down_mean"])]
    else:
        summary["cell"] = [_cell(m, s, n, d) for m, s, n, d in
                           zip(summary[f"{REPORTED}_mean"], summary[f"{REPORTED}_std"], summary["seeds"],
                               summary["diverged"])]
    table = summary.pivot(index="method", columns="setting", values="cell")
    methods = list(dict.fromkeys(summary["method"]))
    settings = list(dict.fromkeys(summary["setting"]))
    return table.loc[methods, settings]


def protocol_lines(params: Params, suite: str) -> list[str]:
    """The protocol behind the numbers, printed under every table."""
    body = params.raw["suites"][suite]
    lines = [
        "Cells: final-round test accuracy (%), mean ± sample std over seeds "
        f"{body['seeds']} (n = seeds that finished; a run whose loss or model became NaN/Inf is "
        "counted as diverged, not averaged); best-round accuracy is in the CSV only, labelled.",
    ]
    for setting in body["settings"]:
        dataset = setting["dataset"]
        training = params.training(suite, dataset)
        lines.append(f"{dataset} ({json.dumps(params.dataset_spec(dataset), sort_keys=True)}): "
                     + ", ".join(f"{k}={v}" for k, v in training.items()))
        for partition in setting["partitions"]:
            lines.append(f"partition {partition}: {json.dumps(params.partition_spec(partition), sort_keys=True)}")
    for method in body["methods"]:
        lines.append(f"method {method}: {json.dumps(params.method_spec(method), sort_keys=True)}")
    return lines


def _markdown_grid(table: pd.DataFrame) -> str:
    header = "| method | " + " | ".join(table.columns) + " |"
    rule = "|---" * (len(table.columns) + 1) + "|"
    rows = [f"| {method} | " + " | ".join(row) + " |" for method, row in zip(table.index, table.values)]
    return "\n".join([header, rule, *rows])


def _markdown(table: pd.DataFrame, traffic: pd.DataFrame, suite: str, protocol: list[str]) -> str:
    notes = "\n".join(f"- {line}" for line in protocol)
    return (f"# Suite `{suite}`\n\n{_markdown_grid(table)}\n\n"
            "Traffic over the whole run, MB sent up / down (mean over the seeds; every byte a method "
            f"sends: weights, activations, labels, gradients, statistics):\n\n{_markdown_grid(traffic)}\n\n"
            f"Protocol:\n\n{notes}\n")


def _latex(table: pd.DataFrame, suite: str) -> str:
    def esc(text: str) -> str:
        return text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$")

    spec = "l" + "c" * len(table.columns)
    lines = [f"% fedskew suite {suite}: final-round test accuracy (%), mean $\\pm$ std over seeds",
             f"\\begin{{tabular}}{{{spec}}}", r"\toprule",
             "method & " + " & ".join(esc(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [esc(method) + " & " + " & ".join(esc(c) for c in row) + r" \\"
              for method, row in zip(table.index, table.values)]
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def write_tables(params: Params, suite: str, root: Path = Path(".")) -> dict[str, Path]:
    runs = collect(params, suite, root)
    summary = summarise(runs)
    table = wide_table(summary)
    out = {ext: root / paths.TABLE.format(suite=suite, ext=ext) for ext in ("md", "csv", "tex", "json")}
    protocol = protocol_lines(params, suite)
    atomic_write_text(out["md"], _markdown(table, wide_table(summary, traffic=True), suite, protocol))
    atomic_write_text(out["tex"], _latex(table, suite))
    csv = summary.rename(columns={"best_acc_mean": "best_round_acc_mean (not reported)",
                                  "best_acc_std": "best_round_acc_std (not reported)"})
    atomic_write_text(out["csv"], csv.to_csv(index=False, float_format="%.6f"))
    # A flat metrics file for `dvc metrics show`.
    def number(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 6)

    flat = {f"{r.dataset}/{r.partition}/{r.method}": {"final_acc_mean": number(r.final_acc_mean),
                                                      "final_acc_std": number(r.final_acc_std),
                                                      "seeds": int(r.seeds), "diverged": int(r.diverged),
                                                      "mb_up_mean": number(r.total_bytes_up_mean / 1e6),
                                                      "mb_down_mean": number(r.total_bytes_down_mean / 1e6)}
            for r in summary.itertuples()}
    atomic_write_text(out["json"], json.dumps(flat, indent=2) + "\n")
    return out
