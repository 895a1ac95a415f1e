"""Method families: how the accuracy-curve figures group a suite with many methods into panels.

A method's family is its algorithm's (``params.method_spec(method)["algorithm"]``), so the
variants of one algorithm (``fedlc_floor``, ``feded_lam0.5``, …) sit with it. Split-federated
algorithms are recognised by their registry entry (``ALGORITHMS[name].family == "split"``);
the federated ones by the mapping below, the one place to edit when a method is added. An
algorithm not listed falls into ``other`` (its own panel), so a new method is still drawn,
and a test fails until it is filed here.
"""

from __future__ import annotations

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
    from fedskew.algorithms import ALGORITHMS

    if algorithm in ALGORITHMS and getattr(ALGORITHMS[algorithm], "family", None) == "split":
        return SPLIT
    return FEDERATED_FAMILIES.get(algorithm, OTHER)


def method_family(params, method: str) -> str:
    """The family of a method of params.yaml (a catalogue entry or an algorithm named directly)."""
    try:
        algorithm = params.method_spec(method)["algorithm"]
    except KeyError:  # not a registered algorithm: draw it, in its own panel
        return OTHER
    return algorithm_family(algorithm)
