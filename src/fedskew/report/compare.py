"""`python -m fedskew compare --suite S`: each method against a baseline, paired by seed, with its interval.

Every method of a suite trains, for a given seed, on the same partition, initial model and client-sampling
schedule, so the comparison a reviewer asks for is the paired one: per seed, the method's final reported
metric minus the baseline's, then the mean of those differences with its two-sided t-interval and the
verdicts of the claims ledger's policy (fedskew.reproduce.policy: its level, its interval, its words) for
"beats" (the whole interval above the threshold) and "at least as good" (not below it). Diverged runs are
handled as the ledger handles them: a seed on which the method diverged makes both verdicts fail, and names
the seed; a seed on which the baseline diverged leaves the pairing, and is named too.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from fedskew import metrics, paths
from fedskew.config import ConfigError, Params
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Effect, judge, load_policy, paired_effect
from fedskew.runfiles import atomic_write_text, read_metrics

WORDS = ("beats", "at least as good")  # the policy's words a comparison is judged by
# A comparison's verdicts in its own terms (the ledger's say whether a paper's claim reproduced).
VERDICTS = {REPRODUCED: "holds", NOT_REPRODUCED: "does not hold", INCONCLUSIVE: "inconclusive"}
DEFAULT_BASELINE = "fedavg"


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

    def record(self) -> dict:
        """The comparison as `--json` and the suite's comparison file give it."""
        effect = self.effect.record() if self.effect else None
        return {"suite": self.suite, "dataset": self.dataset, "partition": self.partition, "method": self.method,
                "baseline": self.baseline, "seeds": list(self.seeds), "differences": list(self.differences),
                "mean": effect["mean"] if effect else None, "low": effect["low"] if effect else None,
                "high": effect["high"] if effect else None, "threshold": self.threshold,
                "verdicts": self.verdicts, "diverged": {k: list(v) for k, v in self.diverged.items()}}


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


def compare(params: Params, suite: str, baseline: str | None = None, threshold: float | None = None,
            root: Path = Path(".")) -> list[Comparison]:
    """Every method of `suite` against `baseline` (fedavg unless named) in every setting, in the suite's order."""
    body = params.raw["suites"].get(suite)
    if body is None:
        raise ConfigError(f"--suite {suite!r} is not a suite; `python -m fedskew suites` lists them")
    baseline = baseline or DEFAULT_BASELINE
    if baseline not in body["methods"]:
        raise ConfigError(f"--baseline {baseline!r} is not a method of suite {suite!r}; its methods: "
                          f"{', '.join(body['methods'])}")
    policy = load_policy()
    threshold = policy.word("beats").magnitude() if threshold is None else threshold
    outcomes = _outcomes(params, suite, root)
    if len(body["methods"]) < 2:
        raise ConfigError(f"suite {suite!r} runs one method, {baseline!r}: there is nothing to compare it with")
    found = []
    for setting in body["settings"]:
        for partition in setting["partitions"]:
            base = outcomes[setting["dataset"], partition, baseline]
            for method in (m for m in body["methods"] if m != baseline):
                found.append(_paired(suite, setting["dataset"], partition, method, baseline,
                                     outcomes[setting["dataset"], partition, method], base, threshold))
    return found


def _paired(suite: str, dataset: str, partition: str, method: str, baseline: str, ours: dict[int, float | None],
            base: dict[int, float | None], threshold: float) -> Comparison:
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
    return Comparison(suite, dataset, partition, method, baseline, seeds, differences, effect, threshold, verdicts,
                      diverged)


# --- the comparison's files: markdown, CSV, JSON ----------------------------------------------------------------

def _interval(comparison: Comparison) -> str:
    effect = comparison.effect
    if effect is None:
        return "no paired seed"
    if not effect.has_interval:
        return f"{effect.mean:+.2f} (one seed: no interval)"
    return f"{effect.mean:+.2f} [{effect.low:+.2f}, {effect.high:+.2f}]"


def markdown(comparisons: list[Comparison]) -> str:
    """The comparison as a page: one row per method and setting, the protocol under it."""
    first = comparisons[0]
    level = round(100 * load_policy().level)
    lines = [f"# Suite `{first.suite}`: each method against `{first.baseline}`, paired by seed", "",
             f"| setting | method | seeds | mean difference [{level} % interval] | beats | at least as good |",
             "|---|---|---|---|---|---|"]
    for c in comparisons:
        diverged = "".join(f"; {name} diverged on seeds {list(seeds)}" for name, seeds in c.diverged.items())
        lines.append(f"| {c.dataset} / {c.partition} | {c.method} | {len(c.seeds)} | {_interval(c)}{diverged} | "
                     f"{c.verdicts['beats']} | {c.verdicts['at least as good']} |")
    metric = metrics.reported()
    lines += ["", f"Differences: {metric.label} at the final round, {metric.scale.unit or 'shown units'}, method − "
              f"{first.baseline} on the same seed (same partition, initial model and client sampling). Interval: "
              f"two-sided Student t over the paired seeds at {level} %. Verdicts (the claims ledger's policy): "
              f"`beats` holds when the whole interval is above {first.threshold}, `at least as good` when none of "
              "it is below; a method's diverged seed makes both fail, a baseline's leaves the pairing."]
    return "\n".join(lines) + "\n"


def csv_text(comparisons: list[Comparison]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["dataset", "partition", "method", "baseline", "seeds", "mean", "low", "high", "threshold",
                     "beats", "at_least_as_good", "diverged"])
    for c in comparisons:
        record = c.record()
        writer.writerow([c.dataset, c.partition, c.method, c.baseline, len(c.seeds), record["mean"], record["low"],
                         record["high"], c.threshold, c.verdicts["beats"], c.verdicts["at least as good"],
                         json.dumps(record["diverged"], sort_keys=True)])
    return out.getvalue()


def write_comparison(comparisons: list[Comparison], root: Path = Path(".")) -> list[Path]:
    """The suite's comparison files (results/tables/compare/<suite>.{md,csv,json}), written atomically."""
    suite = comparisons[0].suite
    texts = {"md": markdown(comparisons), "csv": csv_text(comparisons),
             "json": json.dumps([c.record() for c in comparisons], indent=1) + "\n"}
    written = []
    for ext, text in texts.items():
        path = root / paths.COMPARISON.format(suite=suite, ext=ext)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        written.append(path)
    return written


# --- the command ------------------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    """The `compare` command and its arguments, on the CLI's subcommands."""
    p = sub.add_parser("compare", help="each method of a suite against a baseline, paired by seed: the mean "
                                       "difference with its 95 %% interval and the policy's verdicts")
    p.add_argument("--suite", required=True)
    p.add_argument("--baseline", help=f"the method compared against (default: {DEFAULT_BASELINE})")
    p.add_argument("--threshold", type=float, help="the margin `beats` must clear, in points (default: the "
                                                   "policy's, 0)")
    p.add_argument("--json", action="store_true", help="one JSON record per comparison")
    p.add_argument("--write", action="store_true", help="write results/tables/compare/<suite>.{md,csv,json}")


def cmd_compare(params: Params, args) -> None:
    comparisons = compare(params, args.suite, args.baseline, args.threshold)
    if args.write:
        print("wrote " + ", ".join(str(path) for path in write_comparison(comparisons)))
    elif args.json:
        print(json.dumps([c.record() for c in comparisons], indent=1))
    else:
        print(markdown(comparisons), end="")
