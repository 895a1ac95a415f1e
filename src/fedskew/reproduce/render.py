"""What every claims ledger prints the same way: a verdict's evidence, the policy, the protocols, the threshold
sensitivity and the seeds that would decide an inconclusive claim.

The papers' ledger (`ledger`: results/claims.md) and a researcher's own (`own_ledger`:
results/claims/<name>.md) render the records of `verdicts.judge_on_ours` with these functions, so that both
word the same evidence alike. `Wording` says whose numbers a text is about (a paper's printed points, or our
paired effects with their intervals).
"""

from __future__ import annotations

from enum import Enum

from fedskew.reproduce import policy
from fedskew.reproduce.claim import VERDICTS
from fedskew.reproduce.policy import INCONCLUSIVE, NOT_RUN, PARTLY, REPRODUCED, NOT_REPRODUCED, Effect
from fedskew.reproduce.seeds import FORMULA, cost_text


# ------------------------------------------------------------------ a verdict's evidence
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


# ------------------------------------------------------------------ the policy
def render_policy(proxies: bool = True) -> str:
    """The policy table, as the ledger prints it and docs/reproducing-papers.md carries it (a ledger of one's own
    has no `proxies`)."""
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
              "- **Seeds to decide** (an estimate): for each inconclusive claim, the paired seeds n* at which each of "
              f"its inconclusive comparisons would exclude its threshold θ, L = {rules.level:.0%}: `{FORMULA}`; there it "
              "is decided toward the side of θ its mean is on. A column or line, and a claim over its columns or lines "
              "under its quantifier, are decided at the fewest seeds from which their verdict no longer changes if every "
              "mean and spread hold: a column or line when one comparison falls short or every one holds (a trend's comparisons are its net "
              "change and each step, a step against minus the tolerance); a claim under *all* when every part is "
              "decided (earlier where it is *partly* whatever the rest do), under *most* when a majority is decided "
              "either way. One paired seed, a mean exactly at θ or a baseline not run give no estimate. The cost is "
              "that of the extra seeds on the claim's runs (`fedskew.reproduce.cost`: FLOPs, GPU-hours at an assumed "
              "throughput, CPU-hours at a measured rate)."]
    if proxies:
        lines.append("- **Proxies** judge the direction only (ahead: > 0) with the same interval rule; the paper's "
                     "thresholds do not carry over to another setting.")
    return "\n".join(lines)


# ------------------------------------------------------------------ a claim's row, its protocols, its threshold
def reading_tag(record: dict) -> str:
    return "" if record["reading"] == "sentence" else f" *({record['reading']} reading)*"


def ours_cell(r: dict) -> str:
    """A claim's cell for our runs: the main protocol's verdict and evidence, the suites that ran it and the
    other protocols' verdicts in a tally."""
    main, *others = r["ours"].values()
    ours = f"{main['verdict']} — {result_text(main, r['decimals'])}"
    tested_by = sorted({suite for o in r["ours"].values() for suite in o.get("suites", [])})
    if tested_by:
        ours += f"<br>suites: {', '.join(f'`{suite}`' for suite in tested_by)}"
    covered = [o["verdict"] for o in others if o["verdict"] != NOT_RUN]
    if covered:
        tally = ", ".join(f"{covered.count(v)} {v}" for v in VERDICTS if v in covered)
        ours += f"<br>*other protocols ({len(covered)}): {tally}* (below)"
    return ours


def word_text(r: dict) -> str:
    """The claim's word, with the number the sentence quotes for "by X %"."""
    return r["word"] + (f" {r['threshold']:g}" if r["word"] == "by X %" else "")


def verdict_cell(r: dict) -> str:
    hinge = hinge_text(r)
    return f"**{r['verdict']}**{'<br>' + hinge if hinge else ''}"


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


def protocol_section(heading: str, records: list[dict]) -> list[str]:
    """Each claim that a protocol besides the main one has run, under every protocol that has."""
    sensitive = [r for r in records if any(o["verdict"] != NOT_RUN for o in list(r["ours"].values())[1:])]
    if not sensitive:
        return []
    lines = [heading, "", "| claim | protocol | verdict | fedskew |", "|---|---|---|---|"]
    for r in sensitive:
        for label, result in r["ours"].items():
            if result["verdict"] != NOT_RUN:
                lines.append(f"| {r['id']} | {label} | {result['verdict']} | {result_text(result, r['decimals'])} |")
    return lines + [""]


def sensitivity_section(heading: str, records: list[dict]) -> list[str]:
    """Each threshold-bearing claim's verdict at the policy's multiples of its threshold (and tolerance): on the
    paper's numbers and ours where a record has both, else ours."""
    bearing = [r for r in records if "threshold_sensitivity" in r]
    if not bearing:
        return []
    factors = list(bearing[0]["threshold_sensitivity"])
    with_paper = "paper" in bearing[0]["threshold_sensitivity"][factors[0]]
    head = " | ".join(f"at {float(f):g}×" for f in factors)
    whose, which = ("paper / fedskew (main protocol)", "either verdict") if with_paper else \
        ("fedskew (main protocol)", "the verdict")
    lines = [heading, "",
             f"The threshold (and, for a trend, the tolerance) scaled; {whose}. *Changes*: "
             f"where {which} differs from the one at the policy's own value.", "",
             f"| claim | word | threshold | tolerance | at 1× | {head} | changes |",
             "|---|---|---|---|---|" + "---|" * len(factors) + "---|"]
    tolerance = policy.load_policy().trend_tolerance

    def shown(paper: str | None, ours: str) -> str:
        return f"{Wording.PAPER.verdict_word(paper)} / {ours}" if with_paper else ours

    for r in bearing:
        paper_one, ours_one = r["on_paper"]["verdict"] if with_paper else None, r["ours"]["main protocol"]["verdict"]
        scaled = [shown(s.get("paper"), s["ours"]) for s in r["threshold_sensitivity"].values()]
        changes = [f"{float(f):g}×" + (" paper" if with_paper and s["paper"] != paper_one else "")
                   + (" fedskew" if with_paper and s["ours"] != ours_one else "")
                   for f, s in r["threshold_sensitivity"].items()
                   if s.get("paper") != paper_one or s["ours"] != ours_one]
        tol = f"{tolerance:g}" if r["kind"] in ("trend", "gap_trend") else "—"
        lines.append(f"| {r['id']} | {r['word']} | {r['threshold']:g} | {tol} | {shown(paper_one, ours_one)} | "
                     + " | ".join(scaled) + f" | {', '.join(changes) or 'no'} |")
    return lines + [""]


# ------------------------------------------------------------------ the seeds that would decide
def seeds_text(entry: dict) -> str:
    """When an estimate decides (a claim, or a part): "≈ 17 seeds (14 more; vs FedAvg), toward not reproduced",
    or why there is no estimate."""
    if entry["seeds"] is None:
        return entry["reason"]
    by = f"; {entry['by']}" if entry.get("by") else ""
    return f"≈ {entry['seeds']} seeds ({entry['more']} more{by}), toward {entry['toward']}"


def seeds_cost_text(entry: dict) -> str:
    """What the extra seeds cost on the claim's runs, or — where there is no estimate."""
    cost = entry.get("cost")
    if cost is None:
        return "—"
    cells = f"{cost['cells']} cell{'s' if cost['cells'] != 1 else ''}"
    return f"{cost_text(cost)} ({cells} brought to {entry['seeds']} seeds)"


def seeds_section(heading: str, records: list[dict]) -> list[str]:
    """For each inconclusive claim, the seeds that would decide it and each of its inconclusive parts, an
    estimate (the policy's *seeds to decide*), and what those seeds cost."""
    deciding = [r for r in records if r.get("seeds_to_decide")]
    if not deciding:
        return []
    lines = [heading, "",
             "An estimate, at each comparison's observed mean and spread (the policy's *seeds to decide*): the paired "
             "seeds from which the claim's verdict would no longer change, and that verdict, if the means and "
             "spreads held; each inconclusive column or line, with the comparison that decides it; and what the "
             "extra seeds cost on the claim's runs.", "",
             "| claim | protocol | decided at (estimate) | each inconclusive part (estimate) | the extra seeds cost "
             "(estimate) |", "|---|---|---|---|---|"]
    for r in deciding:
        entry = r["seeds_to_decide"]
        parts = "; ".join(f"{p['label']}: {seeds_text(p)}" for p in entry["parts"])
        lines.append(f"| {r['id']} | {entry['protocol']} | {seeds_text(entry)} | {parts} | {seeds_cost_text(entry)} |")
    return lines + [""]
