"""A ledger of one's own: the claims of a claims file (`own_claims`) judged on its suites' runs, rendered as
`results/claims/<name>.md` with its twin `results/claims/<name>.json` (`python -m fedskew claims --file`,
`commands`).

The judging is the papers' ledger's own (`verdicts.judge_on_ours`: paired per-seed effects, 95 % t-intervals,
the one policy, every protocol, threshold sensitivity and the seeds that would decide an inconclusive claim)
and so is the wording of the evidence (`render`). What a suite's claims lack is the paper: no printed numbers
to check, no proxies, no missing-class table.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedskew import metrics
from fedskew.config import Params
from fedskew.reproduce.claim import VERDICTS
from fedskew.reproduce.own_claims import OwnClaims, ledger_path, load_own_claims
from fedskew.reproduce.render import (
    hinges,
    ours_cell,
    protocol_section,
    reading_tag,
    render_policy,
    seeds_section,
    sensitivity_section,
    verdict_cell,
    word_text,
)
from fedskew.reproduce.verdicts import CellsCache, judge_on_ours


def evaluate_own(own: OwnClaims, params: Params, root: Path = Path(".")) -> list[dict]:
    """Each claim of the file judged on its suites' runs, as the papers' ledger judges a paper's on ours."""
    cells_of = CellsCache(params, root, set(own.suites))
    records = []
    for claim in own.claims:
        layout = own.layouts[claim.id]
        ours = judge_on_ours(claim, layout, cells_of)
        record = {
            "id": claim.id, "suite": claim.table, "protocols": own.protocols[claim.id], "statement": claim.statement,
            "quote": claim.quote or None, "kind": claim.kind, "word": claim.word, "rule": claim.rule.rule,
            "threshold": claim.threshold, "ties_hold": claim.rule.ties_hold, "quantifier": claim.quantifier,
            "reading": claim.reading, "better": claim.raw.get("better", "higher"), "metric": layout.metric,
            "decimals": layout.table.decimals, "note": claim.raw.get("note"), "ours": ours["ours"],
            "verdict": ours["verdict"],
        }
        if "sensitivity" in ours:
            record["threshold_sensitivity"] = {f: {"ours": verdict} for f, verdict in ours["sensitivity"].items()}
        if "seeds_to_decide" in ours:
            record["seeds_to_decide"] = ours["seeds_to_decide"]
        records.append(record)
    return records


def _suites_text(own: OwnClaims, params: Params) -> str:
    """The suites the claims are about, and each protocol with its suite."""
    mains = list(dict.fromkeys(c.table for c in own.claims))
    protocols = {(label, suite) for named in own.protocols.values() for label, suite in named.items()}
    text = "; ".join(f"`{s}` ({params.raw['suites'][s].get('description') or 'no description'})" for s in mains)
    if protocols:
        text += ". Protocols: " + "; ".join(f"*{label}*: suite `{suite}`" for label, suite in sorted(protocols))
    return text


def render_own_ledger(own: OwnClaims, records: list[dict], params: Params) -> str:
    counts = {v: sum(r["verdict"] == v for r in records) for v in VERDICTS}
    measure = metrics.summary_key(records[0]["metric"])[0]
    lines = [f"# Claims ledger: `{own.shown}`", "",
             f"**{len(records)} claims: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".**", "",
             f"Each claim is a sentence of `{own.shown}` written as a checkable statement over a suite's grid: rows "
             f"its methods, columns its settings (`<dataset> / <partition>`), each cell the final-round "
             f"{measure.described} of every seed's run. *fedskew* judges it on those runs under the main protocol "
             "(the suite's own) and under each protocol the file names (another suite running the same grid), each "
             "effect as mean [95 % t-interval] of the paired per-seed differences; *reproduced*: the runs bear the "
             "claim out at the policy's threshold. Built by `snakemake --cores all "
             f"{ledger_path(Path(own.shown), 'md')}` (or `python -m fedskew claims --file {own.shown}`).", "",
             f"Suites: {_suites_text(own, params)}.", "",
             "## The policy", "",
             "One rule per word, the papers' ledger's own (`src/fedskew/reproduce/policy.yaml`).", "",
             render_policy(proxies=False), "",
             "## Claims", "", "| claim | word | statement | fedskew (main protocol) | verdict |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['id']} (`{r['suite']}`) | {word_text(r)} | {r['statement']}{reading_tag(r)} | "
                     f"{ours_cell(r)} | {verdict_cell(r)} |")
    lines.append("")
    lines += seeds_section("## The seeds that would decide each inconclusive claim", records)
    lines += protocol_section("## Each claim under every protocol", records)
    lines += sensitivity_section("## Does the verdict change at half or double the threshold?", records)
    notes = [r for r in records if r["note"]]
    if notes:
        lines += ["## Notes", "", *(f"- **{r['id']}**: {r['note']}" for r in notes), ""]
    return "\n".join(lines)


def write_own_ledger(params: Params, claims_file: Path, root: Path = Path(".")) -> tuple[list[dict], Path]:
    """Check the claims file, judge its claims and write its ledger and JSON twin (nothing when the file does not
    fit: `load_own_claims` says why)."""
    from fedskew.runfiles import atomic_write_text

    own = load_own_claims(claims_file, params)
    records = evaluate_own(own, params, root)
    page = render_own_ledger(own, records, params) + "\n"
    twin = {"file": own.shown, "policy": {"file": "src/fedskew/reproduce/policy.yaml",
                                          "table": render_policy(proxies=False)},
            "suites": own.suites, "claims": records, "hangs_on": {r["id"]: hinges(r) for r in records if hinges(r)}}
    md = root / ledger_path(claims_file, "md")
    atomic_write_text(md, page)
    atomic_write_text(root / ledger_path(claims_file, "json"), json.dumps(twin, indent=1, allow_nan=False) + "\n")
    return records, md
