"""The claims ledger's policy (`policy.yaml`): what a paper's word means, and how an effect is judged.

Two things live here and nowhere else:

- the **word table**: each word a sentence uses ("significantly", "much", "by X %", a trend ...)
  mapped to one rule (a threshold in the table's metric, whether a tie holds), the same in all four
  papers;
- the **judgement** of one effect against a threshold: on fedskew's runs from the 95 % Student-t
  interval of the paired per-seed effects, on a paper's printed numbers from the printed point.

A judgement is one of three outcomes: the effect lies on the claimed side of the threshold
(REPRODUCED), entirely on the other side (NOT_REPRODUCED), or the interval straddles the threshold
or there is a single seed (INCONCLUSIVE). The `verdicts` module combines them over a claim's columns,
lines and protocols.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

POLICY_FILE = Path(__file__).parent / "policy.yaml"
KINDS = ("gap", "drop", "trend", "gap_trend", "none")

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
PARTLY = "partly"
NOT_RUN = "not run here"
MAX_DECIMALS = 6  # 3 significant digits of a gap of 1e-4 need 6; smaller values print as their floor


class PolicyError(ValueError):
    """A policy file, or a claim's use of it, that does not have the documented shape."""


@dataclass(frozen=True)
class WordRule:
    """One word of the papers and the rule it stands for."""

    word: str
    kind: str                   # the claim kind the word applies to (gap, drop, trend, gap_trend, none)
    threshold: float | str | None   # a magnitude, "X" (the sentence quotes it), or None (no rule)
    ties_hold: bool             # whether an effect exactly at the threshold holds
    rule: str
    papers: tuple[str, ...]

    def magnitude(self, x: float | None = None) -> float:
        """The threshold, with the sentence's own X for "by X %" (a finite number >= 0: `magnitude_problem`)."""
        if self.threshold == "X":
            if x is None:
                raise PolicyError(f"word {self.word!r} needs the number the sentence quotes (x:)")
            if (problem := magnitude_problem(x)) is not None:
                raise PolicyError(f"x: {problem}")
            return float(x)
        if x is not None:
            raise PolicyError(f"word {self.word!r} takes no x (only 'by X %' does)")
        if self.threshold is None:
            raise PolicyError(f"word {self.word!r} has no rule: a claim cannot rest on it")
        return float(self.threshold)


def magnitude_problem(value: object) -> str | None:
    """Why a claim's magnitude (the `x` of "by X %") cannot be one, or None: it is the gap the sentence quotes,
    a finite number >= 0 (a negative one would turn "beats by" into "loses by"; NaN would judge nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number; write the gap the sentence quotes, e.g. x: 9.07"
    if not math.isfinite(value):
        spelling = ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
        return f"{spelling} is not a finite number; write the gap the sentence quotes, e.g. x: 9.07"
    if value < 0:
        return (f"{value!r} is negative; x is the size of the gap the sentence quotes, >= 0 (`better: lower` turns "
                "the direction)")
    return None


@dataclass(frozen=True)
class Policy:
    level: float
    interval_method: str
    interval_note: str
    trend_tolerance: float
    sensitivity: tuple[float, ...]
    words: dict[str, WordRule]
    quantifiers: dict[str, str]

    def word(self, name: str) -> WordRule:
        try:
            return self.words[name]
        except KeyError:
            raise PolicyError(f"word {name!r} is not in {POLICY_FILE.name}; known: {sorted(self.words)}") from None


def parse_policy(doc: dict, origin: str = "<memory>") -> Policy:
    """Check a policy document's shape and build a `Policy` (raises `PolicyError`)."""
    for key in ("interval", "trend_tolerance", "sensitivity", "words", "quantifiers"):
        if key not in doc:
            raise PolicyError(f"{origin}: missing key {key!r}")
    interval = doc["interval"]
    if interval.get("method") != "t" or not 0 < float(interval.get("level", 0)) < 1:
        raise PolicyError(f"{origin}: interval must be {{method: t, level: 0 < level < 1}}, got {interval}")
    words = {}
    for name, raw in doc["words"].items():
        if raw.get("kind") not in KINDS:
            raise PolicyError(f"{origin}: word {name!r} has kind {raw.get('kind')!r}; allowed: {KINDS}")
        threshold = raw.get("threshold")
        if threshold not in (None, "X") and magnitude_problem(threshold) is not None:
            raise PolicyError(f"{origin}: word {name!r} threshold {threshold!r} is not >= 0, 'X' or null")
        if threshold is not None and raw.get("ties") not in ("hold", "fail"):
            raise PolicyError(f"{origin}: word {name!r} must say whether ties hold or fail")
        words[name] = WordRule(name, raw["kind"], threshold, raw.get("ties") == "hold", str(raw["rule"]),
                               tuple(map(str, raw.get("papers") or ())))
    sensitivity = tuple(float(f) for f in doc["sensitivity"])
    if (magnitude_problem(doc["trend_tolerance"]) is not None
            or any(not (math.isfinite(f) and f > 0) for f in sensitivity)):
        raise PolicyError(f"{origin}: trend_tolerance must be a finite number >= 0 and sensitivity factors finite "
                          "and > 0")
    return Policy(level=float(interval["level"]), interval_method="t", interval_note=str(interval.get("note", "")),
                  trend_tolerance=float(doc["trend_tolerance"]), sensitivity=sensitivity, words=words,
                  quantifiers={str(k): str(v) for k, v in doc["quantifiers"].items()})


@cache
def load_policy() -> Policy:
    return parse_policy(yaml.safe_load(POLICY_FILE.read_text()), str(POLICY_FILE))


# ------------------------------------------------------------------ effects and their intervals
@dataclass(frozen=True)
class Effect:
    """An effect (method − baseline, signed so that positive is the claimed direction).

    On fedskew's runs: the mean of the paired per-seed differences and its t-interval (`low`,
    `high` are None for one seed). On a paper's numbers: the printed difference, a point
    (`point=True`, low = high = mean).
    """

    mean: float
    low: float | None
    high: float | None
    n: int
    point: bool = False

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def record(self) -> dict:
        """The effect in a verdict's record (the ledger's JSON twin): a printed point has no n."""
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": None if self.point else self.n}

    @classmethod
    def from_record(cls, record: dict) -> Effect:
        """The effect back from its `record`."""
        return cls(record["mean"], record["low"], record["high"], record["n"] or 1, record["n"] is None)


def t_quantile(level: float, df: int) -> float:
    """Two-sided Student-t quantile t((1 + level) / 2, df), e.g. 4.303 for 95 % and 2 degrees of freedom."""
    from scipy.stats import t  # scikit-learn's dependency; imported here so the rest loads without it

    return float(t.ppf((1 + level) / 2, df))


def paired_effect(differences: list[float], level: float | None = None) -> Effect:
    """The mean of per-seed paired differences with its two-sided t-interval (none for one seed)."""
    if not differences:
        raise ValueError("no paired differences: the two cells share no seed")
    level = load_policy().level if level is None else level
    mean = statistics.fmean(differences)
    n = len(differences)
    if n < 2:
        return Effect(mean, None, None, n)
    half = t_quantile(level, n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return Effect(mean, mean - half, mean + half, n)


def point_effect(value: float, decimals: int) -> Effect:
    """A difference of two printed numbers, rounded to their printed precision (75.71 − 62.90 = 12.81 exactly)."""
    rounded = round(value, decimals) + 0.0  # + 0.0 turns -0.0 into 0.0
    return Effect(rounded, rounded, rounded, 1, point=True)


def judge(effect: Effect, threshold: float, ties_hold: bool) -> str:
    """REPRODUCED if the effect (its whole interval) is on the claimed side of `threshold`,
    NOT_REPRODUCED if entirely on the other side, else INCONCLUSIVE (straddling, or one seed).

    With `ties_hold` an effect exactly at the threshold is on the claimed side ("≥"), else on
    the other side ("beats" needs > 0: a tie does not beat).
    """
    if not effect.has_interval:
        return INCONCLUSIVE
    low, high = effect.low, effect.high
    claimed = low >= threshold if ties_hold else low > threshold
    other = high < threshold if ties_hold else high <= threshold
    if claimed:
        return REPRODUCED
    if other:
        return NOT_REPRODUCED
    return INCONCLUSIVE


# ------------------------------------------------------------------ readable numbers
def decimals_for(value: float | None, floor: int) -> int:
    """Decimals to print `value` with: the paper's own (`floor`), or more where that shows fewer than
    3 significant digits (a loss of 0.0058 printed at 2 decimals would read 0.01)."""
    if value is None or value == 0 or not math.isfinite(value):
        return floor
    needed = 2 - math.floor(math.log10(abs(value)))
    return max(floor, min(needed, MAX_DECIMALS))


def fmt(value: float, floor: int, signed: bool = False, decimals: int | None = None) -> str:
    places = decimals_for(value, floor) if decimals is None else decimals
    return f"{value:+.{places}f}" if signed else f"{value:.{places}f}"


def fmt_effect(effect: Effect, places: int) -> str:
    """'+5.00 [+3.10, +6.90]' at `places` decimals, the precision of the values compared (one seed:
    '+5.00 (one seed: no interval)'; a paper's printed difference: '+5.00')."""
    text = f"{effect.mean:+.{places}f}"
    if effect.point:
        return text
    if not effect.has_interval:
        return f"{text} (one seed: no interval)"
    return f"{text} [{effect.low:+.{places}f}, {effect.high:+.{places}f}]"
