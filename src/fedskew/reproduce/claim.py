"""A paper's claim as a checkable statement: the `Claim` model, loaded from `claims/<paper>.yaml`.

The claims ledger is three steps, each importing only those before it: `claim` (this one: what a
claim says, validated against its table and the policy) ← `verdicts` (each claim judged on the
paper's printed numbers and on fedskew's runs, with `combine` and `deciding`) ← `ledger` (the
verdicts rendered as `results/claims.md` and its JSON twin, in the words of `render`). A ledger of
one's own claims (`own_claims` ← `own_ledger`) is written over a suite's grid instead of a paper's
table and takes the same steps (`check_claim` checks its claims against the suite's labels).

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

The verdicts and the paper's own statuses a claim can get are named here (VERDICTS,
PAPER_STATUSES); `verdicts` says how they are reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from fedskew import user_files
from fedskew.config_errors import suggestion
from fedskew.reproduce.paper_tables import load_paper_table
from fedskew.reproduce.policy import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_RUN,
    PARTLY,
    REPRODUCED,
    WordRule,
    load_policy,
    magnitude_problem,
)

CLAIMS_DIR = Path(__file__).parent / "claims"
KINDS = ("gap", "drop", "trend", "gap_trend")
READINGS = ("sentence", "weaker", "stricter")
QUANTIFIERS = ("all", "most")
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)
PAPER_ORDER = ("FedLC", "SCALA", "FedED", "FL-FCR")

# What the paper's own numbers say about a claim (`verdicts.paper_status`).
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


def line_cells(claim: Claim, line: str) -> list[tuple[str, str]]:
    """The (row, column) cells of one line of a trend claim, in its order."""
    if claim.raw.get("along", "columns") == "rows":
        return [(o, line) for o in claim.order]
    return [(line, o) for o in claim.order]


def claim_cells(claim: Claim) -> list[tuple[str, str]]:
    """Every (row, column) cell a claim reads."""
    if claim.kind == "gap":
        return [(r, c) for c in claim.columns for r in (claim.subject, *claim.against)]
    if claim.kind == "drop":
        return [(r, c) for pair in claim.pairs for c in pair for r in (claim.subject, *claim.against)]
    if claim.kind == "gap_trend":
        return [(r, c) for c in claim.order for r in (claim.subject, *claim.against)]
    return [cell for line in claim.for_each for cell in line_cells(claim, line)]


# The fields each kind needs, and which of them are lists of labels (`pairs`: of [from, to] pairs).
NEEDS = {"gap": ("subject", "against", "columns"), "drop": ("subject", "against", "pairs"),
         "trend": ("order", "for_each", "direction"), "gap_trend": ("subject", "against", "order", "direction")}
LISTS = ("against", "columns", "pairs", "order", "for_each")


def _check(claim: Claim) -> None:
    """A paper's claim against its table's labels and the policy (raises ClaimError)."""
    table = load_paper_table(claim.table)
    check_claim(claim, table.rows, table.columns)


def check_claim(claim: Claim, rows, columns, table_name: str | None = None, listed: bool = False,
                nouns: tuple[str, str] = ("rows", "columns")) -> None:
    """A claim against the row and column labels of its table (named `table_name`, else `claim.table`) and the
    policy: its kind, word, threshold, reading, quantifier, fields and labels (raises ClaimError). `listed`: a
    label that is not there is reported with the labels that are (and the closest one); `nouns`: what the rows
    and the columns are called."""
    rows, columns = list(rows), list(columns)

    def need(labels, allowed, what):
        bad = [x for x in labels if x not in allowed]
        if bad:
            hint = f"{suggestion(bad[0], allowed)}; they are: {', '.join(map(str, allowed))}" if listed else ""
            raise ClaimError(f"claim {claim.id}: {what} {bad} not in {table_name or claim.table}{hint}")

    _check_rule(claim)
    _check_fields(claim)
    if claim.kind in ("gap", "drop", "gap_trend"):
        need([claim.subject, *claim.against], rows, nouns[0])
    if claim.kind == "gap":
        need(claim.columns, columns, nouns[1])
    elif claim.kind == "drop":
        need([c for pair in claim.pairs for c in pair], columns, nouns[1])
    elif claim.kind == "gap_trend":
        need(claim.order, columns, nouns[1])
    else:
        along_rows = claim.raw.get("along", "columns") == "rows"
        need(claim.order, rows if along_rows else columns, "order labels")
        need(claim.for_each, columns if along_rows else rows, "for_each labels")


def _check_rule(claim: Claim) -> None:
    """The claim's kind, its word's rule and threshold, and its reading and quantifier."""
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


def _check_fields(claim: Claim) -> None:
    """The fields the claim's kind needs, in their shapes: a subject label, lists of labels, [from, to] pairs."""
    missing = [name for name in NEEDS[claim.kind] if name not in claim.raw]
    if missing:
        raise ClaimError(f"claim {claim.id}: a {claim.kind} claim needs {', '.join(NEEDS[claim.kind])}; "
                         f"missing: {', '.join(missing)}")
    if "subject" in NEEDS[claim.kind] and not isinstance(claim.subject, str):
        raise ClaimError(f"claim {claim.id}: subject must be one row label, got {claim.subject!r}")
    for name in (n for n in LISTS if n in NEEDS[claim.kind]):
        value = claim.raw[name]
        if not isinstance(value, list) or not value or (name != "pairs" and not all(isinstance(x, str) for x in value)):
            what = "[from, to] column pairs" if name == "pairs" else "labels"
            raise ClaimError(f"claim {claim.id}: {name} must be a list of {what}, got {value!r}")
    if claim.kind == "drop" and not all(isinstance(p, list) and len(p) == 2 for p in claim.pairs):
        raise ClaimError(f"claim {claim.id}: pairs must be [from, to] column pairs")
    if claim.kind in ("trend", "gap_trend") and claim.raw.get("direction") not in ("increasing", "decreasing"):
        raise ClaimError(f"claim {claim.id}: direction must be increasing or decreasing")


@cache
def load_claims() -> tuple[Claim, ...]:
    out: list[Claim] = []
    for path in user_files.yaml_files(CLAIMS_DIR, (".yaml",)):
        parsed = user_files.load(path, CLAIMS_DIR)  # strictly: a key written twice is an error, not the last kept
        doc = parsed.data
        for index, raw in enumerate(doc["claims"]):
            if "word" not in raw:
                raise ClaimError(f"{path}: claim {raw.get('id')} names no word (word:, see policy.yaml)")
            if "x" in raw and (problem := magnitude_problem(raw["x"])) is not None:
                raise ClaimError(f"{parsed.at(('claims', index, 'x'))} (claim {raw.get('id')}): {problem}")
            claim = Claim(id=raw["id"], paper=doc["paper"], section=str(raw.get("section", "")),
                          quote=raw["quote"], statement=raw["statement"], kind=raw["kind"], table=raw["table"],
                          word=raw["word"], raw=raw)
            _check(claim)
            out.append(claim)
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):
        raise ClaimError(f"duplicate claim ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(sorted(out, key=lambda c: (PAPER_ORDER.index(c.paper) if c.paper in PAPER_ORDER else 9, c.id)))
