"""The claims ledger: each headline claim of each paper as a checkable statement, with a verdict.

Claims live in `claims/<paper>.yaml`, written over the paper's own tables (row and column
labels of `papers/<id>.yaml`), so the same claim is evaluated on the paper's numbers (a
check of the paper itself) and on ours (through the table's layout). Each claim names the
**word** of its sentence; `policy.yaml` maps the word to one rule (a threshold, whether a
tie holds), the same in all four papers. Kinds:

- `gap`: subject − baseline ≥ threshold (> 0 for "beats") against every baseline of `against`,
  in each of `columns` (`better: lower` for a loss: the sign flips);
- `drop`: the subject loses less between the two columns of each of `pairs` than every baseline
  ("robust to ..."): baseline drop − subject drop > 0;
- `trend`: along `order` (columns, or rows with `along: rows`) each line of `for_each` moves in
  `direction`: net change (last − first) on the stated side of the threshold, and no step against
  it by more than the policy's trend tolerance; strict monotonicity is reported beside it;
- `gap_trend`: the gap of `subject` over the best of `against` moves in `direction` along `order`.

Verdicts on fedskew's runs come from paired per-seed effects (method − baseline on the same
seed) and their 95 % t-interval (`fedskew.reproduce.policy.judge`): **reproduced** when the
interval lies on the claimed side of the threshold, **not reproduced** when it lies entirely on
the other side, **inconclusive** when it straddles it or there is one seed. A claim's parts
(columns, baselines, lines) combine as `combine_parts` says (**partly**: some parts reproduced,
not all); its protocols (the main one and each sensitivity protocol) as `combine_protocols`
(**partly**: conclusive protocols disagree: the verdict hangs on a choice the paper leaves silent).
**not run here** when no cell of the claim has our numbers (the reason is given).

On the paper's printed numbers the same rules give points, not intervals; the ledger sorts each
claim by cause: it holds; holds only within a stated tolerance; depends on the threshold (fails at
the policy's value, holds at half or double it); or the paper's table contradicts its prose.
Proxies (offline settings in the layout) test the *direction* of gap claims with the same
interval rule and are reported apart, by the setting they ran on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Protocol

import yaml

from fedskew.config import Params
from fedskew.reproduce.layouts import CellSpec, Layout, load_layouts
from fedskew.reproduce.paper_tables import PaperTable, load_paper_table
from fedskew.reproduce.policy import (INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, PARTLY, REPRODUCED, Effect,
                                      WordRule, decimals_for, fmt_effect, judge, load_policy, paired_effect,
                                      point_effect)
from fedskew.reproduce.tables import OurCell, our_cells, protocol_label, read_cell

CLAIMS_DIR = Path(__file__).parent / "claims"
KINDS = ("gap", "drop", "trend", "gap_trend")
READINGS = ("sentence", "weaker", "stricter")
QUANTIFIERS = ("all", "most")
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)
PAPER_ORDER = ("FedLC", "SCALA", "FedED", "FL-FCR")

# What the paper's own numbers say about a claim (`paper_status`).
HOLDS = "holds"
WITHIN_TOLERANCE = "holds within the stated tolerance"
DEPENDS = "depends on the threshold"
CONTRADICTED = "the paper's table contradicts its prose"
STRICTER = "fails only in a stricter reading than the sentence"
PAPER_STATUSES = (HOLDS, WITHIN_TOLERANCE, DEPENDS, CONTRADICTED, STRICTER)


class ClaimError(ValueError):
    """A claim that does not fit its table or the policy."""


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    section: str
    quote: str
    statement: str
    kind: str
    table: str
    word: str
    raw: dict = field(repr=False)

    def __getattr__(self, name):  # the kind-specific fields (subject, against, columns, ...)
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def sign(self) -> float:
        return -1.0 if self.raw.get("better", "higher") == "lower" else 1.0

    @property
    def rule(self) -> WordRule:
        return load_policy().word(self.word)

    @property
    def threshold(self) -> float:
        return self.rule.magnitude(self.raw.get("x"))

    @property
    def reading(self) -> str:
        return self.raw.get("reading", "sentence")

    @property
    def quantifier(self) -> str:
        return self.raw.get("quantifier", "all")

    @property
    def direction(self) -> float:
        return 1.0 if self.raw["direction"] == "increasing" else -1.0

    @property
    def policy_magnitude(self) -> bool:
        """Whether a magnitude the policy chose decides it (a word's threshold, a trend's tolerance), as
        opposed to a number the sentence quotes ("by 7.2%"), which is the claim itself."""
        return self.kind in ("trend", "gap_trend") or (self.rule.threshold != "X" and self.threshold > 0)

    @property
    def threshold_bearing(self) -> bool:
        """Whether a magnitude of the policy decides it: a threshold > 0, or a trend's tolerance."""
        return self.kind in ("trend", "gap_trend") or self.threshold > 0


def _check(claim: Claim) -> None:
    table = load_paper_table(claim.table)
    rows, columns = set(table.rows), set(table.columns)

    def need(labels, allowed, what):
        bad = [x for x in labels if x not in allowed]
        if bad:
            raise ClaimError(f"claim {claim.id}: {what} {bad} not in {claim.table}")

    if claim.kind not in KINDS:
        raise ClaimError(f"claim {claim.id}: kind {claim.kind!r} is not one of {KINDS}")
    if "min_gap" in claim.raw:
        raise ClaimError(f"claim {claim.id}: min_gap is gone; name the sentence's word (word:) and the "
                         "policy gives the threshold (policy.yaml)")
    try:
        rule = claim.rule
        claim.threshold  # noqa: B018 (validates x against the word)
    except ValueError as error:
        raise ClaimError(f"claim {claim.id}: {error}") from None
    if rule.kind != claim.kind:
        raise ClaimError(f"claim {claim.id}: word {claim.word!r} is a {rule.kind} word, the claim a {claim.kind}")
    if claim.raw.get("better", "higher") not in ("higher", "lower"):
        raise ClaimError(f"claim {claim.id}: better must be higher or lower")
    if claim.reading not in READINGS or claim.quantifier not in QUANTIFIERS:
        raise ClaimError(f"claim {claim.id}: reading must be one of {READINGS}, quantifier one of {QUANTIFIERS}")
    if claim.kind in ("gap", "drop", "gap_trend"):
        need([claim.subject, *claim.against], rows, "rows")
    if claim.kind == "gap":
        need(claim.columns, columns, "columns")
    elif claim.kind == "drop":
        if not all(isinstance(p, list) and len(p) == 2 for p in claim.pairs):
            raise ClaimError(f"claim {claim.id}: pairs must be [from, to] column pairs")
        need([c for pair in claim.pairs for c in pair], columns, "columns")
    elif claim.kind == "gap_trend":
        need(claim.order, columns, "columns")
    else:
        along_rows = claim.raw.get("along", "columns") == "rows"
        need(claim.order, rows if along_rows else columns, "order labels")
        need(claim.for_each, columns if along_rows else rows, "for_each labels")
    if claim.kind in ("trend", "gap_trend") and claim.raw.get("direction") not in ("increasing", "decreasing"):
        raise ClaimError(f"claim {claim.id}: direction must be increasing or decreasing")


@cache
def load_claims() -> tuple[Claim, ...]:
    out: list[Claim] = []
    for path in sorted(CLAIMS_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for raw in doc["claims"]:
            if "word" not in raw:
                raise ClaimError(f"{path}: claim {raw.get('id')} names no word (word:, see policy.yaml)")
            claim = Claim(id=raw["id"], paper=doc["paper"], section=str(raw.get("section", "")),
                          quote=raw["quote"], statement=raw["statement"], kind=raw["kind"], table=raw["table"],
                          word=raw["word"], raw=raw)
            _check(claim)
            out.append(claim)
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):
        raise ClaimError(f"duplicate claim ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(sorted(out, key=lambda c: (PAPER_ORDER.index(c.paper) if c.paper in PAPER_ORDER else 9, c.id)))


# ------------------------------------------------------------------ where the numbers come from
class CellSource(Protocol):
    """The numbers of a table's cells: the paper's printed ones, or ours per seed."""

    point: bool      # True: one printed number per cell, compared as points at the printed precision
    decimals: int    # the paper's printed precision

    def values(self, row: str, column: str) -> dict[int, float] | None:
        """seed -> value (the paper: {0: printed value}); None where the cell has no number."""


@dataclass
class PaperSource:
    table: PaperTable
    point: bool = True

    @property
    def decimals(self) -> int:
        return self.table.decimals

    def values(self, row: str, column: str) -> dict[int, float] | None:
        value = self.table.value(row, column)
        return None if value is None else {0: value}


@dataclass
class OursSource:
    cells: dict[tuple[str, str], OurCell]
    decimals: int
    point: bool = False

    def values(self, row: str, column: str) -> dict[int, float] | None:
        cell = self.cells[(row, column)]
        return dict(cell.seeds) if cell.seeds else None


def combined_effect(source: CellSource, terms: list[tuple[float, dict[int, float]]]) -> Effect | None:
    """The effect Σ coefficient · cell, paired per seed (seeds every cell has), or a printed point."""
    if source.point:
        return point_effect(sum(c * v[0] for c, v in terms), source.decimals)
    common = set.intersection(*(set(v) for _, v in terms))
    if not common:
        return None
    return paired_effect([sum(c * v[k] for c, v in terms) for k in sorted(common)])


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


# ------------------------------------------------------------------ combining verdicts
def conjunction(verdicts: list[str]) -> str:
    """Every judgement must hold (one part of a claim: a column against each baseline, a trend line)."""
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    return REPRODUCED if all(v == REPRODUCED for v in verdicts) else INCONCLUSIVE


def combine_parts(verdicts: list[str], quantifier: str = "all") -> str:
    """A claim's verdict from its parts (columns or lines) under the sentence's quantifier.

    all: every part reproduced → reproduced; every part not reproduced → not reproduced; every part
    inconclusive → inconclusive; some reproduced but not all → partly; none reproduced, some not
    reproduced → not reproduced (the claim needs every part). most: reproduced when more than half
    the parts are; not reproduced when at least half are not; else inconclusive.
    """
    run = [v for v in verdicts if v != NOT_RUN]
    if not run:
        return NOT_RUN
    if quantifier == "most":
        if run.count(REPRODUCED) > len(run) / 2:
            return REPRODUCED
        return NOT_REPRODUCED if run.count(NOT_REPRODUCED) >= len(run) / 2 else INCONCLUSIVE
    if len(set(run)) == 1:
        return run[0]
    if REPRODUCED in run or PARTLY in run:
        return PARTLY
    return NOT_REPRODUCED if NOT_REPRODUCED in run else INCONCLUSIVE


def combine_protocols(verdicts: list[str]) -> str:
    """A claim's overall verdict from its protocols: the conclusive ones when they agree, else partly
    (the verdict hangs on a choice the paper leaves silent). Inconclusive protocols (one seed, wide
    intervals) decide nothing; with no conclusive protocol the claim is inconclusive."""
    run = [v for v in verdicts if v != NOT_RUN]
    if not run:
        return NOT_RUN
    conclusive = [v for v in run if v != INCONCLUSIVE]
    if not conclusive:
        return INCONCLUSIVE
    return conclusive[0] if len(set(conclusive)) == 1 else PARTLY


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
    """One column (or pair) of a gap/drop claim: the subject against every baseline there."""
    judged = {}
    for baseline, terms in baseline_terms.items():
        effect = combined_effect(source, [*subject_terms, *terms])
        if effect is not None:
            judged[baseline] = (effect, judge(effect, threshold, claim.rule.ties_hold))
    if not judged:
        return None
    verdict = conjunction([v for _, v in judged.values()])
    if verdict == NOT_REPRODUCED:  # show the clearest failure
        deciding = min((b for b, (_, v) in judged.items() if v == NOT_REPRODUCED), key=lambda b: judged[b][0].mean)
    else:  # show the closest call: the lowest lower bound
        deciding = min(judged, key=lambda b: (judged[b][0].low if judged[b][0].low is not None
                                              else judged[b][0].mean))
    return {"label": label, "verdict": verdict, "vs": deciding, "effect": _effect_record(judged[deciding][0]),
            "baselines": {b: {"verdict": v, **_effect_record(e)} for b, (e, v) in judged.items()}}


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
            parts.append(part)
    verdict = combine_parts([p["verdict"] for p in parts], claim.quantifier)
    out = {"verdict": verdict, "parts": parts, "within_tolerance": False}
    if parts and len(parts) < total:
        out["detail"] = f"{len(parts)} of {total} columns run"
    return out


def _line_cells(claim: Claim, line: str) -> list[tuple[str, str]]:
    if claim.raw.get("along", "columns") == "rows":
        return [(o, line) for o in claim.order]
    return [(line, o) for o in claim.order]


def _gap_series(claim: Claim, source: CellSource) -> list[list[tuple[float, dict]]] | None:
    """gap_trend: per column, the terms of sign · (subject − best baseline), the best by mean."""
    series = []
    for column in claim.order:
        subject = source.values(claim.subject, column)
        baselines = {b: v for b in claim.against if (v := source.values(b, column)) is not None}
        if subject is None or not baselines:
            return None
        best = max(baselines, key=lambda b: claim.sign * _mean(baselines[b]))
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
    points = [sum(c * _mean(v) for c, v in terms) for terms in series]
    return {"label": label, "verdict": verdict, "strict": strict, "series": points, "direction": direction,
            "net": _effect_record(net), "step_verdicts": step_verdicts,
            "steps": [_effect_record(s) for s in steps], "worst_step": worst,
            "within_tolerance": verdict == REPRODUCED and strict != REPRODUCED}


def _evaluate_trend(claim: Claim, source: CellSource, factor: float) -> dict:
    if claim.kind == "gap_trend":
        candidates = [("gap", _gap_series(claim, source))]
    else:
        candidates = []
        for line in claim.for_each:
            values = [source.values(r, c) for r, c in _line_cells(claim, line)]
            candidates.append((line, None if any(v is None for v in values) else [[(1.0, v)] for v in values]))
    lines = [judged for label, series in candidates if series is not None
             and (judged := _judge_line(claim, source, series, factor, label)) is not None]
    verdict = combine_parts([line["verdict"] for line in lines], claim.quantifier)
    out = {"verdict": verdict, "lines": lines, "within_tolerance": any(line["within_tolerance"] for line in lines),
           "strict": combine_parts([line["strict"] for line in lines], claim.quantifier)}
    if lines and len(lines) < len(candidates):
        out["detail"] = f"{len(lines)} of {len(candidates)} lines run"
    return out


def _effect_record(effect: Effect) -> dict:
    return {"mean": effect.mean, "low": effect.low, "high": effect.high, "n": None if effect.point else effect.n}


def _effect_from(record: dict) -> Effect:
    return Effect(record["mean"], record["low"], record["high"], record["n"] or 1, record["n"] is None)


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
                     cells: dict | None = None, factor: float = 1.0) -> dict:
    layout = load_layouts()[claim.table]
    cells = our_cells(params, layout, protocol, root) if cells is None else cells
    source = OursSource(cells, layout.table.decimals)
    result = evaluate(claim, source, factor)
    used = _claim_cells(claim)
    result["suites"] = sorted({cells[k].spec.suite for k in used if cells[k].n and cells[k].spec.suite})
    if result["verdict"] == NOT_RUN:
        reasons = sorted({cells[k].not_run or "diverged" for k in used if not cells[k].n})
        more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        result["reason"] = "; ".join(reasons[:3]) + more
    return result


def _claim_cells(claim: Claim) -> list[tuple[str, str]]:
    if claim.kind == "gap":
        return [(r, c) for c in claim.columns for r in (claim.subject, *claim.against)]
    if claim.kind == "drop":
        return [(r, c) for pair in claim.pairs for c in pair for r in (claim.subject, *claim.against)]
    if claim.kind == "gap_trend":
        return [(r, c) for c in claim.order for r in (claim.subject, *claim.against)]
    return [cell for line in claim.for_each for cell in _line_cells(claim, line)]


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
            "metric": layout.metric, "verdict": verdict, "effect": _effect_record(effect),
            "places": decimals_for(_mean(mine), layout.table.decimals), "claims": []}


# ------------------------------------------------------------------ the whole ledger
def evaluate_all(params: Params, root: Path = Path(".")) -> list[dict]:
    records = []
    cells_cache: dict[tuple[str, str | None], dict] = {}

    def cells_of(table: str, protocol: str | None) -> dict:
        if (table, protocol) not in cells_cache:
            cells_cache[(table, protocol)] = our_cells(params, load_layouts()[table], protocol, root)
        return cells_cache[(table, protocol)]

    policy = load_policy()
    for claim in load_claims():
        layout = load_layouts()[claim.table]
        protocols = {protocol_label(p): evaluate_on_ours(claim, params, p, root, cells_of(claim.table, p))
                     for p in (None, *layout.protocols)}
        paper = paper_status(claim)
        record = {
            "id": claim.id, "paper": claim.paper, "section": claim.section, "table": claim.table,
            "statement": claim.statement, "quote": claim.quote, "kind": claim.kind, "word": claim.word,
            "rule": claim.rule.rule, "threshold": claim.threshold, "ties_hold": claim.rule.ties_hold,
            "quantifier": claim.quantifier, "reading": claim.reading, "reading_note": claim.raw.get("reading_note"),
            "better": claim.raw.get("better", "higher"), "metric": layout.metric,
            "decimals": layout.table.decimals, "paper_note": claim.raw.get("paper_note"),
            "on_paper": paper, "ours": protocols,
            "verdict": combine_protocols([r["verdict"] for r in protocols.values()]),
        }
        if claim.threshold_bearing:
            main_cells = cells_of(claim.table, None)
            record["threshold_sensitivity"] = {
                str(f): {"paper": evaluate(claim, PaperSource(layout.table), f)["verdict"],
                         "ours": evaluate_on_ours(claim, params, None, root, main_cells, f)["verdict"]}
                for f in policy.sensitivity}
        records.append(record)
    return records


# ------------------------------------------------------------------ the ledger page
def _places(result: dict, floor: int) -> int:
    """Print a claim's numbers at the precision of the values compared (at least the paper's)."""
    numbers = [p["effect"]["mean"] for p in result.get("parts", [])]
    numbers += [v for line in result.get("lines", []) for v in line["series"]]
    magnitude = max((abs(v) for v in numbers if v), default=None)
    return decimals_for(magnitude, floor) if magnitude else floor


def _raw(record: dict, direction: float) -> Effect:
    """An effect signed for the claimed direction, back in raw units (a decrease prints negative)."""
    effect = _effect_from(record)
    if direction > 0:
        return effect
    low, high = (None, None) if effect.low is None else (-effect.high, -effect.low)
    return Effect(-effect.mean, low, high, effect.n, effect.point)


def _mark(verdict: str, paper: bool) -> str:
    if verdict == REPRODUCED:
        return ""
    return " (fails)" if paper else f" ({verdict})"


def _part_text(part: dict, places: int, paper: bool) -> str:
    effect = fmt_effect(_effect_from(part["effect"]), places)
    return f"{part['label']}: {effect} vs {part['vs']}{_mark(part['verdict'], paper)}"


def _line_text(line: dict, places: int, paper: bool) -> str:
    series = " → ".join(f"{v:.{places}f}" for v in line["series"])
    net = fmt_effect(_raw(line["net"], line["direction"]), places)
    text = f"{line['label']}: {series}"
    if not paper:
        text += f"; net {net}"
    worst = line["worst_step"]
    if len(line["steps"]) > 1 and (line["steps"][worst]["mean"] <= 0 or line["step_verdicts"][worst] != REPRODUCED):
        text += f"; step most against the trend {fmt_effect(_raw(line['steps'][worst], line['direction']), places)}"
    if line["within_tolerance"]:
        return text + " (within the tolerance)"
    return text + _mark(line["verdict"], paper)


def result_text(result: dict, floor: int, paper: bool = False) -> str:
    """The evidence of a verdict: each column's effect (with its interval on our runs) or each line's
    points, net change and the step most against the trend; what is not run, and why."""
    if result["verdict"] == NOT_RUN:
        return f"not run: {result.get('reason', 'no cell of this claim has our numbers')}"
    # the paper's differences are exact at its printed precision; ours print at 3 significant digits or more
    places = floor if paper else _places(result, floor)
    if "parts" in result:
        text = "; ".join(_part_text(p, places, paper) for p in result["parts"])
    else:
        text = "; ".join(_line_text(line, places, paper) for line in result["lines"])
        if result["lines"]:
            text += f" — strict reading (every step in the direction): {_paper_word(result['strict'], paper)}"
    return text + (f" ({result['detail']})" if result.get("detail") else "")


def _paper_word(verdict: str, paper: bool) -> str:
    if not paper:
        return verdict
    return {REPRODUCED: "holds", PARTLY: "fails in part", NOT_REPRODUCED: "fails"}.get(verdict, verdict)


def _paper_cell(record: dict) -> str:
    paper = record["on_paper"]
    status = paper["status"]
    return f"**{status}**: {result_text(paper, record['decimals'], paper=True)}"


def _headline(records: list[dict]) -> list[str]:
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    by_paper: dict[str, dict[str, int]] = {}
    for r in records:
        by_paper.setdefault(r["paper"], {v: 0 for v in VERDICTS})[r["verdict"]] += 1
    lines = [f"**{len(records)} claims: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".**", "",
             "| paper | claims | " + " | ".join(VERDICTS) + " |", "|---|---|" + "---|" * len(VERDICTS)]
    for paper, c in by_paper.items():
        lines.append(f"| {paper} | {sum(c.values())} | " + " | ".join(str(c[v]) for v in VERDICTS) + " |")
    return lines


def paper_causes(records: list[dict]) -> dict[str, list[str]]:
    return {status: [r["id"] for r in records if r["on_paper"]["status"] == status] for status in PAPER_STATUSES}


def _paper_headline(records: list[dict]) -> list[str]:
    causes = paper_causes(records)
    tolerance = load_policy().trend_tolerance
    parts = [f"{len(causes[HOLDS])} hold",
             f"{len(causes[WITHIN_TOLERANCE])} hold within the stated tolerance (a trend reversal of at most "
             f"{tolerance:g} point: {', '.join(causes[WITHIN_TOLERANCE]) or 'none'})",
             f"{len(causes[DEPENDS])} depend on the threshold (they fail at the threshold or trend tolerance the "
             f"policy chose and hold at half or double it: {', '.join(causes[DEPENDS]) or 'none'})",
             f"{len(causes[CONTRADICTED])} are contradicted by the paper's own table "
             f"({', '.join(causes[CONTRADICTED]) or 'none'})"]
    if causes[STRICTER]:
        parts.append(f"{len(causes[STRICTER])} fail only in a stricter reading than the sentence, kept for "
                     f"information ({', '.join(causes[STRICTER])})")
    return [f"**On the papers' own numbers**, of {len(records)} claims: " + "; ".join(parts) + "."]


def summary_markdown(records: list[dict], proxies: dict | None = None) -> str:
    """The ledger's headline: verdicts on our runs per paper, the paper's own numbers by cause, and
    what the offline proxies show. README.md and docs/reproducing-papers.md carry it verbatim (a
    test compares them with results/claims.json)."""
    lines = [*_headline(records), "", *_paper_headline(records)]
    by_claim: dict[str, list[str]] = {}
    for entry in (proxies or {}).get("claims", []):
        by_claim.setdefault(entry["claim"], []).append(entry["verdict"])
    if by_claim:
        every = sum(all(v == REPRODUCED for v in vs) for vs in by_claim.values())
        against = sum(NOT_REPRODUCED in vs for vs in by_claim.values())
        settings = len({(p["suite"], p["dataset"], p["partition"]) for p in proxies["pairs"]})
        lines += ["", f"**Offline proxies** (the direction only, on {settings} offline settings, never the paper's "
                  f"verdict): of {len(by_claim)} gap claims, the direction is reproduced on every setting for "
                  f"{every}, not reproduced on at least one for {against}, and inconclusive elsewhere for "
                  f"{len(by_claim) - every - against}."]
    return "\n".join(lines)


def render_policy() -> str:
    """The policy table, as the ledger prints it and docs/reproducing-papers.md carries it."""
    policy = load_policy()
    lines = ["| word (the papers' phrases) | kind | threshold | a tie | rule |", "|---|---|---|---|---|"]
    for rule in policy.words.values():
        phrases = ", ".join(f"“{p}”" for p in rule.papers)
        threshold = ("—" if rule.threshold is None
                     else "X (quoted)" if rule.threshold == "X" else f"{rule.threshold:g}")
        ties = "—" if rule.threshold is None else ("holds" if rule.ties_hold else "fails")
        lines.append(f"| **{rule.word}** ({phrases}) | {rule.kind} | {threshold} | {ties} | {rule.rule} |")
    factors = " and ".join(f"{f:g}×" for f in policy.sensitivity)
    lines += ["", f"- **Interval**: {policy.level:.0%} Student-t over the seeds. {policy.interval_note}",
              f"- **Verdicts**: *reproduced* when the interval lies on the claimed side of the threshold, *not "
              "reproduced* when it lies entirely on the other side, *inconclusive* when it straddles it (or one "
              "seed). A claim needs every baseline in each column; its columns or lines combine to *partly* when "
              "some but not all are reproduced. Across protocols, inconclusive ones decide nothing and conclusive "
              "ones that disagree give *partly*.",
              f"- **Trends**: net change in the stated direction and no step against it by more than "
              f"{policy.trend_tolerance:g} point (the trend tolerance); strict monotonicity is the named reading "
              "*strict*, shown beside it.",
              "- **Quantifiers**: " + "; ".join(f"*{k}*: {v}" for k, v in policy.quantifiers.items()) + ".",
              f"- **Threshold sensitivity**: every threshold-bearing claim is judged again at {factors} its "
              "threshold and trend tolerance.",
              "- **Proxies** judge the direction only (ahead: > 0) with the same interval rule; the paper's thresholds "
              "do not carry over to another setting."]
    return "\n".join(lines)


def render_ledger(records: list[dict], proxies: dict | None = None) -> str:
    proxies = proxies or {}
    lines = ["# Claims ledger: does each paper reproduce?", "", summary_markdown(records, proxies), "",
             "Each claim is a sentence of a paper's experiment section written as a checkable statement over the "
             "paper's own table (`src/fedskew/reproduce/claims/`), with the word of the sentence that sets its "
             "threshold. *Paper* evaluates it on the paper's printed numbers; *fedskew* on ours, in the table's "
             "layout (`results/papers/<table>.md`), under the main protocol and every sensitivity protocol, each "
             "effect as mean [95 % t-interval] of the paired per-seed differences. Proxies test the direction of a "
             "gap claim on offline data and never stand in for the paper's setting.", "",
             "## The policy", "",
             "One rule per word, the same in all four papers (`src/fedskew/reproduce/policy.yaml`).",
             "", render_policy(), ""]
    for paper in dict.fromkeys(r["paper"] for r in records):
        mine = [r for r in records if r["paper"] == paper]
        lines += _paper_section(paper, mine)
        lines += _protocol_section(paper, mine)
        lines += _sensitivity_section(paper, mine)
        lines += _proxy_section(paper, proxies, {r["id"] for r in mine})
        notes = [r for r in mine if r["paper_note"] or r["reading_note"]]
        if notes:
            lines += [f"### {paper}: notes on readings and on the paper's own numbers", ""]
            for r in notes:
                text = " ".join(t for t in (r["reading_note"], r["paper_note"]) if t)
                lines.append(f"- **{r['id']}**: {text}")
            lines.append("")
    return "\n".join(lines)


def _reading_tag(record: dict) -> str:
    return "" if record["reading"] == "sentence" else f" *({record['reading']} reading)*"


def _paper_section(paper: str, records: list[dict]) -> list[str]:
    lines = [f"## {paper}", "", "| claim | word | statement | paper | fedskew (main protocol) | verdict |",
             "|---|---|---|---|---|---|"]
    for r in records:
        main, *others = r["ours"].values()
        ours = f"{main['verdict']} — {result_text(main, r['decimals'])}"
        tested_by = sorted({suite for o in r["ours"].values() for suite in o.get("suites", [])})
        if tested_by:
            ours += f"<br>suites: {', '.join(f'`{suite}`' for suite in tested_by)}"
        covered = [o["verdict"] for o in others if o["verdict"] != NOT_RUN]
        if covered:
            tally = ", ".join(f"{covered.count(v)} {v}" for v in VERDICTS if v in covered)
            ours += f"<br>*other protocols ({len(covered)}): {tally}* (below)"
        word = r["word"] + (f" {r['threshold']:g}" if r["word"] == "by X %" else "")
        lines.append(f"| {r['id']} ({r['table']}) | {word} | {r['statement']}{_reading_tag(r)} | {_paper_cell(r)} "
                     f"| {ours} | **{r['verdict']}** |")
    return lines + [""]


def _protocol_section(paper: str, records: list[dict]) -> list[str]:
    sensitive = [r for r in records if any(o["verdict"] != NOT_RUN for o in list(r["ours"].values())[1:])]
    if not sensitive:
        return []
    lines = [f"### {paper}: each claim under every protocol the paper leaves open", "",
             "| claim | protocol | verdict | fedskew |", "|---|---|---|---|"]
    for r in sensitive:
        for label, result in r["ours"].items():
            if result["verdict"] != NOT_RUN:
                lines.append(f"| {r['id']} | {label} | {result['verdict']} | {result_text(result, r['decimals'])} |")
    return lines + [""]


def _sensitivity_section(paper: str, records: list[dict]) -> list[str]:
    bearing = [r for r in records if "threshold_sensitivity" in r]
    if not bearing:
        return []
    factors = list(bearing[0]["threshold_sensitivity"])
    head = " | ".join(f"at {float(f):g}×" for f in factors)
    lines = [f"### {paper}: does the verdict change at half or double the threshold?", "",
             "The threshold (and, for a trend, the tolerance) scaled; paper / fedskew (main protocol). *Changes*: "
             "where either verdict differs from the one at the policy's own value.", "",
             f"| claim | word | threshold | tolerance | at 1× | {head} | changes |",
             "|---|---|---|---|---|" + "---|" * len(factors) + "---|"]
    tolerance = load_policy().trend_tolerance
    for r in bearing:
        paper_one, ours_one = r["on_paper"]["verdict"], r["ours"]["main protocol"]["verdict"]
        at_one = f"{_paper_word(paper_one, True)} / {ours_one}"
        scaled = [f"{_paper_word(s['paper'], True)} / {s['ours']}" for s in r["threshold_sensitivity"].values()]
        changes = [f"{float(f):g}×" + (" paper" if s["paper"] != paper_one else "")
                   + (" fedskew" if s["ours"] != ours_one else "")
                   for f, s in r["threshold_sensitivity"].items() if s["paper"] != paper_one or s["ours"] != ours_one]
        tol = f"{tolerance:g}" if r["kind"] in ("trend", "gap_trend") else "—"
        lines.append(f"| {r['id']} | {r['word']} | {r['threshold']:g} | {tol} | {at_one} | " + " | ".join(scaled)
                     + f" | {', '.join(changes) or 'no'} |")
    return lines + [""]


def _proxy_section(paper: str, proxies: dict, ids: set[str]) -> list[str]:
    pairs = [p for p in proxies.get("pairs", []) if ids & set(p["claims"])]
    if not pairs:
        return []
    lines = [f"### {paper}: offline proxies (direction only)", "",
             "Each row is one comparison on the setting it ran on, listed once, with every claim of this paper "
             "whose direction it tests. Effect: method − baseline (for a loss, baseline − method), mean [95 % "
             "t-interval] of the paired per-seed differences; *reproduced* = ahead.", "",
             "| proxy setting | method vs baseline | effect | direction | claims |", "|---|---|---|---|---|"]
    for p in pairs:
        loss = " (loss: lower is better)" if p["better"] == "lower" else ""
        claims = ", ".join(c for c in p["claims"] if c in ids)
        lines.append(f"| {p['setting']} | `{p['subject']}` vs `{p['against']}`{loss} "
                     f"| {fmt_effect(_effect_from(p['effect']), p['places'])} | {p['verdict']} | {claims} |")
    verdicts = [v for v in proxies.get("claims", []) if v["claim"] in ids]
    lines += ["", "Each claim's direction on each setting needs every baseline it names that ran there:", "",
              "| claim | proxy setting | direction | baselines (not run there) |", "|---|---|---|---|"]
    for v in verdicts:
        missing = f" (without {', '.join(v['baselines_missing'])})" if v["baselines_missing"] else ""
        lines.append(f"| {v['claim']} | {v['setting']} | {v['verdict']} | "
                     f"{', '.join(f'`{m}`' for m in v['against'])}{missing} |")
    return lines + [""]


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
                    cell = read_cell(params, CellSpec(suite, dataset, partition, method), "final_acc", suites, root)
                    row[option] = cell.text()
                out.append(row)
    return out


def render_missing_classes(rows: list[dict]) -> str:
    lines = ["## Missing classes: every reading, every setting run here", "",
             "How a count-calibrated loss treats a class the client does not hold (n_c = 0): **mask** (the exact "
             "n → 0 limit, every paper's literal reading and fedskew's default), **floor** (counted as n_c = 1) or "
             "**global** (the federation's total counts, as PFLlib). Final-round accuracy %, mean ± std (n); FedAvg "
             "for reference. SCALA's option changes P_k only.", "",
             "| suite | setting | method | FedAvg | mask | floor | global |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['suite']} | {r['dataset']} / {r['partition']} | {r['method']} | {r.get('FedAvg', '—')} | "
                     f"{r.get('mask', '—')} | {r.get('floor', '—')} | {r.get('global', '—')} |")
    return "\n".join(lines) + "\n"


def write_ledger(params: Params, out_md: Path, out_json: Path, root: Path = Path(".")) -> list[dict]:
    from fedskew.runfiles import atomic_write_text

    records = evaluate_all(params, root)
    proxies = proxy_comparisons(params, root)
    missing = missing_class_evidence(params, root)
    atomic_write_text(out_md, render_ledger(records, proxies) + "\n" + render_missing_classes(missing))
    twin = {"policy": {"file": "src/fedskew/reproduce/policy.yaml", "table": render_policy()},
            "claims": records, "proxies": proxies, "missing_classes": missing,
            "on_paper": paper_causes(records)}
    atomic_write_text(out_json, json.dumps(twin, indent=1) + "\n")
    return records
