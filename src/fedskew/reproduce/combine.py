"""How the verdicts of a claim's comparisons, parts and protocols combine into one (the policy's rules).

A part of a claim (a column against each baseline, a trend line's net change and steps) needs every judgement
(`conjunction`); a claim's parts combine under its quantifier (`combine_parts`), its protocols as
`combine_protocols` says. `verdicts` judges claims with these; `deciding` asks of them when more seeds would
make an inconclusive claim's verdict final.
"""

from __future__ import annotations

from fedskew.reproduce.policy import INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, PARTLY, REPRODUCED


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
