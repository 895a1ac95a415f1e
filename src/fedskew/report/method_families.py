"""Method families: how the accuracy-curve figures group a suite with many methods into panels (`panels`).

A method's family is its algorithm's (``params.method_spec(method)["algorithm"]``), so the
variants of one algorithm (``fedlc_floor``, ``feded_lam0.5``, …) sit with it. Split-federated
algorithms are recognised by their family (``fedskew.catalog.FAMILIES[name] is Family.SPLIT``);
the federated ones by the mapping below, the one place to edit when a method is added. An
algorithm not listed falls into ``other`` (its own panel), so a new method is still drawn,
and a test fails until it is filed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedskew import catalog
from fedskew.families import Family

if TYPE_CHECKING:
    from fedskew.config import Params

PLAIN = "plain FL"
DRIFT = "drift correction"
CALIBRATION = "logit calibration (label skew)"
SPLIT = "split learning"
OTHER = "other"

# Panel order, top-left to bottom-right.
FAMILIES = (PLAIN, DRIFT, CALIBRATION, SPLIT, OTHER)

DESCRIPTIONS = {
    PLAIN: "FedAvg and methods that change only the server update or the local optimiser "
           "(proximal term, normalised averaging, server optimisers, extrapolation, sharpness-aware steps)",
    DRIFT: "methods that correct client drift or regularise local representations "
           "(control variates, dynamic regularisation, contrastive, decorrelation, not-true distillation)",
    CALIBRATION: "methods aimed at label skew that adjust, restrict or calibrate the logits or the classifier "
                 "(and their compositions with other methods)",
    SPLIT: "split-federated methods (the model is cut between client and server)",
    OTHER: "an algorithm not filed in fedskew.report.method_families yet",
}

# Federated algorithms by family. A composition goes with its label-skew parent: what it adds
# to the baseline it is composed with is the calibration.
FEDERATED_FAMILIES: dict[str, str] = {
    "fedavg": PLAIN,
    "fedprox": PLAIN,
    "fednova": PLAIN,
    "fedadam": PLAIN,
    "fedyogi": PLAIN,
    "fedadagrad": PLAIN,
    "fedexp": PLAIN,
    "fedsam": PLAIN,
    "scaffold": DRIFT,
    "feddyn": DRIFT,
    "moon": DRIFT,
    "feddecorr": DRIFT,
    "fedntd": DRIFT,
    "fedlc": CALIBRATION,
    "fedrs": CALIBRATION,
    "fedrs_soft": CALIBRATION,
    "fedlogit": CALIBRATION,
    "feded": CALIBRATION,
    "feded_dis": CALIBRATION,
    "feded_logit": CALIBRATION,
    "flfcr": CALIBRATION,
    "fedlc_scaffold": CALIBRATION,
    "fedlc_fedprox": CALIBRATION,
    "feded_fedexp": CALIBRATION,
    "feded_fedsam": CALIBRATION,
}


def algorithm_family(algorithm: str) -> str:
    """The family of a registered algorithm name; `other` for one not filed here."""
    if catalog.FAMILIES.get(algorithm) == Family.SPLIT:
        return SPLIT
    return FEDERATED_FAMILIES.get(algorithm, OTHER)


def method_family(params, method: str) -> str:
    """The family of a method of params.yaml (a catalogue entry or an algorithm named directly)."""
    try:
        algorithm = params.method_spec(method)["algorithm"]
    except KeyError:  # not a registered algorithm: draw it, in its own panel
        return OTHER
    return algorithm_family(algorithm)


# How the accuracy-curve figures (fedskew.report.figures) lay a setting's methods out in panels.
SINGLE_PANEL_MAX = 8   # more methods than this in a setting: one panel per family
PANEL_MAX = 10         # methods per panel besides the reference (a family with more is split)
REFERENCE = "fedavg"   # the algorithm drawn as the reference line in every panel


def reference_method(params: Params, methods: list[str]) -> str | None:
    """The method drawn as the reference: `fedavg` if the suite runs it, else any FedAvg variant."""
    if REFERENCE in methods:
        return REFERENCE
    for method in methods:
        try:
            if params.method_spec(method)["algorithm"] == REFERENCE:
                return method
        except KeyError:
            continue
    return None


def panels(params: Params, methods: list[str]) -> list[tuple[str | None, list[str]]]:
    """(title, methods) per panel. The reference method is in no panel: it is drawn in each.

    Up to SINGLE_PANEL_MAX methods: one untitled panel. Above: one panel per family (in
    FAMILIES order). Within a family, the methods built on one algorithm (same algorithm
    name up to its first "_": fedlc, fedlc_floor, fedlc_scaffold, …) stay together, and a
    family with more than PANEL_MAX methods is split into numbered panels between such
    groups (a single group larger than a panel is cut).
    """
    reference = reference_method(params, methods)
    others = [m for m in methods if m != reference]
    if len(methods) <= SINGLE_PANEL_MAX:
        return [(None, others)]

    def root(method: str) -> str:
        try:
            return params.method_spec(method)["algorithm"].split("_")[0]
        except KeyError:
            return method

    out = []
    for family in FAMILIES:
        groups: dict[str, list[str]] = {}
        for method in others:
            if method_family(params, method) == family:
                groups.setdefault(root(method), []).append(method)
        chunks: list[list[str]] = []
        for group in groups.values():
            for start in range(0, len(group), PANEL_MAX):
                piece = group[start:start + PANEL_MAX]
                if chunks and len(chunks[-1]) + len(piece) <= PANEL_MAX:
                    chunks[-1] += piece
                else:
                    chunks.append(list(piece))
        for i, chunk in enumerate(chunks):
            out.append((family if len(chunks) == 1 else f"{family} ({i + 1}/{len(chunks)})", chunk))
    return out
