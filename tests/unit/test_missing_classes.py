"""The `missing_classes` option of every count-calibrated loss, checked against hand computations.

FedLC's margins, FedLogit's and FedED's L_cal prior and SCALA's P_k each see the client's
label counts through `calibration_counts`: mask (n_c = 0 drops the class from the softmax),
floor (n_c counted as 1) or global (the federation's totals).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedskew.algorithms import ALGORITHMS
from fedskew.fl.base import TrainingSettings
from fedskew.fl.feded import FedED
from fedskew.fl.losses import calibration_counts, true_class_margin_cross_entropy
from tests.helpers import make_client

SGD = TrainingSettings(local_epochs=1, batch_size=4, lr=0.1, momentum=0.0, weight_decay=0.0)
LOCAL = [3, 0, 1]                      # class 1 missing on this client
ALL_CLIENTS = [[3, 0, 1], [0, 5, 2]]   # totals [3, 5, 3]
LOGITS = [[1.0, 2.0, -0.5], [0.2, 0.1, 0.4]]
Y = [0, 2]


def _ce_by_hand(rows, ys, shifts, keep):
    """Mean over rows of -log softmax(z + shift)_y over the kept classes."""
    total = 0.0
    for row, y in zip(rows, ys):
        terms = [math.exp(z + s) for z, s, k in zip(row, shifts, keep) if k]
        total += -(row[y] + shifts[y]) + math.log(sum(terms))
    return total / len(rows)


def _loss(name: str, treatment: str) -> float:
    algorithm = ALGORITHMS[name](SGD, 2, 3, missing_classes=treatment)
    algorithm.set_label_counts(torch.tensor(ALL_CLIENTS))
    client = make_client(LOCAL)
    algorithm.begin_local(torch.nn.Linear(3, 3), {}, client) if name != "fedlc" else None
    return algorithm.local_loss(torch.tensor(LOGITS), torch.zeros(2, 3), torch.tensor(Y), client).item()


def test_calibration_counts_by_option() -> None:
    local, totals = torch.tensor(LOCAL), torch.tensor([3, 5, 3])
    assert calibration_counts(local, "mask").tolist() == [3, 0, 1]
    assert calibration_counts(local, "floor").tolist() == [3, 1, 1]
    assert calibration_counts(local, "global", totals).tolist() == [3, 5, 3]
    with pytest.raises(ValueError, match="set_label_counts"):
        calibration_counts(local, "global")
    with pytest.raises(ValueError, match="mask"):
        calibration_counts(local, "zero")


@pytest.mark.parametrize("treatment, counts, keep", [
    ("mask", [3, 0, 1], [True, False, True]),
    ("floor", [3, 1, 1], [True, True, True]),
    ("global", [3, 5, 3], [True, True, True]),
])
def test_fedlc_margins_follow_the_option(treatment, counts, keep) -> None:
    tau = 1.0
    shifts = [-tau * max(n, 1) ** -0.25 for n in counts]
    assert _loss("fedlc", treatment) == pytest.approx(_ce_by_hand(LOGITS, Y, shifts, keep), abs=1e-6)


@pytest.mark.parametrize("name", ["fedlogit", "feded_dis"])
@pytest.mark.parametrize("treatment, counts, keep", [
    ("mask", [3, 0, 1], [True, False, True]),
    ("floor", [3, 1, 1], [True, True, True]),
    ("global", [3, 5, 3], [True, True, True]),
])
def test_logit_adjusted_prior_follows_the_option(name, treatment, counts, keep) -> None:
    # FedLogit's Eq. 15 and FedED's L_cal: z + log p(c), p = counts / sum(counts). (feded_dis with one
    # empty class has L_dis = 0, so its loss is L_cal alone.)
    total = sum(counts)
    shifts = [math.log(n / total) if n else 0.0 for n in counts]
    assert _loss(name, treatment) == pytest.approx(_ce_by_hand(LOGITS, Y, shifts, keep), abs=1e-6)


def test_the_option_is_declared_only_by_count_calibrated_methods() -> None:
    having = {name for name, cls in ALGORITHMS.items() if "missing_classes" in cls.hyperparameters}
    assert having == {"fedlc", "fedlc_scaffold", "fedlc_fedprox", "fedlogit", "feded", "feded_dis",
                      "feded_logit", "feded_fedexp", "feded_fedsam", "scala"}
    assert all(ALGORITHMS[name].defaults["missing_classes"] == "mask" for name in having)
    with pytest.raises(ValueError, match="missing_classes"):
        ALGORITHMS["fedlc"](SGD, 2, 3, missing_classes="zero")


def test_scala_client_gradient_uses_the_option_for_p_k_only() -> None:
    from fedskew.sfl.scala import SCALA, SCALALoss

    server_counts = torch.tensor([3, 5, 3])
    for treatment, counts in (("mask", [3, 0, 1]), ("floor", [3, 1, 1]), ("global", [3, 5, 3])):
        algorithm = SCALA(SGD, 2, 3, missing_classes=treatment)
        algorithm.set_label_counts(torch.tensor(ALL_CLIENTS))
        used = algorithm.prior_counts(SCALALoss.CLIENT_PRIOR, make_client(LOCAL), server_counts)
        assert used.tolist() == counts


def test_flfcr_loss_never_sees_a_missing_class() -> None:
    # Eq. 13 lowers only the true-class logit, and a sample's own class is never missing: whatever
    # count a missing class gets, the loss is the same. So FL-FCR needs no missing_classes option;
    # its count choice is local vs summed counts (global_counts).
    logits, y = torch.tensor(LOGITS), torch.tensor(Y)
    values = {n: true_class_margin_cross_entropy(logits, y, torch.tensor([3, n, 1]), 1.0).item() for n in (0, 1, 1000)}
    assert values[0] == values[1] == values[1000]


def test_feded_default_weight_still_falls_linearly_along_a_common_shift() -> None:
    # logit_weight 0.005 slows the unbounded direction of L_logit by 200x; it does not remove it.
    algorithm = FedED(SGD, 1, 3, lam=0.0)
    client = make_client([2, 1, 1])
    algorithm.begin_local(torch.nn.Linear(3, 3), {}, client)
    base, y = torch.tensor(LOGITS + [[0.0, 1.0, 0.0], [1.0, 0.0, 2.0]]), torch.tensor([0, 2, 1, 0])
    values = [algorithm.local_loss(base - t, torch.zeros(4, 3), y, client).item() for t in (0.0, 100.0, 1000.0)]
    assert values[0] - values[1] == pytest.approx(0.005 * 100.0, rel=1e-4)
    assert values[0] - values[2] == pytest.approx(0.005 * 1000.0, rel=1e-4)


def test_feded_prior_is_built_in_the_logits_dtype() -> None:
    # counts [1, 1, 1] give p = 1/3, which float32 rounds; in float64 the loss must match a float64 hand sum.
    algorithm = FedED(SGD, 1, 3, lam=0.0, logit_weight=1.0)
    client = make_client([1, 1, 1])
    algorithm.begin_local(torch.nn.Linear(3, 3), {}, client)
    logits = torch.tensor([[0.3, -1.2, 2.0], [1.1, 0.4, -0.7], [0.0, 0.9, 0.2]], dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    rows = logits.tolist()
    l_cal = _ce_by_hand(rows, [0, 1, 2], [math.log(1 / 3)] * 3, [True] * 3)
    l_logit = sum((1 / 3) * math.log(sum(math.exp(rows[i][c]) for i in range(3) if i != c) / 3) for c in range(3))
    loss = algorithm.local_loss(logits, torch.zeros(3, 3, dtype=torch.float64), y, client)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(l_cal + l_logit, abs=1e-14)
