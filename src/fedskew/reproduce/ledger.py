"""The papers' claims ledger: the verdicts rendered as `results/claims.md`, with its twin `results/claims.json`.

The ledger takes the records of `verdicts` (the papers' claims of `claim`, judged on the papers' printed
numbers and on fedskew's runs) and of `side_evidence` (proxies, missing classes) and turns them into text: the
headline README.md and docs/reproducing-papers.md carry, the policy table, each paper's sections (claims, the
seeds that would decide the inconclusive ones, protocols, threshold sensitivity, offline proxies) and the
missing-class table; `write_ledger` computes and writes both files. What it prints as any ledger does (a
verdict's evidence, the policy, protocols, sensitivity, seeds) is `render`'s, which a researcher's own ledger
(`own_ledger`) shares.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedskew.config import Params
from fedskew.reproduce import policy
from fedskew.reproduce.claim import CONTRADICTED, DEPENDS, HOLDS, PAPER_STATUSES, STRICTER, VERDICTS, WITHIN_TOLERANCE
from fedskew.reproduce.policy import NOT_REPRODUCED, REPRODUCED, Effect
from fedskew.reproduce.render import (  # noqa: F401 (_part_text, result_text, hinge_text: read from here too)
    Wording,
    _part_text,
    hinge_text,
    hinges,
    ours_cell,
    protocol_section,
    reading_tag,
    render_policy,
    result_text,
    seeds_section,
    sensitivity_section,
    verdict_cell,
    word_text,
)
from fedskew.reproduce.side_evidence import missing_class_evidence, proxy_comparisons
from fedskew.reproduce.verdicts import evaluate_all


# ------------------------------------------------------------------ the ledger page
def _paper_cell(record: dict) -> str:
    paper = record["on_paper"]
    status = paper["status"]
    return f"**{status}**: {result_text(paper, record['decimals'], Wording.PAPER)}"


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
    tolerance = policy.load_policy().trend_tolerance
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
        lines += seeds_section(f"### {paper}: the seeds that would decide each inconclusive claim", mine)
        lines += protocol_section(f"### {paper}: each claim under every protocol the paper leaves open", mine)
        lines += sensitivity_section(f"### {paper}: does the verdict change at half or double the threshold?", mine)
        lines += _proxy_section(paper, proxies, {r["id"] for r in mine})
        notes = [r for r in mine if r["paper_note"] or r["reading_note"]]
        if notes:
            lines += [f"### {paper}: notes on readings and on the paper's own numbers", ""]
            for r in notes:
                text = " ".join(t for t in (r["reading_note"], r["paper_note"]) if t)
                lines.append(f"- **{r['id']}**: {text}")
            lines.append("")
    return "\n".join(lines)


def _paper_section(paper: str, records: list[dict]) -> list[str]:
    lines = [f"## {paper}", "", "| claim | word | statement | paper | fedskew (main protocol) | verdict |",
             "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['id']} ({r['table']}) | {word_text(r)} | {r['statement']}{reading_tag(r)} | "
                     f"{_paper_cell(r)} | {ours_cell(r)} | {verdict_cell(r)} |")
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
                     f"| {policy.fmt_effect(Effect.from_record(p['effect']), p['places'])} | {p['verdict']} | {claims} |")
    verdicts = [v for v in proxies.get("claims", []) if v["claim"] in ids]
    lines += ["", "Each claim's direction on each setting needs every baseline it names that ran there:", "",
              "| claim | proxy setting | direction | baselines (not run there) |", "|---|---|---|---|"]
    for v in verdicts:
        missing = f" (without {', '.join(v['baselines_missing'])})" if v["baselines_missing"] else ""
        lines.append(f"| {v['claim']} | {v['setting']} | {v['verdict']} | "
                     f"{', '.join(f'`{m}`' for m in v['against'])}{missing} |")
    return lines + [""]


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
            "on_paper": paper_causes(records),
            "hangs_on": {r["id"]: hinges(r) for r in records if hinges(r)}}
    atomic_write_text(out_json, json.dumps(twin, indent=1, allow_nan=False) + "\n")
    return records
