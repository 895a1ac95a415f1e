"""Tables per suite, built from the run files alone (no tracker needed).

Rows are methods, columns are settings (dataset / partition), cells are the
final-round test accuracy in % (the reported metric of fedskew.metrics), mean ± sample
standard deviation over seeds, with the seed count. Under it, the same grid gives each
method's traffic over the whole run (MB up / down: weights, activations, labels, gradients,
statistics — whatever the method sends), so that FL and split-FL methods can be read side by
side. The CSV has every summary value the registry puts in suite tables (balanced accuracy,
the best-round accuracy, labelled as such: best-round figures are never the reported number). Last come the
per-client outcomes of the final round (fedskew.client_outcomes: the mean over the clients, the worst 10 % and
the spread of the accuracy each client would see), in a grid of their own and in the CSV's and JSON's last
columns; they read each run's partition summary beside its run files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from fedskew import client_outcomes, metrics, paths
from fedskew.config import Params
from fedskew.metrics import Scale, Statistic
from fedskew.runfiles import atomic_write_text, read_metrics


def collect(params: Params, suite: str, root: Path = Path(".")) -> pd.DataFrame:
    """One row per run of the suite, read from results/runs/.../metrics.json (verified), with its final round's
    per-client outcomes (fedskew.client_outcomes: from history.csv and the partition's summary)."""
    runs = params.runs([suite])
    records = [read_metrics(cfg, root) for cfg in runs]   # an untrained, damaged or impossible run is named first
    client_outcomes.require_partitions(runs, root)
    return pd.DataFrame([{"status": "finished", **cfg.keys, **record, **client_outcomes.final_values(cfg, root)}
                         for cfg, record in zip(runs, records)])


def table_values() -> list[str]:
    """The summary values (metrics.json keys) that suite tables average over seeds, in their CSV's order."""
    return [m.key(s) for s in Statistic for m in metrics.summarised(s) if m.suite_table]


def client_values() -> list[str]:
    """The per-client outcomes that suite tables average over seeds, after the table values: `final_clients_*`."""
    return client_outcomes.summary_keys()


def _traffic() -> list[metrics.Metric]:
    """The run totals in bytes that the traffic grid shows (up, then down)."""
    return [m for m in metrics.summarised(Statistic.TOTAL) if m.suite_table and m.scale is Scale.BYTES]


def statistics_over_seeds(runs: pd.DataFrame) -> pd.DataFrame:
    """Per grid point, mean and sample std (ddof=1) of each table value over the seeds that finished;
    diverged seeds are counted apart. The per-client outcomes follow the counts, NaN where a finished seed has
    none (a run trained before per-class accuracies were recorded): a mean over fewer seeds is not shown."""
    values = table_values() + client_values()
    # A value no run of the suite recorded (a metric registered after they trained) is NaN, not an error.
    runs = runs.assign(diverged=runs["status"] == "diverged", **{key: math.nan for key in values if key not in runs})
    runs[values] = runs[values].astype(float)  # a diverged run has no accuracy (NaN)
    # nor a whole run's traffic: it stopped early, and its bytes would make the method look cheaper
    runs.loc[runs["diverged"], values] = math.nan
    grouped = runs.groupby(["dataset", "partition", "method"], sort=False)
    out = grouped[values].agg(["mean", "std"])
    out.columns = [f"{metric}_{stat}" for metric, stat in out.columns]
    out["seeds"] = grouped["seed"].count() - grouped["diverged"].sum()
    out["diverged"] = grouped["diverged"].sum()
    _require_every_seeds_number(out, grouped[metrics.reported_key()].count())
    measured = grouped[client_values()].count()
    for key in client_values():
        short = measured[key] < out["seeds"]
        out.loc[short, [f"{key}_mean", f"{key}_std"]] = math.nan
    # the per-client outcomes last, so that every column before them stays where it was
    last = [f"{key}_{stat}" for key in client_values() for stat in ("mean", "std")]
    return out[[c for c in out.columns if c not in last] + last].reset_index()


def _require_every_seeds_number(out: pd.DataFrame, numbers: pd.Series) -> None:
    """A cell's n is the seeds that finished: each must have given the reported number (fedskew.runfiles refuses a
    run file without it), else the cell would show the mean of fewer seeds under a larger n. A ValueError naming
    the grid points otherwise."""
    short = numbers != out["seeds"]
    if short.any():
        key = metrics.reported_key()
        raise ValueError("; ".join(f"{' / '.join(point)}: {int(out.loc[point, 'seeds'])} seeds finished, "
                                   f"{int(numbers[point])} with a {key}" for point in out.index[short])
                         + ": a cell's n would not count the numbers it averages")


def _cell(mean: float, std: float, n: int, diverged: int = 0) -> str:
    if n == 0:
        return f"diverged ({diverged}/{diverged} seeds)"
    scale = metrics.reported().scale
    spread = "n/a" if n < 2 or math.isnan(std) else f"{scale.shown(std):.2f}"
    note = f"; {diverged} diverged" if diverged else ""
    return f"{scale.shown(mean):.2f} ± {spread} (n={n}{note})"


def _traffic_cell(totals: list[float]) -> str:
    """Each traffic total's seed mean in MB, "up / down"; n/a where every seed diverged."""
    return "n/a" if any(math.isnan(v) for v in totals) else " / ".join(f"{Scale.BYTES.shown(v):.2f}" for v in totals)


def _clients_cell(row: dict) -> str:
    """The final round's per-client outcomes in %, "mean / worst 10 % / spread", each mean ± std over the seeds;
    n/a where no seed has them (every seed diverged, or a seed without per-class accuracies)."""
    if math.isnan(row[f"{client_values()[0]}_mean"]):
        return "n/a"
    shown = Scale.FRACTION.shown
    parts = []
    for key in client_values():
        mean, std = row[f"{key}_mean"], row[f"{key}_std"]
        parts.append(f"{shown(mean):.2f} ± " + ("n/a" if math.isnan(std) else f"{shown(std):.2f}"))
    return " / ".join(parts)


def _cells(summary: pd.DataFrame, traffic: bool, clients: bool) -> list[str]:
    if traffic:
        columns = [summary[f"{m.key(Statistic.TOTAL)}_mean"] for m in _traffic()]
        return [_traffic_cell(list(totals)) for totals in zip(*columns)]
    if clients:
        return [_clients_cell(row) for row in summary.to_dict("records")]
    key = metrics.reported_key()
    return [_cell(m, s, n, d) for m, s, n, d in
            zip(summary[f"{key}_mean"], summary[f"{key}_std"], summary["seeds"], summary["diverged"])]


def wide_table(summary: pd.DataFrame, traffic: bool = False, clients: bool = False) -> pd.DataFrame:
    """Methods x settings: cells of the reported metric, or (traffic=True) MB up / down over the run, or
    (clients=True) the final round's per-client mean / worst 10 % / spread."""
    summary = summary.assign(setting=summary["dataset"] + " / " + summary["partition"])
    summary["cell"] = _cells(summary, traffic, clients)
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
        lines.append(f"{dataset} ({json.dumps(params.dataset_spec(dataset), sort_keys=True, allow_nan=False)}): "
                     + ", ".join(f"{k}={v}" for k, v in training.items()))
        for partition in setting["partitions"]:
            lines.append(f"partition {partition}: "
                         f"{json.dumps(params.partition_spec(partition), sort_keys=True, allow_nan=False)}")
    for method in body["methods"]:
        lines.append(f"method {method}: {json.dumps(params.method_spec(method), sort_keys=True, allow_nan=False)}")
    return lines


def _markdown_grid(table: pd.DataFrame) -> str:
    header = "| method | " + " | ".join(table.columns) + " |"
    rule = "|---" * (len(table.columns) + 1) + "|"
    rows = [f"| {method} | " + " | ".join(row) + " |" for method, row in zip(table.index, table.values)]
    return "\n".join([header, rule, *rows])


CLIENTS_CAPTION = ("Per-client test accuracy at the final round (%): the accuracy each client would see, the "
                   "classes weighed by its training label proportions; mean over the clients / mean of the worst "
                   "10 % of them (⌈K/10⌉ clients) / spread (std over the clients); each mean ± std over the seeds "
                   "that finished (docs/results.md, \"Per-client outcomes\")")


def _markdown(table: pd.DataFrame, traffic: pd.DataFrame, clients: pd.DataFrame, suite: str,
              protocol: list[str]) -> str:
    notes = "\n".join(f"- {line}" for line in protocol)
    return (f"# Suite `{suite}`\n\n{_markdown_grid(table)}\n\n"
            "Traffic over the whole run, MB sent up / down (mean over the seeds; every byte a method "
            f"sends: weights, activations, labels, gradients, statistics):\n\n{_markdown_grid(traffic)}\n\n"
            f"{CLIENTS_CAPTION}:\n\n{_markdown_grid(clients)}\n\n"
            f"Protocol:\n\n{notes}\n")


def _latex_tabular(table: pd.DataFrame, comment: str) -> list[str]:
    def esc(text: str) -> str:
        return text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$")

    spec = "l" + "c" * len(table.columns)
    lines = [f"% {comment}", f"\\begin{{tabular}}{{{spec}}}", r"\toprule",
             "method & " + " & ".join(esc(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [esc(method) + " & " + " & ".join(esc(c) for c in row) + r" \\"
              for method, row in zip(table.index, table.values)]
    return lines + [r"\bottomrule", r"\end{tabular}"]


def _latex(table: pd.DataFrame, clients: pd.DataFrame, suite: str) -> str:
    """The accuracy grid, then, after a blank line, the per-client outcomes' grid."""
    lines = _latex_tabular(table, f"fedskew suite {suite}: final-round test accuracy (%), mean $\\pm$ std over seeds")
    lines += ["", *_latex_tabular(clients, f"fedskew suite {suite}: per-client test accuracy at the final round (%), "
                                           "mean / worst 10 % / spread over the clients, each mean $\\pm$ std over "
                                           "seeds"), ""]
    return "\n".join(lines)


def _csv(summary: pd.DataFrame) -> str:
    """The CSV: every table value's mean and std; a best-round value's columns say it is not the reported one."""
    labelled = {f"{m.key(Statistic.BEST)}_{stat}": f"best_round_{m.name}_{stat} (not reported)"
                for m in metrics.summarised(Statistic.BEST) for stat in ("mean", "std")}
    return summary.rename(columns=labelled).to_csv(index=False, float_format="%.6f")


def _flat(summary: pd.DataFrame) -> dict[str, dict]:
    """A flat metrics file for `dvc metrics show`: per grid point, the reported metric's mean and std, the seed
    counts, the seed mean of each metric with a `flat_key` (in the unit shown), then the per-client outcomes'
    mean and std (fractions, as the reported metric's)."""
    def number(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 6)

    reported = metrics.reported_key()
    flat_means = [(m, m.key(m.statistics[0])) for m in metrics.METRICS if m.flat_key and m.suite_table]
    return {f"{r.dataset}/{r.partition}/{r.method}": {
                f"{reported}_mean": number(getattr(r, f"{reported}_mean")),
                f"{reported}_std": number(getattr(r, f"{reported}_std")),
                "seeds": int(r.seeds), "diverged": int(r.diverged),
                **{m.flat_key: number(m.scale.shown(getattr(r, f"{key}_mean"))) for m, key in flat_means},
                **{f"{key}_{stat}": number(getattr(r, f"{key}_{stat}")) for key in client_values()
                   for stat in ("mean", "std")}}
            for r in summary.itertuples()}


RUN_INDEX_COLUMNS = ("suite", "dataset", "partition", "method", "seed", "run_id")


def run_index(params: Params, suite: str) -> str:
    """A suite's run index as CSV: the run id of every run its tables read, by grid point, in the suite's order."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RUN_INDEX_COLUMNS)
    for cfg in params.suite_runs(suite):
        writer.writerow([cfg.suite, cfg.dataset, cfg.partition, cfg.method, cfg.seed, cfg.run_id])
    return out.getvalue()


def write_tables(params: Params, suite: str, root: Path = Path(".")) -> dict[str, Path]:
    """The suite's tables (md, csv, tex, json) and its run index (which run each cell reads), written atomically."""
    summary = statistics_over_seeds(collect(params, suite, root))
    table = wide_table(summary)
    out = {ext: root / paths.TABLE.format(suite=suite, ext=ext) for ext in ("md", "csv", "tex", "json")}
    protocol = protocol_lines(params, suite)
    clients = wide_table(summary, clients=True)
    atomic_write_text(out["md"], _markdown(table, wide_table(summary, traffic=True), clients, suite, protocol))
    atomic_write_text(out["tex"], _latex(table, clients, suite))
    atomic_write_text(out["csv"], _csv(summary))
    atomic_write_text(out["json"], json.dumps(_flat(summary), indent=2, allow_nan=False) + "\n")
    out["runs"] = root / paths.RUN_INDEX.format(suite=suite)
    out["runs"].parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out["runs"], run_index(params, suite))
    return out
