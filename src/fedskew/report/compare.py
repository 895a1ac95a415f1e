"""`python -m fedskew compare --suite S`: each method against a baseline, paired by seed, with its interval.

Every method of a suite trains, for a given seed, on the same partition, initial model and client-sampling
schedule, so the comparison a reviewer asks for is the paired one: per seed, the method's final reported
metric minus the baseline's, then the mean of those differences with its two-sided t-interval and the
verdicts of the claims ledger's policy (fedskew.reproduce.policy: its level, its interval, its words) for
"beats" (the whole interval above the threshold) and "at least as good" (not below it). Diverged runs are
handled as the ledger handles them: a seed on which the method diverged makes both verdicts fail, and names
the seed; a seed on which the baseline diverged leaves the pairing, and is named too. An inconclusive
comparison states the seeds that would decide it and what they cost (fedskew.reproduce.seeds: an estimate).

The baseline is FedAvg where the suite runs it, else the suite's first method, unless one is named.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path

from fedskew import arguments, client_outcomes, metrics, paths
from fedskew.config import ConfigError, Params
from fedskew.report.compare_figure import write_comparison_figure
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Effect, judge, load_policy, paired_effect
from fedskew.reproduce.seeds import FORMULA, SeedsToDecide, cost_text, seeds_cost, seeds_to_decide
from fedskew.runfiles import atomic_write_text, read_metrics

WORDS = ("beats", "at least as good")  # the policy's words a comparison is judged by
# A comparison's verdicts in its own terms (the ledger's say whether a paper's claim reproduced).
VERDICTS = {REPRODUCED: "holds", NOT_REPRODUCED: "does not hold", INCONCLUSIVE: "inconclusive"}
DEFAULT_BASELINE = "fedavg"
# The largest margin a difference of the reported metric can clear, in points: the span of its range as pages show
# it (100 for an accuracy in %). A negative margin would let `beats` hold for a method that is worse.
MAX_THRESHOLD = metrics.reported().scale.shown(metrics.reported().scale.bounds[1])


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline in one setting of a suite: the paired effect and its verdicts."""

    suite: str
    dataset: str
    partition: str
    method: str
    baseline: str
    seeds: tuple[int, ...]                 # the seeds paired: both runs finished
    differences: tuple[float, ...]         # method − baseline per paired seed, in the metric's shown unit
    effect: Effect | None                  # None: no seed paired
    threshold: float
    verdicts: dict[str, str]               # word -> holds / does not hold / inconclusive
    diverged: dict[str, tuple[int, ...]]   # method or baseline -> the seeds on which it diverged
    clients: dict[str, Effect | None] = dataclasses.field(default_factory=dict)  # per-client outcome -> its
    # paired effect in points over the same seeds (client_outcomes.NAMES: mean, worst 10 %, spread)
    to_decide: SeedsToDecide | None = None  # an inconclusive comparison: the seeds that would decide it
    to_decide_cost: dict | None = None      # ... and what the extra seeds' runs cost (reproduce.seeds)

    @property
    def inconclusive(self) -> bool:
        return VERDICTS[INCONCLUSIVE] in self.verdicts.values()

    def record(self) -> dict:
        """The comparison as `--json` and the suite's comparison file give it."""
        effect = self.effect.record() if self.effect else None
        return {"suite": self.suite, "dataset": self.dataset, "partition": self.partition, "method": self.method,
                "baseline": self.baseline, "seeds": list(self.seeds), "differences": list(self.differences),
                "mean": effect["mean"] if effect else None, "low": effect["low"] if effect else None,
                "high": effect["high"] if effect else None, "threshold": self.threshold,
                "verdicts": self.verdicts, "diverged": {k: list(v) for k, v in self.diverged.items()},
                "clients": {name: e.record() if e else None for name, e in self.clients.items()},
                "seeds_to_decide": None if self.to_decide is None else {**self.to_decide.record(),
                                                                          "cost": self.to_decide_cost}}


def _outcomes(params: Params, suite: str, root: Path) -> dict[tuple[str, str, str], dict[int, float | None]]:
    """(dataset, partition, method) -> seed -> the final reported metric in its shown unit (None: diverged),
    read from the suite's run files (verified)."""
    metric, key = metrics.reported(), metrics.reported_key()
    out: dict[tuple[str, str, str], dict[int, float | None]] = {}
    for cfg in params.suite_runs(suite):
        recorded = read_metrics(cfg, root)
        value = None if recorded.get("status") == "diverged" else metric.scale.shown(recorded[key])
        out.setdefault((cfg.dataset, cfg.partition, cfg.method), {})[cfg.seed] = value
    return out


def _client_outcomes(params: Params, suite: str, root: Path) -> dict[tuple[str, str, str], dict[int, dict]]:
    """(dataset, partition, method) -> seed -> the final round's per-client outcomes in points (absent where
    the run diverged or has none), from the run files and the partitions' label counts."""
    runs = params.suite_runs(suite)
    client_outcomes.require_partitions(runs, root)
    out: dict[tuple[str, str, str], dict[int, dict]] = {}
    for cfg in runs:
        final = client_outcomes.final_outcomes(cfg, root)
        if final is not None:
            shown = {name: 100 * value for name, value in final.values().items()}
            out.setdefault((cfg.dataset, cfg.partition, cfg.method), {})[cfg.seed] = shown
    return out


def default_baseline(methods: list[str]) -> str:
    """The baseline a suite's methods are compared against unless one is named: FedAvg where the suite runs it,
    else its first method."""
    return DEFAULT_BASELINE if DEFAULT_BASELINE in methods else methods[0]


def compare(params: Params, suite: str, baseline: str | None = None, threshold: float | None = None,
            root: Path = Path(".")) -> list[Comparison]:
    """Every method of `suite` against `baseline` (`default_baseline` unless named) in every setting, in the
    suite's order."""
    body = params.raw["suites"].get(suite)
    if body is None:
        raise ConfigError(f"--suite {suite!r} is not a suite; `python -m fedskew suites` lists them")
    if not params.compared(suite):
        raise ConfigError(f"suite {suite!r} runs one method, {body['methods'][0]!r}: there is nothing to compare "
                          "it with")
    baseline = baseline or default_baseline(body["methods"])
    if baseline not in body["methods"]:
        raise ConfigError(f"--baseline {baseline!r} is not a method of suite {suite!r}; its methods: "
                          f"{', '.join(body['methods'])}")
    threshold = load_policy().word("beats").magnitude() if threshold is None else threshold
    outcomes, clients = _outcomes(params, suite, root), _client_outcomes(params, suite, root)
    first_seed = {(cfg.dataset, cfg.partition, cfg.method): cfg for cfg in reversed(params.suite_runs(suite))}
    found = []
    for setting in body["settings"]:
        for partition in setting["partitions"]:
            key = (setting["dataset"], partition)
            for method in (m for m in body["methods"] if m != baseline):
                comparison = _paired(suite, *key, method, baseline, outcomes[(*key, method)],
                                     outcomes[(*key, baseline)], threshold,
                                     [first_seed[(*key, method)], first_seed[(*key, baseline)]])
                found.append(dataclasses.replace(comparison, clients=_paired_clients(
                    comparison.seeds, clients.get((*key, method), {}), clients.get((*key, baseline), {}))))
    return found


def _paired_clients(seeds: tuple[int, ...], ours: dict[int, dict], base: dict[int, dict]) -> dict[str, Effect | None]:
    """Each per-client outcome's paired effect (method − baseline, points) over the comparison's seeds."""
    shared = [s for s in seeds if s in ours and s in base]
    return {name: paired_effect([ours[s][name] - base[s][name] for s in shared]) if shared else None
            for name in client_outcomes.NAMES}


def _paired(suite: str, dataset: str, partition: str, method: str, baseline: str, ours: dict[int, float | None],
            base: dict[int, float | None], threshold: float, seed_runs: list) -> Comparison:
    """One comparison; `seed_runs`: the runs one more seed adds (the method's and the baseline's), to cost."""
    diverged = {name: tuple(sorted(s for s, v in runs.items() if v is None))
                for name, runs in ((method, ours), (baseline, base)) if any(v is None for v in runs.values())}
    seeds = tuple(sorted(s for s in ours.keys() & base.keys() if ours[s] is not None and base[s] is not None))
    differences = tuple(ours[s] - base[s] for s in seeds)
    effect = paired_effect(list(differences)) if differences else None
    policy = load_policy()
    verdicts = {}
    for word in WORDS:
        if method in diverged:  # the method's diverged seed fails it, as the ledger rules
            verdicts[word] = VERDICTS[NOT_REPRODUCED]
        elif effect is None:
            verdicts[word] = VERDICTS[INCONCLUSIVE]
        else:
            verdicts[word] = VERDICTS[judge(effect, threshold, policy.word(word).ties_hold)]
    comparison = Comparison(suite, dataset, partition, method, baseline, seeds, differences, effect, threshold,
                            verdicts, diverged)
    if not comparison.inconclusive or effect is None:
        return comparison
    to_decide = seeds_to_decide(effect, threshold)
    cost = seeds_cost(seed_runs, to_decide.more) if to_decide.more and not to_decide.beyond else None
    return dataclasses.replace(comparison, to_decide=to_decide, to_decide_cost=cost)


# --- the comparison's files: markdown, CSV, JSON ----------------------------------------------------------------

def _interval(effect: Effect | None) -> str:
    if effect is None:
        return "no paired seed"
    if not effect.has_interval:
        return f"{effect.mean:+.2f} (one seed: no interval)"
    return f"{effect.mean:+.2f} [{effect.low:+.2f}, {effect.high:+.2f}]"


def _decide_text(comparison: Comparison) -> str:
    """The seeds that would decide it and their cost, two cells ("—" for a decided comparison)."""
    if comparison.to_decide is None:
        return "— | —"
    cost = cost_text(comparison.to_decide_cost) if comparison.to_decide_cost else "—"
    return f"{comparison.to_decide.text()} | {cost}"


def markdown(comparisons: list[Comparison]) -> str:
    """The comparison as a page: one row per method and setting, the protocol under it."""
    first = comparisons[0]
    level = round(100 * load_policy().level)
    lines = [f"# Suite `{first.suite}`: each method against `{first.baseline}`, paired by seed", "",
             f"| setting | method | seeds | mean difference [{level} % interval] | beats | at least as good | "
             "seeds that would decide it (estimate) | what those seeds cost | worst 10 % of clients: mean "
             f"difference [{level} %] |", "|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        diverged = "".join(f"; {name} diverged on seeds {list(seeds)}" for name, seeds in c.diverged.items())
        lines.append(f"| {c.dataset} / {c.partition} | {c.method} | {len(c.seeds)} | {_interval(c.effect)}{diverged} | "
                     f"{c.verdicts['beats']} | {c.verdicts['at least as good']} | {_decide_text(c)} | "
                     f"{_interval(c.clients.get('worst10_acc'))} |")
    metric = metrics.reported()
    lines += ["", f"Differences: {metric.label} at the final round, {metric.scale.unit or 'shown units'}, method − "
              f"{first.baseline} on the same seed (same partition, initial model and client sampling). Interval: "
              f"two-sided Student t over the paired seeds at {level} %. Verdicts (the claims ledger's policy): "
              f"`beats` holds when the whole interval is above {first.threshold}, `at least as good` when none of "
              "it is below; a method's diverged seed makes both fail, a baseline's leaves the pairing.", "",
              "Seeds that would decide an inconclusive comparison: an estimate, the smallest total number of paired "
              f"seeds n at which the interval would exclude the threshold if the mean d̄ and spread s of the "
              f"differences stayed as observed, {FORMULA}; their cost is the runs they add (the method's and "
              f"the baseline's), counted as `python -m fedskew cost` counts.", "",
              "Worst 10 % of clients: the same paired difference for the mean accuracy of the ⌈K/10⌉ clients the "
              "global model serves worst, each client's accuracy being the per-class test accuracies weighted by "
              "its training label proportions (docs/results.md, \"Per-client outcomes\"); the CSV and JSON add the "
              "mean over clients and the spread (a lower spread is fairer)."]
    return "\n".join(lines) + "\n"


def csv_text(comparisons: list[Comparison]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["dataset", "partition", "method", "baseline", "seeds", "mean", "low", "high", "threshold",
                     "beats", "at_least_as_good", "diverged", "seeds_to_decide", "more_seeds", "more_gpu_hours",
                     *(f"clients_{name}_{end}" for name in client_outcomes.NAMES for end in ("mean", "low", "high"))])
    for c in comparisons:
        record = c.record()
        writer.writerow([c.dataset, c.partition, c.method, c.baseline, len(c.seeds), record["mean"], record["low"],
                         record["high"], c.threshold, c.verdicts["beats"], c.verdicts["at least as good"],
                         json.dumps(record["diverged"], sort_keys=True, allow_nan=False), *_decide_cells(c),
                         *(getattr(c.clients.get(name), end, None) for name in client_outcomes.NAMES
                           for end in ("mean", "low", "high"))])
    return out.getvalue()


def _decide_cells(comparison: Comparison) -> tuple:
    """The CSV's seeds_to_decide (n*, "" where there is no estimate; "> 100000" beyond), more_seeds and the
    extra seeds' GPU-hours (at the cost module's assumed throughput)."""
    decide, cost = comparison.to_decide, comparison.to_decide_cost
    if decide is None or decide.seeds is None:
        return "", "", ""
    if decide.beyond:
        return f"> {decide.seeds}", "", ""
    return decide.seeds, decide.more, cost["gpu_hours"] if cost else ""


def write_comparison(comparisons: list[Comparison], root: Path = Path(".")) -> list[Path]:
    """The suite's comparison files (results/tables/compare/<suite>.{md,csv,json,png}), written atomically."""
    suite = comparisons[0].suite
    texts = {"md": markdown(comparisons), "csv": csv_text(comparisons),
             "json": json.dumps([c.record() for c in comparisons], indent=1, allow_nan=False) + "\n"}
    written = []
    for ext, text in texts.items():
        path = root / paths.COMPARISON.format(suite=suite, ext=ext)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        written.append(path)
    return [*written, write_comparison_figure(comparisons, root)]


# --- the command ------------------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    """The `compare` command and its arguments, on the CLI's subcommands."""
    p = sub.add_parser("compare", help="each method of a suite against a baseline, paired by seed: the mean "
                                       "difference with its 95 %% interval and the policy's verdicts")
    p.add_argument("--suite", required=True)
    p.add_argument("--baseline", help=f"the method compared against (default: {DEFAULT_BASELINE} where the suite "
                                      "runs it, else its first method)")
    p.add_argument("--threshold", type=arguments.number(0, MAX_THRESHOLD),
                   help=f"the margin `beats` must clear, in points, from 0 to {MAX_THRESHOLD:g} (default: the "
                        "policy's, 0)")
    p.add_argument("--json", action="store_true", help="one JSON record per comparison")
    p.add_argument("--write", action="store_true", help="write results/tables/compare/<suite>.{md,csv,json,png}")


def cmd_compare(params: Params, args) -> None:
    comparisons = compare(params, args.suite, args.baseline, args.threshold)
    if args.write:
        print("wrote " + ", ".join(str(path) for path in write_comparison(comparisons)))
    elif args.json:
        print(json.dumps([c.record() for c in comparisons], indent=1, allow_nan=False))
    else:
        print(markdown(comparisons), end="")
