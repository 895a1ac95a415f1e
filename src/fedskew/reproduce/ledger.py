"""The claims ledger's page: the verdicts rendered as `results/claims.md`, with its twin `results/claims.json`.

Last of the claims ledger's three modules (claim ← verdicts ← ledger): it takes the records of
`verdicts` (claims of `claim`, judged) and of `side_evidence` (proxies, missing classes) and turns
them into text: the headline README.md and
docs/reproducing-papers.md carry, the policy table, each paper's sections (claims, protocols,
threshold sensitivity, offline proxies) and the missing-class table; `write_ledger` computes and
writes both files.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

from fedskew.config import Params
from fedskew.reproduce import policy
from fedskew.reproduce.claim import CONTRADICTED, DEPENDS, HOLDS, PAPER_STATUSES, STRICTER, VERDICTS, WITHIN_TOLERANCE
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, PARTLY, REPRODUCED, Effect
from fedskew.reproduce.side_evidence import missing_class_evidence, proxy_comparisons
from fedskew.reproduce.verdicts import evaluate_all


# ------------------------------------------------------------------ the ledger page
class Wording(Enum):
    """Whose numbers a result is on, and so how the ledger words its evidence."""

    PAPER = "paper"   # the paper's printed numbers: points at its precision, and a claim holds or fails
    OURS = "ours"     # fedskew's runs: paired effects with intervals, and the policy's verdicts by name

    def verdict_word(self, verdict: str) -> str:
        """The word printed for a verdict: on our runs its name; on the paper's numbers holds / fails."""
        if self is Wording.OURS:
            return verdict
        return {REPRODUCED: "holds", PARTLY: "fails in part", NOT_REPRODUCED: "fails"}.get(verdict, verdict)

    def mark(self, verdict: str) -> str:
        """What follows a part or a line that is not reproduced: its verdict in words, in parentheses."""
        return "" if verdict == REPRODUCED else f" ({self.verdict_word(verdict)})"

    def places(self, result: dict, floor: int) -> int:
        """Decimals of a result's numbers: the paper's differences are exact at its printed precision (`floor`);
        ours print at 3 significant digits or more."""
        return floor if self is Wording.PAPER else _places(result, floor)

    @property
    def shows_net(self) -> bool:
        """Whether a trend line states its net change with its interval (ours; the paper's points say it)."""
        return self is Wording.OURS


def _places(result: dict, floor: int) -> int:
    """Print a claim's numbers at the precision of the values compared (at least the paper's)."""
    numbers = [p["effect"]["mean"] for p in result.get("parts", []) if "effect" in p]
    numbers += [v for line in result.get("lines", []) for v in line.get("series", [])]
    magnitude = max((abs(v) for v in numbers if v), default=None)
    return policy.decimals_for(magnitude, floor) if magnitude else floor


def _raw(record: dict, direction: float) -> Effect:
    """An effect signed for the claimed direction, back in raw units (a decrease prints negative)."""
    effect = Effect.from_record(record)
    if direction > 0:
        return effect
    low, high = (None, None) if effect.low is None else (-effect.high, -effect.low)
    return Effect(-effect.mean, low, high, effect.n, effect.point)


def _diverged_text(diverged: dict[str, list[int]]) -> str:
    """'FedED diverged on seeds 0, 2' for each method of a part or line that did."""
    return "; ".join(f"{method} diverged on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                     for method, seeds in diverged.items())


def _part_text(part: dict, places: int, wording: Wording) -> str:
    diverged = part.get("diverged", {})
    if "effect" not in part:  # the claimed method diverged: nothing to compare (the policy's rule)
        return f"{part['label']}: {_diverged_text(diverged)}{wording.mark(part['verdict'])}"
    effect = policy.fmt_effect(Effect.from_record(part["effect"]), places)
    missing = [b for b in part.get("baselines_missing", []) if b not in diverged]
    without = f", without {', '.join(missing)} (not run)" if missing else ""
    left_out = f" ({_diverged_text(diverged)}: left out of the pairing)" if diverged else ""
    return f"{part['label']}: {effect} vs {part['vs']}{wording.mark(part['verdict'])}{without}{left_out}"


def _line_text(line: dict, places: int, wording: Wording) -> str:
    if "series" not in line:  # diverged: the claimed method's lead, or a method's every seed somewhere
        return f"{line['label']}: {_diverged_text(line['diverged'])}{wording.mark(line['verdict'])}"
    if line.get("diverged"):
        return _line_text({k: v for k, v in line.items() if k != "diverged"}, places, wording) + \
            f" ({_diverged_text(line['diverged'])}: left out)"
    series = " → ".join(f"{v:.{places}f}" for v in line["series"])
    net = policy.fmt_effect(_raw(line["net"], line["direction"]), places)
    text = f"{line['label']}: {series}"
    if wording.shows_net:
        text += f"; net {net}"
    worst = line["worst_step"]
    if len(line["steps"]) > 1 and (line["steps"][worst]["mean"] <= 0 or line["step_verdicts"][worst] != REPRODUCED):
        step = _raw(line["steps"][worst], line["direction"])
        text += f"; step most against the trend {policy.fmt_effect(step, places)}"
    if line["within_tolerance"]:
        return text + " (within the tolerance)"
    return text + wording.mark(line["verdict"])


def result_text(result: dict, floor: int, wording: Wording = Wording.OURS) -> str:
    """The evidence of a verdict: each column's effect (with its interval on our runs) or each line's
    points, net change and the step most against the trend; what is not run, and why."""
    stale = "; ".join(f"{row} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                      for row, seeds in result.get("stale", {}).items())
    stale = f" [out of date, left out until trained again: {stale}]" if stale else ""
    if result["verdict"] == NOT_RUN:
        return f"not run: {result.get('reason', 'no cell of this claim has our numbers')}{stale}"
    places = wording.places(result, floor)
    if "parts" in result:
        text = "; ".join(_part_text(p, places, wording) for p in result["parts"])
    else:
        text = "; ".join(_line_text(line, places, wording) for line in result["lines"])
        if result["lines"]:
            text += f" — strict reading (every step in the direction): {wording.verdict_word(result['strict'])}"
    return text + (f" ({result['detail']})" if result.get("detail") else "") + stale


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


def render_policy() -> str:
    """The policy table, as the ledger prints it and docs/reproducing-papers.md carries it."""
    rules = policy.load_policy()
    lines = ["| word (the papers' phrases) | kind | threshold | a tie | rule |", "|---|---|---|---|---|"]
    for rule in rules.words.values():
        phrases = ", ".join(f"“{p}”" for p in rule.papers)
        threshold = ("—" if rule.threshold is None
                     else "X (quoted)" if rule.threshold == "X" else f"{rule.threshold:g}")
        ties = "—" if rule.threshold is None else ("holds" if rule.ties_hold else "fails")
        lines.append(f"| **{rule.word}** ({phrases}) | {rule.kind} | {threshold} | {ties} | {rule.rule} |")
    factors = " and ".join(f"{f:g}×" for f in rules.sensitivity)
    lines += ["", f"- **Interval**: {rules.level:.0%} Student-t over the seeds. {rules.interval_note}",
              "- **Verdicts**: *reproduced* when the interval lies on the claimed side of the threshold, *not "
              "reproduced* when it lies entirely on the other side, *inconclusive* when it straddles it (or one "
              "seed). A claim needs every baseline in each column; its columns or lines combine to *partly* when "
              "some but not all are reproduced. Across protocols, inconclusive ones decide nothing and conclusive "
              "ones that disagree give *partly*.",
              "- **Diverged runs** have no number. Where the claim's own method diverged on a seed, that column "
              "(or its lead's trend) is *not reproduced*: the method the paper reports did not train there. A "
              "baseline's diverged seeds are left out of its pairing, and a method whose own trend is judged is "
              "judged on its finished seeds (*inconclusive* where a setting has none). The ledger names every "
              "diverged seed.",
              f"- **Trends**: net change in the stated direction and no step against it by more than "
              f"{rules.trend_tolerance:g} point (the trend tolerance); strict monotonicity is the named reading "
              "*strict*, shown beside it.",
              "- **Quantifiers**: " + "; ".join(f"*{k}*: {v}" for k, v in rules.quantifiers.items()) + ".",
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
        hinge = hinge_text(r)
        lines.append(f"| {r['id']} ({r['table']}) | {word} | {r['statement']}{_reading_tag(r)} | {_paper_cell(r)} "
                     f"| {ours} | **{r['verdict']}**{'<br>' + hinge if hinge else ''} |")
    return lines + [""]


def hinges(record: dict) -> dict[str, list[str]]:
    """What a claim's verdict hangs on: each verdict with the protocols that give it, when the conclusive
    protocols disagree (the claim then reads partly) or when the main protocol decides nothing and the
    verdict comes from the others; {} when the main protocol's verdict stands unopposed."""
    by_verdict: dict[str, list[str]] = {}
    for protocol, result in record["ours"].items():
        if result["verdict"] != NOT_RUN:
            by_verdict.setdefault(result["verdict"], []).append(protocol)
    conclusive = set(by_verdict) - {INCONCLUSIVE}
    main = next(iter(record["ours"].values()))["verdict"]
    return by_verdict if len(conclusive) > 1 or (main == INCONCLUSIVE and conclusive) else {}


def hinge_text(record: dict) -> str:
    """`hinges` in words: "hangs on the protocol: reproduced under *…*; partly under *…*, *…*" (each
    protocol's label in italics, since labels carry commas and semicolons of their own)."""
    groups = hinges(record)
    if not groups:
        return ""
    return "hangs on the protocol: " + "; ".join(f"{verdict} under {', '.join(f'*{p}*' for p in protocols)}"
                                                 for verdict, protocols in sorted(groups.items(),
                                                                                  key=lambda g: VERDICTS.index(g[0])))


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
    tolerance = policy.load_policy().trend_tolerance
    for r in bearing:
        paper_one, ours_one = r["on_paper"]["verdict"], r["ours"]["main protocol"]["verdict"]
        at_one = f"{Wording.PAPER.verdict_word(paper_one)} / {ours_one}"
        scaled = [f"{Wording.PAPER.verdict_word(s['paper'])} / {s['ours']}"
                  for s in r["threshold_sensitivity"].values()]
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
    atomic_write_text(out_json, json.dumps(twin, indent=1) + "\n")
    return records
