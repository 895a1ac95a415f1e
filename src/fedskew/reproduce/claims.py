"""The claims ledger: each headline claim of each paper as a checkable statement, with a verdict.

Claims live in `claims/<paper>.yaml`, written over the paper's own tables (row and column
labels of `papers/<id>.yaml`), so the same claim is evaluated on the paper's numbers (a
check of the transcription and of the paper itself) and on ours (through the table's
layout). Three kinds:

- `gap`: value(subject) − max(value(against)) ≥ `min_gap` in each of `columns` (`better:
  lower` for a loss: max(...) becomes min(...) and the sign flips);
- `trend`: along `order` (columns or rows, `along`), every line of `for_each` moves in
  `direction` (increasing / decreasing);
- `gap_trend`: the gap of `subject` over the best of `against` moves in `direction` along
  `order` (columns).

Verdicts, per protocol (the table's main protocol and each sensitivity protocol):

- gap: **reproduced** if the threshold holds in every column run here; **not reproduced**
  if ours is not ahead (effect ≤ 0) in any; **partly** otherwise (ahead, but short of the
  threshold or not in every column). Effects are paired per seed (same partition and
  initial model), mean ± std over seeds.
- trend / gap_trend: **reproduced** if every line is monotone in the stated direction;
  **not reproduced** if no line ends (last vs first) in that direction; **partly** otherwise.
- **not run here** when no cell of the claim has our numbers (the reason is given).

A claim's overall verdict is its verdict under every protocol when they agree, else
**partly** (it depends on a choice the paper leaves silent); the ledger shows each.
Proxies (offline settings in the layout) test the *direction* of gap claims only and are
reported apart, never as the paper's setting.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from fedskew.config import Params
from fedskew.reproduce.layouts import CellSpec, load_layouts
from fedskew.reproduce.paper_tables import load_paper_table
from fedskew.reproduce.tables import OurCell, our_cells, protocol_label, read_cell

CLAIMS_DIR = Path(__file__).parent / "claims"
KINDS = ("gap", "trend", "gap_trend")
VERDICTS = ("reproduced", "partly", "not reproduced", "not run here")
PAPER_ORDER = ("FedLC", "SCALA", "FedED", "FL-FCR")


class ClaimError(ValueError):
    """A claim that does not fit its table."""


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    section: str
    quote: str
    statement: str
    kind: str
    table: str
    raw: dict

    def __getattr__(self, name):  # the kind-specific fields (subject, against, columns, ...)
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def sign(self) -> float:
        return -1.0 if self.raw.get("better", "higher") == "lower" else 1.0


def _check(claim: Claim) -> None:
    table = load_paper_table(claim.table)
    rows, columns = set(table.rows), set(table.columns)

    def need(labels, allowed, what):
        bad = [x for x in labels if x not in allowed]
        if bad:
            raise ClaimError(f"claim {claim.id}: {what} {bad} not in {claim.table}")

    if claim.kind not in KINDS:
        raise ClaimError(f"claim {claim.id}: kind {claim.kind!r} is not one of {KINDS}")
    if claim.raw.get("better", "higher") not in ("higher", "lower"):
        raise ClaimError(f"claim {claim.id}: better must be higher or lower")
    if claim.kind in ("gap", "gap_trend"):
        need([claim.subject, *claim.against], rows, "rows")
    if claim.kind == "gap":
        need(claim.columns, columns, "columns")
        float(claim.min_gap)
    elif claim.kind == "gap_trend":
        need(claim.order, columns, "columns")
    else:
        along_rows = claim.along == "rows"
        need(claim.order, rows if along_rows else columns, "order labels")
        need(claim.for_each, columns if along_rows else rows, "for_each labels")
    if claim.kind != "gap" and claim.direction not in ("increasing", "decreasing"):
        raise ClaimError(f"claim {claim.id}: direction must be increasing or decreasing")


@cache
def load_claims() -> tuple[Claim, ...]:
    out: list[Claim] = []
    for path in sorted(CLAIMS_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for raw in doc["claims"]:
            claim = Claim(id=raw["id"], paper=doc["paper"], section=str(raw.get("section", "")),
                          quote=raw["quote"], statement=raw["statement"], kind=raw["kind"], table=raw["table"],
                          raw=raw)
            _check(claim)
            out.append(claim)
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):
        raise ClaimError(f"duplicate claim ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(sorted(out, key=lambda c: (PAPER_ORDER.index(c.paper) if c.paper in PAPER_ORDER else 9, c.id)))


# ------------------------------------------------------------------ evaluation on any numbers
def _series_verdict(lines: list[list[float]], increasing: bool) -> tuple[str, str]:
    """trend / gap_trend: every line monotone → reproduced; none ends in the direction → not reproduced."""
    sign = 1 if increasing else -1
    monotone = [all(sign * (b - a) > 0 for a, b in zip(line, line[1:])) for line in lines]
    net = [sign * (line[-1] - line[0]) > 0 for line in lines]
    detail = f"{sum(monotone)} of {len(lines)} monotone, {sum(net)} of {len(lines)} net in the stated direction"
    if all(monotone):
        return "reproduced", detail
    if not any(net):
        return "not reproduced", detail
    return "partly", detail


def evaluate_on_paper(claim: Claim) -> dict:
    """The claim on the paper's own numbers: does the paper's table support its text?"""
    table = load_paper_table(claim.table)

    def value(r, c):
        v = table.value(r, c)
        return None if v is None else claim.sign * v

    return _evaluate(claim, value, lambda r, c: None)


def _evaluate(claim: Claim, value, seeds) -> dict:
    """`value(row, col)` → number (sign-adjusted) or None; `seeds(row, col)` → {seed: value} or None."""
    if claim.kind == "gap":
        effects, paired = {}, {}
        for column in claim.columns:
            subject = value(claim.subject, column)
            against = {r: value(r, column) for r in claim.against}
            against = {r: v for r, v in against.items() if v is not None}
            if subject is None or not against:
                continue
            best = max(against, key=against.get)
            effects[column] = (subject - against[best], best)
            s_seeds, b_seeds = seeds(claim.subject, column), seeds(best, column)
            if s_seeds and b_seeds:
                common = sorted(set(s_seeds) & set(b_seeds))
                paired[column] = [claim.sign * (s_seeds[k] - b_seeds[k]) for k in common]
        if not effects:
            return {"verdict": "not run here", "effects": {}}
        min_gap = float(claim.min_gap)
        # "beats" (min_gap 0) needs a strict lead: a tie does not beat.
        holds = [e > 0 if min_gap == 0 else e >= min_gap for e, _ in effects.values()]
        ahead = [e > 0 for e, _ in effects.values()]
        verdict = "reproduced" if all(holds) else "not reproduced" if not any(ahead) else "partly"
        out = {"verdict": verdict, "effects": {}}
        for column, (effect, best) in effects.items():
            entry = {"effect": effect, "best_against": best}
            if column in paired and paired[column]:
                entry["n"] = len(paired[column])
                entry["std"] = statistics.stdev(paired[column]) if len(paired[column]) > 1 else None
            out["effects"][column] = entry
        if len(effects) < len(claim.columns):
            out["detail"] = f"{len(effects)} of {len(claim.columns)} columns run"
        return out
    if claim.kind == "gap_trend":
        gaps = []
        for column in claim.order:
            subject = value(claim.subject, column)
            against = [v for v in (value(r, column) for r in claim.against) if v is not None]
            if subject is None or not against:
                return {"verdict": "not run here", "series": {}}
            gaps.append(subject - max(against))
        verdict, detail = _series_verdict([gaps], claim.direction == "increasing")
        return {"verdict": verdict, "detail": detail, "series": {"gap": gaps}}
    # trend
    lines = {}
    for line in claim.for_each:
        cells = [(o, line) if claim.along == "rows" else (line, o) for o in claim.order]
        values = [value(r, c) for r, c in cells]
        if all(v is not None for v in values):
            lines[line] = [claim.sign * v for v in values]  # undo the sign: trends are about raw values
    if not lines:
        return {"verdict": "not run here", "series": {}}
    verdict, detail = _series_verdict(list(lines.values()), claim.direction == "increasing")
    if len(lines) < len(claim.for_each):
        detail += f"; {len(lines)} of {len(claim.for_each)} lines run"
    return {"verdict": verdict, "detail": detail, "series": lines}


def evaluate_on_ours(claim: Claim, params: Params, protocol: str | None, root: Path = Path(".")) -> dict:
    layout = load_layouts()[claim.table]
    cells = our_cells(params, layout, protocol, root)

    def value(r, c):
        cell = cells[(r, c)]
        return None if cell.mean is None else claim.sign * cell.mean

    def seeds(r, c):
        return cells[(r, c)].seeds

    result = _evaluate(claim, value, seeds)
    used = _claim_cells(claim)
    result["suites"] = sorted({cells[k].spec.suite for k in used if cells[k].n and cells[k].spec.suite})
    if result["verdict"] == "not run here":
        reasons = sorted({cells[k].not_run or "diverged" for k in used if not cells[k].n})
        more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        result["reason"] = "; ".join(reasons[:3]) + more
    return result


def _claim_cells(claim: Claim) -> list[tuple[str, str]]:
    if claim.kind == "gap":
        return [(r, c) for c in claim.columns for r in (claim.subject, *claim.against)]
    if claim.kind == "gap_trend":
        return [(r, c) for c in claim.order for r in (claim.subject, *claim.against)]
    return [(o, line) if claim.along == "rows" else (line, o) for line in claim.for_each for o in claim.order]


def evaluate_proxies(claim: Claim, params: Params, root: Path = Path(".")) -> list[dict]:
    """Direction of a gap claim on each offline proxy setting of its table where its methods all ran."""
    if claim.kind != "gap":
        return []
    layout = load_layouts()[claim.table]
    suites = set(params.reproduce_suites)
    subject = layout.method_of(claim.subject)
    against = {r: layout.method_of(r) for r in claim.against}
    out = []
    for proxy in layout.proxies:
        if proxy["suite"] not in suites or subject is None:
            continue
        available = {m for cfg in params.suite_runs(proxy["suite"]) if (cfg.dataset, cfg.partition)
                     == (proxy["dataset"], proxy["partition"]) for m in [cfg.method]}
        present = {r: m for r, m in against.items() if m in available}
        if subject not in available or not present:
            continue

        def cell(method) -> OurCell:
            spec = CellSpec(proxy["suite"], proxy["dataset"], proxy["partition"], method)
            return read_cell(params, spec, layout.metric, suites, root)

        s = cell(subject)
        others = {r: cell(m) for r, m in present.items()}
        others = {r: c for r, c in others.items() if c.mean is not None}
        if s.mean is None or not others:
            continue
        best = max(others, key=lambda r: claim.sign * others[r].mean)
        common = sorted(set(s.seeds) & set(others[best].seeds))
        diffs = [claim.sign * (s.seeds[k] - others[best].seeds[k]) for k in common]
        effect = claim.sign * (s.mean - others[best].mean)
        out.append({"label": proxy["label"], "suite": proxy["suite"], "effect": effect,
                    "std": statistics.stdev(diffs) if len(diffs) > 1 else None, "n": len(diffs),
                    "best_against": best, "direction_holds": effect > 0,
                    "baselines_missing": sorted(set(claim.against) - set(present))})
    return out


def overall(verdicts: list[str]) -> str:
    run = [v for v in verdicts if v != "not run here"]
    if not run:
        return "not run here"
    return run[0] if len(set(run)) == 1 else "partly"


def evaluate_all(params: Params, root: Path = Path(".")) -> list[dict]:
    records = []
    for claim in load_claims():
        layout = load_layouts()[claim.table]
        protocols = {protocol_label(p): evaluate_on_ours(claim, params, p, root)
                     for p in (None, *layout.protocols)}
        records.append({
            "id": claim.id, "paper": claim.paper, "section": claim.section, "table": claim.table,
            "statement": claim.statement, "quote": claim.quote, "kind": claim.kind,
            "threshold": claim.raw.get("min_gap"), "paper_note": claim.raw.get("paper_note"),
            "on_paper": evaluate_on_paper(claim), "ours": protocols,
            "verdict": overall([r["verdict"] for r in protocols.values()]),
            "proxies": evaluate_proxies(claim, params, root),
        })
    return records


# ------------------------------------------------------------------ the ledger page
def _effect_text(result: dict) -> str:
    if result["verdict"] == "not run here":
        return f"not run: {result.get('reason', 'no cell of this claim has our numbers')}"
    if "effects" in result:
        parts = []
        for column, e in result["effects"].items():
            spread = f" ± {e['std']:.2f}" if e.get("std") is not None else ""
            n = f", n={e['n']}" if e.get("n") else ""
            parts.append(f"{column}: {e['effect']:+.2f}{spread} vs {e['best_against']}{n}")
        return "; ".join(parts) + (f" ({result['detail']})" if result.get("detail") else "")
    series = "; ".join(f"{k}: " + " → ".join(f"{v:.2f}" for v in vals) for k, vals in result["series"].items())
    return f"{result['detail']} — {series}"


def _paper_text(result: dict) -> str:
    if "effects" in result:
        return "; ".join(f"{c}: {e['effect']:+.2f} vs {e['best_against']}" for c, e in result["effects"].items())
    return result.get("detail", "")


def render_ledger(records: list[dict]) -> str:
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    by_paper = {}
    for r in records:
        by_paper.setdefault(r["paper"], {v: 0 for v in VERDICTS})[r["verdict"]] += 1
    contradicted = [r["id"] for r in records if r["on_paper"]["verdict"] != "reproduced"]
    lines = ["# Claims ledger: does each paper reproduce?", "",
             f"**{len(records)} claims: {counts['reproduced']} reproduced, {counts['partly']} partly, "
             f"{counts['not reproduced']} not reproduced, {counts['not run here']} not run here.**", "",
             "| paper | claims | reproduced | partly | not reproduced | not run here |", "|---|---|---|---|---|---|"]
    for paper, c in by_paper.items():
        lines.append(f"| {paper} | {sum(c.values())} | " + " | ".join(str(c[v]) for v in VERDICTS) + " |")
    lines += ["",
              "Each claim is a sentence of a paper's experiment section written as a checkable statement over "
              "the paper's own table (`src/fedskew/reproduce/claims/`). *Paper* evaluates it on the paper's "
              "printed numbers; *fedskew* on ours, in the table's layout (`results/papers/<table>.md`), under "
              "the main protocol and every sensitivity protocol; effects are paired per seed (mean ± std, n). "
              "Verdict rules are in `fedskew.reproduce.claims`. Proxies test only the direction of a gap claim "
              "on offline data and never stand in for the paper's setting.", "",
              f"{len(contradicted)} claims do not hold even on the paper's own numbers: "
              + (", ".join(contradicted) if contradicted else "none") + ".", ""]
    for paper in by_paper:
        lines += [f"## {paper}", "", "| claim | statement | paper | fedskew (main protocol) | verdict |",
                  "|---|---|---|---|---|"]
        for r in (r for r in records if r["paper"] == paper):
            main, *others = r["ours"].values()
            ours = f"{main['verdict']} — {_effect_text(main)}"
            tested_by = sorted({suite for o in r["ours"].values() for suite in o.get("suites", [])})
            if tested_by:
                ours += f"<br>suites: {', '.join(f'`{suite}`' for suite in tested_by)}"
            covered = [o["verdict"] for o in others if o["verdict"] != "not run here"]
            if covered:
                tally = ", ".join(f"{covered.count(v)} {v}" for v in VERDICTS if v in covered)
                ours += f"<br>*sensitivity ({len(covered)} other protocols): {tally}* (below)"
            paper_cell = f"{r['on_paper']['verdict']}: {_paper_text(r['on_paper'])}"
            lines.append(f"| {r['id']} ({r['table']}) | {r['statement']} | {paper_cell} | {ours} | "
                         f"**{r['verdict']}** |")
        lines.append("")
        sensitive = [r for r in records if r["paper"] == paper
                     and any(o["verdict"] != "not run here" for o in list(r["ours"].values())[1:])]
        if sensitive:
            lines += [f"### {paper}: each claim under every protocol the paper leaves open", "",
                      "| claim | protocol | verdict | fedskew |", "|---|---|---|---|"]
            for r in sensitive:
                for label, result in r["ours"].items():
                    if result["verdict"] != "not run here":
                        lines.append(f"| {r['id']} | {label} | {result['verdict']} | {_effect_text(result)} |")
            lines.append("")
        proxy_rows = [(r, p) for r in records if r["paper"] == paper for p in r["proxies"]]
        if proxy_rows:
            lines += [f"### {paper}: offline proxies (direction only)", "",
                      "| claim | proxy setting | subject − best baseline | direction |", "|---|---|---|---|"]
            for r, p in proxy_rows:
                spread = f" ± {p['std']:.2f}" if p["std"] is not None else ""
                missing = f" (without {', '.join(p['baselines_missing'])})" if p["baselines_missing"] else ""
                lines.append(f"| {r['id']} | {p['label']} | {p['effect']:+.2f}{spread} vs {p['best_against']}, "
                             f"n={p['n']}{missing} | {'holds' if p['direction_holds'] else 'fails'} |")
            lines.append("")
        notes = [r for r in records if r["paper"] == paper and r["paper_note"]]
        if notes:
            lines += [f"### {paper}: notes on the paper's own numbers", ""]
            lines += [f"- **{r['id']}**: {r['paper_note']}" for r in notes]
            lines.append("")
    return "\n".join(lines)


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
    missing = missing_class_evidence(params, root)
    atomic_write_text(out_md, render_ledger(records) + "\n" + render_missing_classes(missing))
    atomic_write_text(out_json, json.dumps({"claims": records, "missing_classes": missing}, indent=1) + "\n")
    return records
