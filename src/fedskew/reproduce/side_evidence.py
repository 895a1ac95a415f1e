"""Evidence beside the claims' verdicts: the offline proxies and the missing-class readings.

A side branch of the claims ledger (claim ← verdicts ← ledger): `proxy_comparisons` tests the
*direction* of each gap claim on the offline settings its table's layout names, with the same
interval rule as `verdicts` but never in the paper's name; `missing_class_evidence` lists every
reading of a class a client lacks for each count-calibrated method on every setting that ran it.
`ledger` renders both.
"""

from __future__ import annotations

from pathlib import Path

from fedskew import metrics
from fedskew.config import Params
from fedskew.reproduce.cell_sources import OursSource, combined_effect, mean_value
from fedskew.reproduce.claim import load_claims
from fedskew.reproduce.layouts import CellSpec, Layout, load_layouts
from fedskew.reproduce.policy import decimals_for, judge
from fedskew.reproduce.tables import read_cell
from fedskew.reproduce.combine import conjunction


# ------------------------------------------------------------------ offline proxies
def proxy_comparisons(params: Params, root: Path = Path(".")) -> dict:
    """The direction of every gap claim on each offline proxy setting of its table.

    Returns {"pairs": [...], "claims": [...]}: each pair is one comparison (setting, method,
    baseline method), with its paired effect and 95 % interval, listed once with every claim it
    serves; each claim entry is the claim's direction verdict on a setting (every baseline it names
    that ran there must be behind), citing its pairs. No number appears twice, and none under the
    label of a paper's dataset.
    """
    suites = set(params.reproduce_suites)
    pairs: dict[tuple, dict | None] = {}
    verdicts = []
    for claim in load_claims():
        if claim.kind != "gap":
            continue
        layout = load_layouts()[claim.table]
        subject = layout.method_of(claim.subject)
        against = sorted({m for r in claim.against if (m := layout.method_of(r)) is not None} - {subject})
        for proxy in layout.proxies:
            if proxy["suite"] not in suites or subject is None or not against:
                continue
            setting = (proxy["suite"], proxy["dataset"], proxy["partition"])
            keys = []
            for baseline in against:
                key = (*setting, subject, baseline, claim.sign)
                if key not in pairs:
                    pairs[key] = _proxy_pair(params, layout, proxy, subject, baseline, claim.sign, suites, root)
                if pairs[key] is not None:
                    pairs[key]["claims"].append(claim.id)
                    keys.append(key)
            if keys:
                ran = [pairs[k] for k in keys]
                verdicts.append({"claim": claim.id, "setting": ran[0]["setting"], "suite": proxy["suite"],
                                 "verdict": conjunction([p["verdict"] for p in ran]),
                                 "against": [p["against"] for p in ran],
                                 "baselines_missing": sorted(set(against) - {p["against"] for p in ran})})
    return {"pairs": [p for p in pairs.values() if p is not None], "claims": verdicts}


def _proxy_pair(params: Params, layout: Layout, proxy: dict, subject: str, baseline: str, sign: float,
                suites: set[str], root: Path) -> dict | None:
    """One proxy comparison: `subject` against `baseline` on the proxy's setting, the direction only."""
    available = {cfg.method for cfg in params.suite_runs(proxy["suite"])
                 if (cfg.dataset, cfg.partition) == (proxy["dataset"], proxy["partition"])}
    if subject not in available or baseline not in available:
        return None

    def values(method: str) -> dict[int, float] | None:
        cell = read_cell(params, CellSpec(proxy["suite"], proxy["dataset"], proxy["partition"], method),
                         layout.metric, suites, root)
        return dict(cell.seeds) or None

    mine, theirs = values(subject), values(baseline)
    if mine is None or theirs is None:
        return None
    effect = combined_effect(OursSource({}, layout.table.decimals), [(sign, mine), (-sign, theirs)])
    if effect is None:
        return None
    seeds = len(set(mine) & set(theirs))
    # The direction only, ahead (> 0), whatever the claim's threshold or tie rule: a proxy's
    # magnitudes do not carry over to the paper's setting.
    verdict = judge(effect, 0.0, ties_hold=False)
    return {"suite": proxy["suite"], "dataset": proxy["dataset"], "partition": proxy["partition"],
            "setting": f"{proxy['label']}, {seeds} seed{'s' if seeds != 1 else ''}",
            "subject": subject, "against": baseline, "better": "lower" if sign < 0 else "higher",
            "metric": layout.metric, "verdict": verdict, "effect": effect.record(),
            "places": decimals_for(mean_value(mine), layout.table.decimals), "claims": []}


# ------------------------------------------------------------------ missing classes
# The three readings of a class a client lacks (fedskew.fl.losses.MISSING_CLASS_TREATMENTS), per method.
MISSING_CLASS_METHODS = {
    "FedLC": {"mask": "fedlc", "floor": "fedlc_floor", "global": "fedlc_global"},
    "FedLogit": {"mask": "fedlogit", "floor": "fedlogit_floor", "global": "fedlogit_global"},
    "FedED": {"mask": "feded", "floor": "feded_floor", "global": "feded_global"},
    "SCALA": {"mask": "scala", "floor": "scala_floor", "global": "scala_global"},
}


def missing_class_evidence(params: Params, root: Path = Path(".")) -> list[dict]:
    """Every missing-class option of every count-calibrated method on every reproduced setting that ran it."""
    suites = set(params.reproduce_suites)
    out = []
    for suite in params.reproduce_suites:
        settings = sorted({(c.dataset, c.partition) for c in params.suite_runs(suite)})
        methods = {c.method for c in params.suite_runs(suite)}
        for dataset, partition in settings:
            for family, options in MISSING_CLASS_METHODS.items():
                present = {o: m for o, m in options.items() if m in methods}
                if len(present) < 2:
                    continue
                row = {"suite": suite, "dataset": dataset, "partition": partition, "method": family}
                for option, method in [("FedAvg", "fedavg"), *present.items()]:
                    if method not in methods:
                        continue
                    cell = read_cell(params, CellSpec(suite, dataset, partition, method),
                                     metrics.reported_key(), suites, root)
                    row[option] = cell.text()
                out.append(row)
    return out
