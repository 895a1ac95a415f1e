"""Method families: how the accuracy-curve figures group a suite with many methods into panels (`panels`).

A method's family is its algorithm's panel (``params.method_spec(method)["algorithm"]``), so the
variants of one algorithm (``fedlc_floor``, ``feded_lam0.5``, …) sit with it. Each method class names
its panel (``Algorithm.panel``, fedskew.families.Panel; a split method's is ``split learning``), which
fedskew.catalog serves; a name that is no method falls into ``other`` (its own panel), so it is still drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedskew import catalog
from fedskew.families import Panel

if TYPE_CHECKING:
    from fedskew.config import Params

PLAIN = Panel.PLAIN.value
DRIFT = Panel.DRIFT.value
CALIBRATION = Panel.CALIBRATION.value
SPLIT = Panel.SPLIT.value
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
    OTHER: "a name that is no method fedskew knows",
}


def algorithm_family(algorithm: str) -> str:
    """The panel of a method by its algorithm's name (its class's `panel`); `other` for a name that is no method."""
    record = catalog.methods().get(algorithm)
    return record["panel"] if record else OTHER


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
