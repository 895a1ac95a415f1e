"""The seeds that would decide an inconclusive claim, and what they cost: an estimate, per comparison, part and claim.

`seeds.seeds_to_decide` estimates, for one inconclusive comparison (a paired effect against its threshold), the
paired seeds n* at which its interval would exclude the threshold at the observed mean and spread; there it is
decided toward the side its mean is on (*reproduced* above the threshold, *not reproduced* below). A part of a
claim (a column against each baseline; a trend line's net change and each step, a step against minus the trend
tolerance) and the claim (its parts under its quantifier) are decided at the fewest seeds from which their
verdict, combined as the policy combines it (`combine`), no longer changes as seeds are added, if every
comparison's mean and spread hold:

- a part needs every comparison (`conjunction`): one decided toward *not reproduced* decides it there, else the
  comparison needing most seeds does;
- a claim under *all* is decided when every part is, unless parts decided both ways make it *partly* earlier
  (no later part can change that); under *most* when a majority is decided either way;
- a comparison without an estimate (one paired seed, a mean exactly at its threshold, a baseline not run, a
  setting without a finished seed, more than `seeds.MAX_SEEDS` seeds) may still end either way: a verdict that
  hangs on one has no estimate, and the ledger says which comparison it hangs on.

The strict reading of a trend is reported beside its verdict, never decides it, and is not estimated. The
estimate is for one protocol: the main one, or the first inconclusive one where the main protocol has not run
(while every protocol is inconclusive, deciding one decides the claim). Its cost is that of bringing each run
cell the claim reads to n* finished seeds (`seeds.seeds_cost`, counted as `cost` counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedskew.config import Params
from fedskew.reproduce.claim import Claim, claim_cells
from fedskew.reproduce.combine import combine_parts, conjunction
from fedskew.reproduce.layouts import Layout
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Effect, judge, load_policy
from fedskew.reproduce.seeds import FORMULA, seeds_cost, seeds_to_decide
from fedskew.reproduce.tables import OurCell, cell_runs, protocol_label


@dataclass(frozen=True)
class Open:
    """One verdict a claim combines (a comparison, or a part): conclusive now, or inconclusive and decided at
    `seeds` paired seeds toward `toward` (None: no estimate, `reason` says why)."""

    label: str
    verdict: str
    seeds: int | None = None
    toward: str | None = None
    observed: int | None = None   # the paired seeds run so far
    reason: str = ""
    by: str = ""                  # the comparison that decides a part

    @property
    def unknown(self) -> bool:
        return self.verdict == INCONCLUSIVE and self.seeds is None

    def record(self) -> dict:
        more = None if self.seeds is None or self.observed is None else self.seeds - self.observed
        return {"label": self.label, "verdict": self.verdict, "seeds": self.seeds, "more": more,
                "observed": self.observed, "toward": self.toward, "by": self.by or None,
                "reason": self.reason or None}


def comparison(label: str, record: dict, threshold: float, verdict: str) -> Open:
    """One comparison (a paired effect's `record` against `threshold`), with its estimate if inconclusive."""
    if verdict != INCONCLUSIVE:
        return Open(label, verdict)
    effect = Effect.from_record(record)
    estimate = seeds_to_decide(effect, threshold)
    if estimate.seeds is None or estimate.beyond:
        return Open(label, verdict, observed=effect.n, reason=estimate.text())
    toward = REPRODUCED if effect.mean > threshold else NOT_REPRODUCED
    return Open(label, verdict, estimate.seeds, toward, effect.n)


def settle(items: list[Open], combine) -> Open | None:
    """When `items`, combined by `combine`, are decided: the fewest seeds from which the combined verdict stays
    the same and conclusive as seeds are added, whatever the items without an estimate become (None: never)."""
    unknown = sum(item.unknown for item in items)
    known = [item for item in items if not item.unknown]

    def outcomes(n: int) -> set[str]:
        now = [item.verdict if item.verdict != INCONCLUSIVE else item.toward if item.seeds <= n else INCONCLUSIVE
               for item in known]
        return {combine(now + [REPRODUCED] * r + [NOT_REPRODUCED] * q + [INCONCLUSIVE] * (unknown - r - q))
                for r in range(unknown + 1) for q in range(unknown + 1 - r)}

    settled: tuple[int, str] | None = None
    for n in sorted({item.seeds for item in known if item.verdict == INCONCLUSIVE}, reverse=True):
        found = outcomes(n)
        if len(found) != 1 or found == {INCONCLUSIVE} or (settled is not None and found != {settled[1]}):
            break
        settled = (n, found.pop())
    if settled is None:
        return None
    deciding = next(item for item in known if item.verdict == INCONCLUSIVE and item.seeds == settled[0])
    by = deciding.label  # a comparison ("vs FedAvg"), or a part with the comparison that decides it
    if deciding.by:
        by += (" " if deciding.by.startswith("vs ") else ", ") + deciding.by
    return Open("", INCONCLUSIVE, settled[0], settled[1], deciding.observed, by=by)


def _part_items(claim: Claim, part: dict) -> list[Open]:
    """The comparisons of a gap or drop claim's column (or pair): the subject against each baseline there."""
    items = [comparison(f"vs {baseline}", record, claim.threshold, record["verdict"])
             for baseline, record in part.get("baselines", {}).items()]
    for baseline in part.get("baselines_missing", []):
        why = "diverged on every seed there" if baseline in part.get("diverged", {}) else "has not run there"
        items.append(Open(f"vs {baseline}", INCONCLUSIVE, reason=f"{baseline} {why}"))
    return items


def _line_items(claim: Claim, line: dict) -> list[Open]:
    """The comparisons of a trend line: its net change against the threshold, each step against −tolerance."""
    if "series" not in line:
        return [Open("the line", INCONCLUSIVE, reason="a setting of it has no finished seed")]
    net = Effect.from_record(line["net"])
    items = [comparison("net change", line["net"], claim.threshold, judge(net, claim.threshold, claim.rule.ties_hold))]
    tolerance = load_policy().trend_tolerance
    order = list(claim.order)
    items += [comparison(f"step {order[i]} → {order[i + 1]}", step, -tolerance, line["step_verdicts"][i])
              for i, step in enumerate(line["steps"])]
    return items


def _part(claim: Claim, part: dict, trend: bool) -> tuple[Open, list[Open]]:
    """A part as the claim combines it (decided when its comparisons are), and its comparisons."""
    if part["verdict"] != INCONCLUSIVE:
        return Open(part["label"], part["verdict"]), []
    items = _line_items(claim, part) if trend else _part_items(claim, part)
    settled = settle(items, conjunction)
    if settled is None:
        reason = "; ".join(f"{item.label}: {item.reason}" for item in items if item.unknown)
        return Open(part["label"], INCONCLUSIVE, reason=f"no estimate ({reason})"), items
    return Open(part["label"], INCONCLUSIVE, settled.seeds, settled.toward, settled.observed, by=settled.by), items


def decide(claim: Claim, result: dict) -> dict:
    """The estimate for a claim's result under one protocol: when the claim is decided (`seeds`, `toward`) and
    each inconclusive part, with the comparisons it combines."""
    trend = "lines" in result
    opens, parts = [], []
    for part in result["lines" if trend else "parts"]:
        decided, items = _part(claim, part, trend)
        opens.append(decided)
        if part["verdict"] == INCONCLUSIVE:
            parts.append({**decided.record(), "comparisons": [item.record() for item in items
                                                              if item.verdict == INCONCLUSIVE]})
    settled = settle(opens, lambda verdicts: combine_parts(verdicts, claim.quantifier))
    if settled is None:
        hanging = [o.label for o in opens if o.unknown]
        settled = Open("", INCONCLUSIVE, reason=f"no estimate: it hangs on {', '.join(hanging)}, which "
                                                f"{'has' if len(hanging) == 1 else 'have'} none")
    return {**{k: v for k, v in settled.record().items() if k not in ("label", "verdict")}, "parts": parts}


def seeds_to_decide_claim(claim: Claim, layout: Layout, protocols: dict[str, dict], cells_for, params: Params
                          ) -> dict | None:
    """The seeds that would decide an inconclusive claim (its results per protocol label, `protocols`), under
    its main protocol or else its first inconclusive one, with their cost; `cells_for(protocol)`: our cells."""
    chosen = next((p for p in (None, *layout.protocols) if protocols[protocol_label(p)]["verdict"] == INCONCLUSIVE),
                  False)
    if chosen is False:
        return None
    out = {"protocol": protocol_label(chosen), "estimate": True, "formula": FORMULA,
           **decide(claim, protocols[protocol_label(chosen)])}
    out["cost"] = (None if out["seeds"] is None
                   else claim_cost(claim, cells_for(chosen), params, out["seeds"]))
    return out


def _base_cells(key: tuple[str, str], cells: dict, into: dict) -> None:
    """The cells with runs of their own behind `key`: itself, or those a derived cell is computed from."""
    cell = cells[key]
    if cell.spec.difference is not None:
        for row in cell.spec.difference:
            _base_cells((row, key[1]), cells, into)
    elif cell.spec.mean_of is not None:
        for column in cell.spec.mean_of:
            _base_cells((key[0], column), cells, into)
    elif not cell.not_run:
        into[key] = cell


def claim_cost(claim: Claim, cells: dict[tuple[str, str], OurCell], params: Params, seeds: int) -> dict:
    """What bringing each run cell the claim reads (of `cells`, one protocol's) to `seeds` finished seeds costs:
    the runs those extra seeds add, as `seeds.seeds_cost` counts them, and the number of cells."""
    base: dict[tuple[str, str], OurCell] = {}
    for key in claim_cells(claim):
        _base_cells(key, cells, base)
    groups: dict[int, list] = {}
    for cell in base.values():
        runs = cell_runs(params, cell.spec)
        if runs and seeds > cell.n:
            groups.setdefault(seeds - cell.n, []).append(runs[0])
    total = seeds_cost([], 0)
    for more, runs in groups.items():
        cost = seeds_cost(runs, more)
        for key in ("runs", "pflop", "gpu_hours"):
            total[key] += cost[key]
        total["cpu_hours"] = None if None in (total["cpu_hours"], cost["cpu_hours"]) else \
            total["cpu_hours"] + cost["cpu_hours"]
    return {**total, "cells": len(base)}
