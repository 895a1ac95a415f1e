"""The claims' verdicts: each claim of `claim` judged on the paper's printed numbers and on fedskew's runs.

Second of the claims ledger's three steps (claim ← verdicts ← ledger): it judges numbers and
writes no text; `ledger` renders what it returns (`evaluate_all`). The numbers it judges come from
`cell_sources` (the paper's printed cells, or ours per seed). The evidence beside the verdicts (offline
proxies, missing-class readings) is in `side_evidence`, on the same cell sources. `judge_on_ours` is
what every ledger asks of a claim on our runs, the papers' (`evaluate_all`) and one's own
(`own_ledger`): its protocols, its verdict, its threshold sensitivity and, when inconclusive, the
seeds that would decide it (`deciding`).

Verdicts on fedskew's runs come from paired per-seed effects (method − baseline on the same
seed) and their 95 % t-interval (`fedskew.reproduce.policy.judge`): **reproduced** when the
interval lies on the claimed side of the threshold, **not reproduced** when it lies entirely on
the other side, **inconclusive** when it straddles it or there is one seed. A claim's parts
(columns, baselines, lines) combine as `combine.combine_parts` says (**partly**: some parts reproduced,
not all); its protocols (the main one and each sensitivity protocol) as `combine_protocols`
(**partly**: conclusive protocols disagree: the verdict hangs on a choice the paper leaves silent).
**not run here** when no cell of the claim has our numbers (the reason is given).

On the paper's printed numbers the same rules give points, not intervals; the ledger sorts each
claim by cause: it holds; holds only within a stated tolerance; depends on the threshold (fails at
the policy's value, holds at half or double it); or the paper's table contradicts its prose.
Proxies (offline settings in the layout, `side_evidence.proxy_comparisons`) test the *direction* of
gap claims with the same interval rule and are reported apart, by the setting they ran on.
"""

from __future__ import annotations

from pathlib import Path

from fedskew.config import Params
from fedskew.reproduce.cell_sources import CellSource, OursSource, PaperSource, combined_effect, mean_value
from fedskew.reproduce.claim import (CONTRADICTED, DEPENDS, HOLDS, STRICTER, WITHIN_TOLERANCE, Claim, claim_cells,
                                     line_cells, load_claims)
from fedskew.reproduce.combine import combine_parts, combine_protocols, conjunction
from fedskew.reproduce.deciding import seeds_to_decide_claim
from fedskew.reproduce.layouts import Layout, load_layouts
from fedskew.reproduce.paper_tables import load_paper_table
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Effect, judge, load_policy
from fedskew.reproduce.tables import our_cells, protocol_label


# ------------------------------------------------------------------ one claim on one source
def evaluate(claim: Claim, source: CellSource, factor: float = 1.0) -> dict:
    """The claim on one source's numbers, its policy magnitudes scaled by `factor`.

    Returns {verdict, parts | lines, detail?, within_tolerance}; `verdict` is one of VERDICTS (on a
    paper source never inconclusive: points have no interval)."""
    if claim.kind in ("gap", "drop"):
        return _evaluate_gap(claim, source, factor)
    return _evaluate_trend(claim, source, factor)


def _gap_part(claim: Claim, source: CellSource, label: str, subject_terms, baseline_terms: dict,
              threshold: float) -> dict | None:
    """One column (or pair) of a gap/drop claim: the subject against every baseline there.

    In our tables a baseline without runs (not trained yet, or imported only in part) leaves the column
    open: it cannot hold before every baseline has run, so it is at best inconclusive, and the baselines
    missing are named. A conclusive failure against one that ran stands. (A paper's blank cell is not a
    missing run: the paper's own numbers are judged on what it prints.)"""
    judged = {}
    for baseline, terms in baseline_terms.items():
        effect = combined_effect(source, [*subject_terms, *terms])
        if effect is not None:
            judged[baseline] = (effect, judge(effect, threshold, claim.rule.ties_hold))
    if not judged:
        return None
    verdict = conjunction([v for _, v in judged.values()])
    missing = [] if source.point else [b for b in claim.against if b not in judged]
    if missing and verdict == REPRODUCED:
        verdict = INCONCLUSIVE
    if verdict == NOT_REPRODUCED:  # show the clearest failure
        deciding = min((b for b, (_, v) in judged.items() if v == NOT_REPRODUCED), key=lambda b: judged[b][0].mean)
    else:  # show the closest call: the lowest lower bound
        deciding = min(judged, key=lambda b: (judged[b][0].low if judged[b][0].low is not None
                                              else judged[b][0].mean))
    return {"label": label, "verdict": verdict, "vs": deciding, "effect": judged[deciding][0].record(),
            "baselines": {b: {"verdict": v, **e.record()} for b, (e, v) in judged.items()},
            "baselines_missing": missing}


def _evaluate_gap(claim: Claim, source: CellSource, factor: float) -> dict:
    threshold = factor * claim.threshold
    parts, total = [], 0
    if claim.kind == "gap":
        units = [(column, [(column, 1.0)]) for column in claim.columns]
        sign = claim.sign
    else:  # drop: value(from) − value(to) per row, smaller is better
        units = [(f"{a} → {b}", [(a, 1.0), (b, -1.0)]) for a, b in claim.pairs]
        sign = -1.0
    for label, columns in units:
        total += 1
        failed = sorted({s for c, _ in columns for s in source.diverged(claim.subject, c)})
        if failed:  # the claimed method did not train on these seeds: the column cannot hold (policy)
            parts.append({"label": label, "verdict": NOT_REPRODUCED, "diverged": {claim.subject: failed}})
            continue
        subject = [source.values(claim.subject, c) for c, _ in columns]
        if any(v is None for v in subject):
            continue
        subject_terms = [(sign * w, v) for (_, w), v in zip(columns, subject)]
        baseline_terms = {}
        for baseline in claim.against:
            values = [source.values(baseline, c) for c, _ in columns]
            if all(v is not None for v in values):
                baseline_terms[baseline] = [(-sign * w, v) for (_, w), v in zip(columns, values)]
        part = _gap_part(claim, source, label, subject_terms, baseline_terms, threshold)
        if part is not None:
            left_out = {b: seeds for b in claim.against
                        if (seeds := sorted({s for c, _ in columns for s in source.diverged(b, c)}))}
            if left_out:
                part["diverged"] = left_out
            parts.append(part)
    verdict = combine_parts([p["verdict"] for p in parts], claim.quantifier)
    out = {"verdict": verdict, "parts": parts, "within_tolerance": False}
    if parts and len(parts) < total:
        out["detail"] = f"{len(parts)} of {total} columns run"
    return out


def _gap_series(claim: Claim, source: CellSource) -> list[list[tuple[float, dict]]] | None:
    """gap_trend: per column, the terms of sign · (subject − best baseline), the best by mean."""
    series = []
    for column in claim.order:
        subject = source.values(claim.subject, column)
        baselines = {b: v for b in claim.against if (v := source.values(b, column)) is not None}
        if subject is None or not baselines:
            return None
        best = max(baselines, key=lambda b: claim.sign * mean_value(baselines[b]))
        series.append([(claim.sign, subject), (-claim.sign, baselines[best])])
    return series


def _judge_line(claim: Claim, source: CellSource, series: list[list[tuple[float, dict]]], factor: float,
                label: str) -> dict | None:
    """A trend line: its steps and net change (signed so that + is the stated direction), judged by
    the policy (net on the claimed side, no step against it beyond the tolerance) and strictly."""
    direction = claim.direction

    def change(i: int, j: int) -> Effect | None:  # direction · (point j − point i)
        return combined_effect(source, [(direction * c, v) for c, v in series[j]]
                               + [(-direction * c, v) for c, v in series[i]])

    steps = [change(i, i + 1) for i in range(len(series) - 1)]
    net = change(0, len(series) - 1)
    if net is None or any(s is None for s in steps):
        return None
    tolerance = factor * load_policy().trend_tolerance
    net_verdict = judge(net, factor * claim.threshold, claim.rule.ties_hold)
    step_verdicts = [judge(s, -tolerance, True) for s in steps]  # a step back by at most the tolerance is fine
    strict = conjunction([judge(s, 0.0, False) for s in steps])
    verdict = conjunction([net_verdict, *step_verdicts])
    worst = min(range(len(steps)), key=lambda i: steps[i].mean)
    # the line's points as printed / as our means (for reading; the judgement uses the paired effects)
    points = [sum(c * mean_value(v) for c, v in terms) for terms in series]
    return {"label": label, "verdict": verdict, "strict": strict, "series": points, "direction": direction,
            "net": net.record(), "step_verdicts": step_verdicts,
            "steps": [s.record() for s in steps], "worst_step": worst,
            "within_tolerance": verdict == REPRODUCED and strict != REPRODUCED}


def _diverged_in(source: CellSource, cells: list[tuple[str, str]]) -> dict[str, list[int]]:
    """row -> the seeds whose run diverged in any of these cells (rows without any left out)."""
    out: dict[str, set[int]] = {}
    for row, column in cells:
        if seeds := source.diverged(row, column):
            out.setdefault(row, set()).update(seeds)
    return {row: sorted(seeds) for row, seeds in out.items()}


def _trend_line(claim: Claim, source: CellSource, factor: float, label: str) -> dict | None:
    """One line of a trend claim (a method's own trend, or gap_trend's lead over the best baseline), or
    None where it has not run. Diverged runs (the policy's rule): the claimed method's diverged seed fails
    the lead; a method judged on its own is judged on its finished seeds, and one with none somewhere is
    inconclusive; the diverged seeds are named."""
    if claim.kind == "gap_trend":
        failed = _diverged_in(source, [(claim.subject, c) for c in claim.order])
        if failed:
            return {"label": label, "verdict": NOT_REPRODUCED, "diverged": failed}
        series = _gap_series(claim, source)
        left_out = _diverged_in(source, [(b, c) for b in claim.against for c in claim.order])
    else:
        cells = line_cells(claim, label)
        values = [source.values(r, c) for r, c in cells]
        left_out = _diverged_in(source, cells)
        if any(v is None for v in values):
            return {"label": label, "verdict": INCONCLUSIVE, "diverged": left_out} if left_out else None
        series = [[(1.0, v)] for v in values]
    judged = None if series is None else _judge_line(claim, source, series, factor, label)
    if judged is not None and left_out:
        judged["diverged"] = left_out
    return judged


def _evaluate_trend(claim: Claim, source: CellSource, factor: float) -> dict:
    labels = ["gap"] if claim.kind == "gap_trend" else list(claim.for_each)
    lines = [line for label in labels if (line := _trend_line(claim, source, factor, label)) is not None]
    verdict = combine_parts([line["verdict"] for line in lines], claim.quantifier)
    out = {"verdict": verdict, "lines": lines,
           "within_tolerance": any(line.get("within_tolerance", False) for line in lines),
           "strict": combine_parts([line.get("strict", line["verdict"]) for line in lines], claim.quantifier)}
    if lines and len(lines) < len(labels):
        out["detail"] = f"{len(lines)} of {len(labels)} lines run"
    return out


# ------------------------------------------------------------------ the paper's own numbers
def paper_status(claim: Claim) -> dict:
    """The claim on the paper's printed numbers, sorted by cause (`status`):

    - holds;
    - holds within the stated tolerance (a trend reversal no larger than the tolerance);
    - depends on the threshold: fails at a magnitude the policy chose, holds at one of its
      sensitivity multiples (a gap the sentence quotes is not the policy's choice);
    - the paper's table contradicts its prose;
    - fails only in a stricter reading than the sentence (`reading: stricter`).
    """
    source = PaperSource(load_paper_table(claim.table))
    result = evaluate(claim, source)
    if result["verdict"] == REPRODUCED:
        result["status"] = WITHIN_TOLERANCE if result["within_tolerance"] else HOLDS
    elif claim.reading == "stricter":
        result["status"] = STRICTER
    elif claim.policy_magnitude and any(evaluate(claim, source, f)["verdict"] == REPRODUCED
                                        for f in load_policy().sensitivity):
        result["status"] = DEPENDS
    else:
        result["status"] = CONTRADICTED
    return result


# ------------------------------------------------------------------ fedskew's runs
def evaluate_on_ours(claim: Claim, params: Params, protocol: str | None, root: Path = Path("."),
                     cells: dict | None = None, factor: float = 1.0, layout: Layout | None = None) -> dict:
    """The claim on our runs under one protocol of its table's layout (a paper table's, unless `layout` is given:
    a suite's grid, `own_claims`), its policy magnitudes scaled by `factor`."""
    layout = load_layouts()[claim.table] if layout is None else layout
    cells = our_cells(params, layout, protocol, root) if cells is None else cells
    source = OursSource(cells, layout.table.decimals)
    result = evaluate(claim, source, factor)
    used = claim_cells(claim)
    result["suites"] = sorted({cells[k].spec.suite for k in used if cells[k].n and cells[k].spec.suite})
    stale: dict[str, set[int]] = {}  # row -> seeds whose runs are out of date, left out (fedskew.stale)
    for k in used:
        stale.setdefault(k[0], set()).update(cells[k].stale_seeds)
    if any(stale.values()):
        result["stale"] = {row: sorted(seeds) for row, seeds in stale.items() if seeds}
    if result["verdict"] == NOT_RUN:
        reasons = sorted({cells[k].not_run or "diverged" for k in used if not cells[k].n})
        more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        result["reason"] = "; ".join(reasons[:3]) + more
    return result


class CellsCache:
    """Our cells of each layout under each protocol, read once (several claims share a table)."""

    def __init__(self, params: Params, root: Path = Path("."), suites: set[str] | None = None):
        self.params, self.root, self.suites = params, root, suites
        self._cells: dict[tuple, dict] = {}

    def __call__(self, layout: Layout, protocol: str | None) -> dict:
        # a protocol's label names what it swaps in its layout (a user's label maps to a suite of their choice)
        key = (layout.table.id, protocol, repr(layout.protocols.get(protocol)) if protocol else None)
        if key not in self._cells:
            self._cells[key] = our_cells(self.params, layout, protocol, self.root, self.suites)
        return self._cells[key]


def judge_on_ours(claim: Claim, layout: Layout, cells_of: CellsCache) -> dict:
    """A claim on our runs, as every ledger gives it: under each protocol of its layout (`ours`), combined
    (`verdict`), at each of the policy's threshold multiples (`sensitivity`, the main protocol; threshold-bearing
    claims only) and, when inconclusive, the seeds that would decide it (`seeds_to_decide`, `deciding`)."""
    params, root = cells_of.params, cells_of.root
    protocols = {protocol_label(p): evaluate_on_ours(claim, params, p, root, cells_of(layout, p), layout=layout)
                 for p in (None, *layout.protocols)}
    out = {"ours": protocols, "verdict": combine_protocols([r["verdict"] for r in protocols.values()])}
    if claim.threshold_bearing:
        main = cells_of(layout, None)
        out["sensitivity"] = {str(f): evaluate_on_ours(claim, params, None, root, main, f, layout)["verdict"]
                              for f in load_policy().sensitivity}
    if out["verdict"] == INCONCLUSIVE:
        out["seeds_to_decide"] = seeds_to_decide_claim(claim, layout, protocols, lambda p: cells_of(layout, p),
                                                       params)
    return out


# ------------------------------------------------------------------ the papers' ledger
def evaluate_all(params: Params, root: Path = Path(".")) -> list[dict]:
    records = []
    cells_of = CellsCache(params, root)
    for claim in load_claims():
        layout = load_layouts()[claim.table]
        ours = judge_on_ours(claim, layout, cells_of)
        record = {
            "id": claim.id, "paper": claim.paper, "section": claim.section, "table": claim.table,
            "statement": claim.statement, "quote": claim.quote, "kind": claim.kind, "word": claim.word,
            "rule": claim.rule.rule, "threshold": claim.threshold, "ties_hold": claim.rule.ties_hold,
            "quantifier": claim.quantifier, "reading": claim.reading, "reading_note": claim.raw.get("reading_note"),
            "better": claim.raw.get("better", "higher"), "metric": layout.metric,
            "decimals": layout.table.decimals, "paper_note": claim.raw.get("paper_note"),
            "on_paper": paper_status(claim), "ours": ours["ours"], "verdict": ours["verdict"],
        }
        if "sensitivity" in ours:
            record["threshold_sensitivity"] = {
                f: {"paper": evaluate(claim, PaperSource(layout.table), float(f))["verdict"], "ours": verdict}
                for f, verdict in ours["sensitivity"].items()}
        if "seeds_to_decide" in ours:
            record["seeds_to_decide"] = ours["seeds_to_decide"]
        records.append(record)
    return records
