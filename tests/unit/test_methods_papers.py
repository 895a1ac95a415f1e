"""FedLogit (SCALA Eq. 15), FedED (Eq. 2–6, Table 5 ablations) and FL-FCR (Eq. 3–6, 13, server retraining).

Every expected value is computed by hand (literals, `math`, or numpy written out
independently of the implementation), never by calling the code under test.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedskew import paths
from fedskew.engine.checkpoint import load_checkpoint
from fedskew.engine.rounds import NonFiniteError, train_client
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import TrainingSettings, trainable_parameters
from fedskew.fl.feded import FedED, empty_class_distillation, logit_suppression, logit_suppression_as_coded
from fedskew.fl.fedlogit import FedLogit
from fedskew.fl.flfcr import FLFCR
from fedskew.fl.flfcr_features import class_feature_statistics, pool_class_statistics, symmetric_unpack
from fedskew.fl.flfcr_retraining import retrain_head, sample_class_features
from fedskew.fl.losses import logit_adjusted_cross_entropy, true_class_margin_cross_entropy
from fedskew.fl.server_math import weighted_average
from fedskew.fl.traffic import tensor_bytes
from fedskew.models import build_model
from tests.helpers import DIGITS_INFO, method_config, random_digits, single_setting
from tests.helpers import make_client as _client

METHODS = ["fedlogit", "feded", "feded_dis", "feded_logit", "flfcr"]
PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=32, lr=0.1, momentum=0.0, weight_decay=0.0)
def _log_sum_exp(values) -> float:
    return math.log(sum(math.exp(v) for v in values))


# --------------------------------------------------------------------------- FedLogit (SCALA Eq. 15)

def test_logit_adjusted_ce_with_a_missing_class_matches_hand_computation() -> None:
    # counts [6, 0, 2]: p = [3/4, 0, 1/4]; class 1 is missing and must not count, whatever its logit.
    counts = [6, 0, 2]
    targets = [0, 2]
    for missing_logit in (-4.0, 0.0, 50.0):
        rows = [[1.0, missing_logit, 2.0], [0.5, missing_logit, -0.5]]
        # -log( p_y e^{z_y} / (p_0 e^{z_0} + p_2 e^{z_2}) ), written out:
        expected = sum(-(math.log(0.75 if y == 0 else 0.25) + row[y])
                       + math.log(0.75 * math.exp(row[0]) + 0.25 * math.exp(row[2]))
                       for row, y in zip(rows, targets)) / 2
        logits = torch.tensor(rows, requires_grad=True)
        loss = logit_adjusted_cross_entropy(logits, torch.tensor(targets), torch.tensor(counts))
        assert loss.item() == pytest.approx(expected, abs=1e-6)
        loss.backward()
        assert torch.isfinite(logits.grad).all()
        assert torch.equal(logits.grad[:, 1], torch.zeros(2))  # masked exactly: no push on a missing class
        via_method = FedLogit(PLAIN_SGD, 1, 3).local_loss(torch.tensor(rows), torch.zeros(2, 4),
                                                         torch.tensor(targets), _client(counts))
        assert via_method.item() == pytest.approx(expected, abs=1e-6)
    # a literal for the first row: z + log p = [1 + log .75, -, 2 + log .25] = [0.71232, -, 0.61371];
    # -0.71232 + log(e^0.71232 + e^0.61371) = -0.71232 + log(2.03871 + 1.84726) = 0.64506
    assert (-0.712318 + _log_sum_exp([0.712318, 0.613706])) == pytest.approx(0.645056, abs=1e-5)


def test_logit_adjustment_with_uniform_prior_is_plain_cross_entropy() -> None:
    rows, targets = [[2.0, 1.0, 0.5], [-1.0, 0.25, 3.0]], [0, 2]
    expected = sum(-row[y] + _log_sum_exp(row) for row, y in zip(rows, targets)) / 2
    loss = logit_adjusted_cross_entropy(torch.tensor(rows), torch.tensor(targets), torch.tensor([5, 5, 5]))
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_single_class_client_has_exactly_zero_fedlogit_loss() -> None:
    loss = logit_adjusted_cross_entropy(torch.tensor([[3.0, -1.0, 0.2]]), torch.tensor([1]), torch.tensor([0, 7, 0]))
    assert loss.item() == 0.0


# --------------------------------------------------------------------------- FedED terms

# A 4-class client with counts [3, 1, 0, 0]: prior p = [3/4, 1/4, 0, 0], empty classes {2, 3}.
ED_COUNTS = [3, 1, 0, 0]
ED_Y = [0, 0, 1]
ED_LOGITS = [[1.0, 0.0, 0.5, -0.5],
             [0.2, 0.4, 1.5, 0.0],
             [-1.0, 2.0, 0.0, 1.0]]
ED_TEACHER = [[0.0, 0.0, 0.0, 1.0],
              [1.0, 1.0, 1.0, 1.0],
              [0.0, 0.0, 2.0, -1.0]]


def _hand_l_cal(rows, ys, counts) -> float:
    total = sum(counts)
    prior = [n / total for n in counts]
    out = 0.0
    for row, y in zip(rows, ys):
        denominator = sum(p * math.exp(z) for p, z in zip(prior, row) if p > 0)
        out += -math.log(prior[y] * math.exp(row[y]) / denominator)
    return out / len(rows)


def _hand_l_dis(rows, teacher_rows, empty) -> float:
    out = 0.0
    for row, teacher in zip(rows, teacher_rows):
        zs = [row[o] for o in empty]
        zg = [teacher[o] for o in empty]
        q = [math.exp(z) / sum(math.exp(v) for v in zs) for z in zs]
        qg = [math.exp(z) / sum(math.exp(v) for v in zg) for z in zg]
        out += sum(g * math.log(g / s) for g, s in zip(qg, q))
    return out / len(rows)


def _hand_l_logit_ed() -> float:
    # c = 0 (p = 3/4): only sample 3 has y != 0 -> L^0 = log(e^{-1.0} / 3) = -1 - log 3
    # c = 1 (p = 1/4): samples 1 and 2 have y != 1 -> L^1 = log((e^{0.0} + e^{0.4}) / 3)
    l0 = -1.0 - math.log(3)
    l1 = math.log((math.exp(0.0) + math.exp(0.4)) / 3)
    return 0.75 * l0 + 0.25 * l1


def test_feded_distillation_term_by_hand() -> None:
    expected = _hand_l_dis(ED_LOGITS, ED_TEACHER, [2, 3])
    # sample 1 by hand: q = softmax([0.5, -0.5]) = [0.73106, 0.26894], q^g = [0.26894, 0.73106];
    # KL = 0.26894 log(0.26894/0.73106) + 0.73106 log(0.73106/0.26894) = 0.46212
    assert _hand_l_dis(ED_LOGITS[:1], ED_TEACHER[:1], [2, 3]) == pytest.approx(0.462117, abs=1e-5)
    empty = torch.tensor(ED_COUNTS) == 0
    got = empty_class_distillation(torch.tensor(ED_LOGITS), torch.tensor(ED_TEACHER), empty)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    assert got.item() > 0  # KL(q^g || q), not the printed -KL (see the module docstring)
    # identical outputs on the empty classes (whatever the other logits) give 0
    shifted = torch.tensor(ED_LOGITS)
    same = shifted.clone()
    same[:, 0] += 5.0
    assert empty_class_distillation(same, shifted, empty).item() == pytest.approx(0.0, abs=1e-7)


def test_feded_distillation_is_zero_without_or_with_one_empty_class() -> None:
    logits, teacher = torch.tensor(ED_LOGITS), torch.tensor(ED_TEACHER)
    assert empty_class_distillation(logits, teacher, torch.tensor([False] * 4)).item() == 0.0
    assert empty_class_distillation(logits, teacher, torch.tensor([False, False, True, False])).item() == 0.0


def test_feded_logit_suppression_by_hand() -> None:
    expected = _hand_l_logit_ed()
    # L^0 = -1 - log 3 = -2.098612; L^1 = log((1 + 1.491825) / 3) = -0.185597
    assert expected == pytest.approx(0.75 * (-2.098612) + 0.25 * (-0.185597), abs=1e-5)
    prior = torch.tensor([0.75, 0.25, 0.0, 0.0])
    got = logit_suppression(torch.tensor(ED_LOGITS), torch.tensor(ED_Y), prior)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_feded_logit_suppression_drops_a_class_whose_batch_has_only_its_own_label() -> None:
    # All samples are class 0: E[1(y != 0) e^{z_0}] is empty -> no term for c = 0; class 1 (p = 1/2)
    # has both samples: L^1 = log((e^{0.3} + e^{-0.7}) / 2).
    logits = torch.tensor([[1.0, 0.3], [2.0, -0.7]], requires_grad=True)
    got = logit_suppression(logits, torch.tensor([0, 0]), torch.tensor([0.5, 0.5]))
    assert got.item() == pytest.approx(0.5 * math.log((math.exp(0.3) + math.exp(-0.7)) / 2), abs=1e-6)
    got.backward()
    assert torch.isfinite(logits.grad).all() and torch.equal(logits.grad[:, 0], torch.zeros(2))
    # single-class client: nothing to suppress at all
    assert logit_suppression(logits.detach(), torch.tensor([0, 0]), torch.tensor([1.0, 0.0])).item() == 0.0


class LinearNet(nn.Module):
    """logits = W x + b with an identity body: the teacher's logits are easy to set by hand."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Identity()
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _teacher_setup(algorithm, counts, teacher_rows):
    """A global model whose outputs on x = I_3 are `teacher_rows`; begin_local loads it as the teacher."""
    model = LinearNet(3, 4)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor(teacher_rows).T)
        model.head.bias.zero_()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    client = _client(counts)
    algorithm.begin_local(model, global_state, client)
    with torch.no_grad():  # the local model moves on; the teacher must not
        model.head.weight.add_(1.0)
    return model, client, torch.eye(3)


def test_feded_total_and_ablations_match_hand_sums() -> None:
    lam = 0.1
    l_cal = _hand_l_cal(ED_LOGITS, ED_Y, ED_COUNTS)
    l_dis = _hand_l_dis(ED_LOGITS, ED_TEACHER, [2, 3])
    l_logit = _hand_l_logit_ed()
    expected = {"feded": l_cal + lam * l_dis + l_logit, "feded_dis": l_cal + lam * l_dis,
                "feded_logit": l_cal + l_logit}
    printed_weight = {"feded": {"logit_weight": 1.0}, "feded_logit": {"logit_weight": 1.0}, "feded_dis": {}}
    for name, value in expected.items():
        algorithm = ALGORITHMS[name](PLAIN_SGD, 1, 4, **printed_weight[name])
        _, client, x = _teacher_setup(algorithm, ED_COUNTS, ED_TEACHER)
        loss = algorithm.local_loss(torch.tensor(ED_LOGITS), torch.zeros(3, 3), torch.tensor(ED_Y), client, x=x)
        assert loss.item() == pytest.approx(value, abs=1e-6), name
    # the default weighs L_logit by 0.005 (the documented deviation from Eq. 6's weight 1)
    assert FedED.defaults == {"missing_classes": "mask", "lam": 0.1, "logit_weight": 0.005,
                                     "logit_form": "paper"}
    algorithm = FedED(PLAIN_SGD, 1, 4)
    _, client, x = _teacher_setup(algorithm, ED_COUNTS, ED_TEACHER)
    loss = algorithm.local_loss(torch.tensor(ED_LOGITS), torch.zeros(3, 3), torch.tensor(ED_Y), client, x=x)
    assert loss.item() == pytest.approx(l_cal + lam * l_dis + 0.005 * l_logit, abs=1e-6)


def test_feded_client_without_empty_class_has_no_distillation() -> None:
    counts = [2, 1, 1, 1]  # no empty class: L = L_cal + L_logit exactly, no teacher needed (x = None)
    logits = [[1.0, 0.0, 0.5, -0.5], [0.2, 0.4, 1.5, 0.0], [-1.0, 2.0, 0.0, 1.0], [0.3, 0.1, -0.2, 0.9],
              [0.0, 0.0, 1.0, 1.0]]
    ys = [0, 0, 1, 2, 3]
    prior = [0.4, 0.2, 0.2, 0.2]
    l_logit = 0.0
    for c in range(4):
        others = [row[c] for row, y in zip(logits, ys) if y != c]
        l_logit += prior[c] * math.log(sum(math.exp(z) for z in others) / 5)
    expected = _hand_l_cal(logits, ys, counts) + l_logit
    for name, value in (("feded", expected), ("feded_dis", _hand_l_cal(logits, ys, counts))):
        weight = {"logit_weight": 1.0} if name == "feded" else {}
        algorithm = ALGORITHMS[name](PLAIN_SGD, 1, 4, lam=10.0, **weight)
        algorithm.begin_local(LinearNet(3, 4), LinearNet(3, 4).state_dict(), _client(counts))
        loss = algorithm.local_loss(torch.tensor(logits), torch.zeros(5, 3), torch.tensor(ys), _client(counts))
        assert loss.item() == pytest.approx(value, abs=1e-6), name


def test_feded_teacher_is_one_frozen_module_reloaded_each_round() -> None:
    algorithm = FedED(PLAIN_SGD, 2, 4)
    model, client, x = _teacher_setup(algorithm, ED_COUNTS, ED_TEACHER)
    teacher = client.scratch["feded_teacher"]
    assert teacher is not model and teacher is not None
    assert all(not p.requires_grad for p in teacher.parameters())
    assert torch.allclose(teacher(x), torch.tensor(ED_TEACHER))  # the global model, not the moved local one
    # the same model's next round, another client: a new global state is loaded into the same module
    new_rows = [[1.0, 0.0, 0.0, 0.0]] * 3
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor(new_rows).T)
    second = _client(ED_COUNTS, client_id=1, round_=2)
    algorithm.begin_local(model, {k: v.clone() for k, v in model.state_dict().items()}, second)
    assert second.scratch["feded_teacher"] is teacher
    assert torch.allclose(teacher(x), torch.tensor(new_rows))
    # the gradient of L_dis reaches the student's logits only
    logits = torch.tensor(ED_LOGITS, requires_grad=True)
    algorithm.local_loss(logits, torch.zeros(3, 3), torch.tensor(ED_Y), second, x=x).backward()
    assert logits.grad is not None and all(p.grad is None for p in teacher.parameters())


def test_feded_loss_is_unbounded_below_in_a_common_logit_shift() -> None:
    # Why Eq. 6 as printed diverges in training: shifting every logit by -t leaves L_cal and L_dis
    # unchanged and lowers L_logit by t * sum_c p(c) = t.
    algorithm = FedED(PLAIN_SGD, 1, 4, logit_weight=1.0)
    _, client, x = _teacher_setup(algorithm, ED_COUNTS, ED_TEACHER)
    base = torch.tensor(ED_LOGITS)
    values = [algorithm.local_loss(base - t, torch.zeros(3, 3), torch.tensor(ED_Y), client, x=x).item()
              for t in (0.0, 1.0, 10.0)]
    assert values[0] - values[1] == pytest.approx(1.0, abs=1e-5)
    assert values[0] - values[2] == pytest.approx(10.0, abs=1e-4)


def _hand_l_logit_as_coded(rows, ys, prior) -> float:
    """The authors' code's L_logit, written out: each sample of class c adds e^0 = 1; the others
    e^{z_c - log p(c) + log(1/C)}; mean over the batch, log, weighted by p(c) over held classes."""
    classes, batch = len(prior), len(rows)
    out = 0.0
    for c, p in enumerate(prior):
        if p == 0:
            continue
        terms = [1.0 if y == c else math.exp(row[c] - math.log(p) + math.log(1 / classes))
                 for row, y in zip(rows, ys)]
        out += p * math.log(sum(terms) / batch)
    return out


def test_feded_logit_suppression_as_coded_by_hand() -> None:
    prior = [0.75, 0.25, 0.0, 0.0]
    expected = _hand_l_logit_as_coded(ED_LOGITS, ED_Y, prior)
    # c = 0: two own samples (1 each), sample 3 adds e^{-1 - log 3}; c = 1: e^0, e^0.4 and one own sample
    closed = 0.75 * math.log((2 + math.exp(-1.0) / 3) / 3) + 0.25 * math.log((1 + math.exp(0.4) + 1) / 3)
    assert expected == pytest.approx(closed, abs=1e-12)
    got = logit_suppression_as_coded(torch.tensor(ED_LOGITS), torch.tensor(ED_Y), torch.tensor(prior))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # the printed form differs on the same batch (the own samples add nothing there, no prior adjustment)
    assert abs(logit_suppression(torch.tensor(ED_LOGITS), torch.tensor(ED_Y), torch.tensor(prior)).item()
               - expected) > 0.1


def test_feded_as_coded_is_bounded_below_where_the_printed_form_runs_away() -> None:
    # Along the common shift z - t the printed L_logit falls by t (test above); the authors' code's
    # levels off at sum_c p(c) log(k_c / B), k_c = the batch's samples of class c (both classes held here).
    limit = 0.75 * math.log(2 / 3) + 0.25 * math.log(1 / 3)
    base = torch.tensor(ED_LOGITS)
    coded = FedED(PLAIN_SGD, 1, 4, logit_weight=1.0, logit_form="authors_code")
    printed = FedED(PLAIN_SGD, 1, 4, logit_weight=1.0)
    losses = {}
    for name, algorithm in (("coded", coded), ("printed", printed)):
        _, client, x = _teacher_setup(algorithm, ED_COUNTS, ED_TEACHER)
        losses[name] = [algorithm.local_loss(base - t, torch.zeros(3, 3), torch.tensor(ED_Y), client, x=x).item()
                        for t in (0.0, 30.0, 100.0)]
    l_cal_dis = _hand_l_cal(ED_LOGITS, ED_Y, ED_COUNTS) + 0.1 * _hand_l_dis(ED_LOGITS, ED_TEACHER, [2, 3])
    assert losses["coded"][0] == pytest.approx(l_cal_dis + _hand_l_logit_as_coded(ED_LOGITS, ED_Y, [0.75, 0.25, 0, 0]),
                                               abs=1e-6)
    assert losses["coded"][1] == pytest.approx(l_cal_dis + limit, abs=1e-6)
    assert losses["coded"][2] == pytest.approx(l_cal_dis + limit, abs=1e-6)
    assert losses["printed"][0] - losses["printed"][2] == pytest.approx(100.0, abs=1e-3)


def test_feded_refuses_an_unknown_logit_form() -> None:
    with pytest.raises(ValueError, match="logit_form must be one of .*authors_code.*paper.*got 'fedvls'"):
        FedED(PLAIN_SGD, 1, 4, logit_form="fedvls")


# --------------------------------------------------------------------------- FL-FCR loss (Eq. 13)

def test_flfcr_margin_loss_matches_eq13_by_hand() -> None:
    # N = [16, 1, 81], H = 1: Δ = [1/2, 1, 1/3]; only the true-class logit is lowered.
    rows, ys = [[2.0, 1.0, 0.5], [-1.0, 0.25, 3.0]], [0, 2]
    deltas = [0.5, 1.0, 1.0 / 3.0]
    expected = 0.0
    for row, y in zip(rows, ys):
        top = math.exp(row[y] - deltas[y])
        expected += -math.log(top / (top + sum(math.exp(z) for c, z in enumerate(row) if c != y)))
    expected /= 2
    # row 1 by hand: -log(e^1.5 / (e^1.5 + e^1 + e^0.5)) = -log(4.48169 / 8.84869) = 0.68027
    row_one = -math.log(math.exp(1.5) / (math.exp(1.5) + math.exp(1.0) + math.exp(0.5)))
    assert row_one == pytest.approx(0.68027, abs=1e-4)
    loss = true_class_margin_cross_entropy(torch.tensor(rows), torch.tensor(ys), torch.tensor([16, 1, 81]), 1.0)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # H scales the margins; H = 0 is plain cross entropy
    plain = sum(-row[y] + _log_sum_exp(row) for row, y in zip(rows, ys)) / 2
    assert true_class_margin_cross_entropy(torch.tensor(rows), torch.tensor(ys), torch.tensor([16, 1, 81]),
                                           0.0).item() == pytest.approx(plain, abs=1e-6)


def test_flfcr_uses_local_or_global_class_counts() -> None:
    rows, ys = [[2.0, 1.0, 0.5]], [0]
    own = [16, 0, 1]       # this client: N_0 = 16
    totals = [[16, 0, 1], [65, 3, 0]]  # over both clients: N_0 = 81 -> Δ_0 = 1/3

    def hand(delta: float) -> float:
        top = math.exp(2.0 - delta)
        return -math.log(top / (top + math.exp(1.0) + math.exp(0.5)))

    local = FLFCR(PLAIN_SGD, 2, 3, global_counts=0)
    client = _client(own, client_id=0)
    local.begin_local(LinearNet(3, 3), LinearNet(3, 3).state_dict(), client)
    assert local.local_loss(torch.tensor(rows), torch.zeros(1, 3), torch.tensor(ys), client).item() == \
        pytest.approx(hand(0.5), abs=1e-6)
    assert local.download_payload(client) == {}

    # with the engine's stub: all clients' counts given up front
    stub = FLFCR(PLAIN_SGD, 2, 3)  # default: global counts
    stub.set_label_counts(torch.tensor(totals))
    stub.begin_local(LinearNet(3, 3), LinearNet(3, 3).state_dict(), client)
    assert stub.local_loss(torch.tensor(rows), torch.zeros(1, 3), torch.tensor(ys), client).item() == \
        pytest.approx(hand(1 / 3), abs=1e-6)
    assert stub.download_payload(client)["class_counts"].tolist() == [81, 3, 1]

    # without it: what the server has heard from clients (saved with the algorithm state), plus
    # the client's own counts
    learned = FLFCR(PLAIN_SGD, 2, 3)
    assert learned.class_counts_for(client).tolist() == own
    learned.load_state_dict({"reported_counts": torch.tensor([[0, 0, 0], [65, 3, 0]])})
    learned.begin_local(LinearNet(3, 3), LinearNet(3, 3).state_dict(), client)
    assert learned.local_loss(torch.tensor(rows), torch.zeros(1, 3), torch.tensor(ys), client).item() == \
        pytest.approx(hand(1 / 3), abs=1e-6)
    assert torch.equal(learned.state_dict()["reported_counts"], torch.tensor([[0, 0, 0], [65, 3, 0]]))


# --------------------------------------------------------------------------- FL-FCR statistics (Eq. 3–6)

def _features_for_pooling():
    """Three clients, 3 classes, d = 4, including N_{c,k} = 1 and N_{c,k} = 0 cases."""
    rng = np.random.default_rng(7)
    labels = [np.array([0, 0, 0, 1, 2, 2]),      # class 1 once
              np.array([0, 1, 1, 1, 1]),         # class 0 once, no class 2
              np.array([2, 2, 2, 2, 0, 0, 0, 0])]
    feats = [rng.normal(loc=3.0, scale=2.0, size=(len(y), 4)) for y in labels]
    return feats, labels


def test_flfcr_client_statistics_are_eq3_and_unbiased_eq4() -> None:
    feats, labels = _features_for_pooling()
    counts, means, covs = class_feature_statistics(torch.tensor(feats[0]), torch.tensor(labels[0]), 3)
    assert counts.tolist() == [3, 1, 2]
    assert means.shape == (3, 4) and covs.shape == (2, 10)  # covariances only for N >= 2 (classes 0, 2)
    full = symmetric_unpack(covs, 4).numpy()
    for row, c in enumerate([0, 1, 2]):
        assert np.allclose(means[row].numpy(), feats[0][labels[0] == c].mean(axis=0), atol=1e-12)
    for row, c in enumerate([0, 2]):
        assert np.allclose(full[row], np.cov(feats[0][labels[0] == c], rowvar=False, ddof=1), atol=1e-12)


def test_flfcr_pooled_mean_and_covariance_equal_those_of_the_pooled_raw_features() -> None:
    feats, labels = _features_for_pooling()
    stats = [class_feature_statistics(torch.tensor(f), torch.tensor(y), 3) for f, y in zip(feats, labels)]
    total, mean, cov = pool_class_statistics(stats, 3, 4)
    pooled_x, pooled_y = np.concatenate(feats), np.concatenate(labels)
    assert total.tolist() == [8, 5, 6]
    cov = symmetric_unpack(cov, 4).numpy()
    for c in range(3):
        raw = pooled_x[pooled_y == c]
        assert np.allclose(mean[c].numpy(), raw.mean(axis=0), atol=1e-12, rtol=0)
        assert np.allclose(cov[c], np.cov(raw, rowvar=False, ddof=1), atol=1e-12, rtol=0)
    # and as the paper writes Eq. 6 (float64, so the cancellation is harmless here), for class 0:
    n_ck = [3, 1, 4]
    mus = [f[y == 0].mean(axis=0) for f, y in zip(feats, labels)]
    covs = [np.cov(f[y == 0], rowvar=False, ddof=1) if n >= 2 else np.zeros((4, 4))
            for f, y, n in zip(feats, labels, n_ck)]
    mu = sum(n * m for n, m in zip(n_ck, mus)) / 8
    eq6 = (sum((n - 1) / 7 * s for n, s in zip(n_ck, covs)) + sum(n / 7 * np.outer(m, m) for n, m in zip(n_ck, mus))
           - 8 / 7 * np.outer(mu, mu))
    assert np.allclose(cov[0], eq6, atol=1e-10)


def test_flfcr_class_seen_once_overall_has_no_covariance() -> None:
    stats = [class_feature_statistics(torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64),
                                      torch.tensor([0, 1]), 2)]
    total, mean, cov = pool_class_statistics(stats, 2, 2)
    assert total.tolist() == [1, 1]
    assert mean.tolist() == [[1.0, 2.0], [3.0, 5.0]]
    assert torch.equal(cov, torch.zeros(2, 3, dtype=torch.float64))


def test_flfcr_sampler_reproduces_mean_and_singular_covariance() -> None:
    mean = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    basis = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    cov = basis.T @ basis  # rank 2
    draws = sample_class_features(mean, cov, 40000, torch.Generator().manual_seed(0)).numpy()
    assert np.allclose(draws.mean(axis=0), mean.numpy(), atol=0.05)
    assert np.allclose(np.cov(draws, rowvar=False), cov.numpy(), atol=0.1)
    # the null direction of cov (orthogonal to both rows of `basis`) carries no variance
    null = np.array([2.0, -1.0, 1.0])
    assert np.abs((draws - mean.numpy()) @ null).max() < 1e-9
    again = sample_class_features(mean, cov, 5, torch.Generator().manual_seed(0))
    assert torch.equal(again, sample_class_features(mean, cov, 5, torch.Generator().manual_seed(0)))


def test_flfcr_retrain_head_fits_separable_virtual_features() -> None:
    gen = torch.Generator().manual_seed(1)
    features = torch.cat([torch.randn(50, 2, generator=gen) * 0.1 + torch.tensor([2.0, 0.0]),
                          torch.randn(50, 2, generator=gen) * 0.1 + torch.tensor([-2.0, 0.0])])
    labels = torch.tensor([0] * 50 + [1] * 50)
    weight, bias = torch.zeros(3, 2), torch.zeros(3)
    w, b = retrain_head(weight, bias, features, labels, torch.tensor([True, True, False]), epochs=5, lr=0.5,
                        batch_size=10, generator=gen)
    predictions = (features @ w.T + b)[:, :2].argmax(dim=1)
    assert torch.equal(predictions, labels)
    # the class without samples was masked: its row and bias are untouched
    assert torch.equal(w[2], torch.zeros(2)) and b[2].item() == 0.0
    assert torch.equal(weight, torch.zeros(3, 2))  # inputs are not modified in place


# --------------------------------------------------------------------------- FL-FCR through the hooks

def _flfcr_round(algorithm, clients, seed=0):
    """Train `clients` ((indices, client_id) pairs) from one global mlp; return global, updates, model."""
    x, y = random_digits()
    torch.manual_seed(seed)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    updates = []
    for indices, client_id in clients:
        indices = torch.as_tensor(indices)
        counts = torch.bincount(y[indices], minlength=10)
        client = _client(counts, indices, client_id=client_id, seed=100 + client_id)
        updates.append(train_client(algorithm, model, global_state, x, y, client, "run-x"))
    return global_state, updates, model, (x, y)


def test_flfcr_payload_holds_the_local_models_feature_statistics() -> None:
    algorithm = FLFCR(PLAIN_SGD, 1, 10)
    indices = torch.arange(23)  # classes 0-2 three times, 3-9 twice
    _, (update,), model, (x, y) = _flfcr_round(algorithm, [(indices, 0)])
    payload = update.payload
    assert payload["counts"].tolist() == [3, 3, 3, 2, 2, 2, 2, 2, 2, 2]
    model.load_state_dict(update.state)  # the trained local model
    with torch.no_grad():
        feats = model.body(x[indices]).double().numpy()
    labels = y[indices].numpy()
    d = feats.shape[1]
    assert payload["means"].shape == (10, d) and payload["covs"].shape == (10, d * (d + 1) // 2)
    covs = symmetric_unpack(payload["covs"].double(), d).numpy()
    for c in range(10):
        assert np.allclose(payload["means"][c].numpy(), feats[labels == c].mean(axis=0), atol=1e-5)
        assert np.allclose(covs[c], np.cov(feats[labels == c], rowvar=False, ddof=1), atol=1e-5)
    # uploaded bytes: the model plus counts (10 int64), means (10 x d) and packed covariances (float32)
    assert tensor_bytes(payload) == 10 * 8 + 10 * d * 4 + 10 * (d * (d + 1) // 2) * 4


def test_flfcr_retraining_changes_only_the_head_and_is_deterministic() -> None:
    algorithm = FLFCR(PLAIN_SGD, 2, 10)
    global_state, updates, _, _ = _flfcr_round(algorithm, [(torch.arange(0, 20), 0), (torch.arange(20, 40), 1)])
    averaged = weighted_average([u.state for u in updates], [u.num_samples for u in updates])
    parameters = trainable_parameters(build_model("mlp", DIGITS_INFO))
    out = algorithm.aggregate(global_state, updates, parameters)
    assert set(out) == set(averaged)
    for key in averaged:
        if key.startswith("head."):
            assert not torch.equal(out[key], averaged[key]), key
        else:
            assert torch.equal(out[key], averaged[key]), key
    assert torch.equal(FLFCR(PLAIN_SGD, 2, 10).aggregate(global_state, updates, parameters)["head.weight"],
                       out["head.weight"])
    # the server now knows both clients' label counts (state for the next round's margins)
    assert algorithm.state_dict()["reported_counts"].sum(dim=0).tolist() == [4] * 10
    # no retraining: FedAvg exactly
    plain = FLFCR(PLAIN_SGD, 2, 10, retrain_epochs=0).aggregate(global_state, updates, parameters)
    assert all(torch.equal(plain[k], averaged[k]) for k in averaged)


@pytest.mark.parametrize("bad", [{"global_counts": 2}, {"samples_per_class": -1}, {"H": -0.5}])
def test_flfcr_rejects_bad_hyperparameters(bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        FLFCR(PLAIN_SGD, 2, 10, **bad)


# --------------------------------------------------------------------------- robustness

@pytest.mark.parametrize("method", METHODS)
def test_single_class_client_trains_without_nan(method) -> None:
    x, y = random_digits()
    y[:20] = 3
    counts = torch.bincount(y[:20], minlength=10)
    settings = TrainingSettings(local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4)
    algorithm = ALGORITHMS[method](settings, num_clients=1, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, torch.arange(20)), "run-x")
    assert update.num_steps == 2 * 3
    assert math.isfinite(update.train_loss)
    assert all(torch.isfinite(v).all() for v in update.state.values())
    out = algorithm.aggregate(global_state, [update], trainable_parameters(model))
    assert all(torch.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize("method", METHODS)
def test_client_smaller_than_one_batch(method) -> None:
    x, y = random_digits()
    indices = torch.tensor([5, 17, 26])  # labels 5, 7, 6: every class seen once (no covariance at all)
    counts = torch.bincount(y[indices], minlength=10)
    settings = TrainingSettings(local_epochs=3, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    algorithm = ALGORITHMS[method](settings, num_clients=1, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, indices), "run-x")
    assert update.num_steps == 3
    assert math.isfinite(update.train_loss)
    assert all(torch.isfinite(v).all() for v in update.state.values())
    out = algorithm.aggregate(global_state, [update], trainable_parameters(model))
    assert all(torch.isfinite(v).all() for v in out.values())
    if method == "flfcr":  # nothing to sample from: the head stays the average
        assert torch.equal(out["head.weight"], update.state["head.weight"])


# --------------------------------------------------------------------------- learning and resuming

@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


def _cfg(tiny_params: dict, method: str, **training):
    return method_config(tiny_params, method, training, label="fedavg")


@pytest.mark.parametrize("method", ["fedlogit", "feded", "feded_dis", "feded_logit", "flfcr"])
def test_every_method_learns_digits(project, tiny_params, method) -> None:
    cfg = _cfg(tiny_params, method, rounds=10, eval_every=5, checkpoint_every=10)
    result = run_training(cfg)
    assert [row["round"] for row in result.history] == list(range(1, 11))
    assert all(math.isfinite(row["train_loss"]) for row in result.history)
    assert result.final["final_acc"] > 0.5
    assert result.final["final_balanced_acc"] > 0.5


def test_feded_with_the_printed_weight_of_l_logit_does_not_learn(project, tiny_params) -> None:
    # The evidence for the default logit_weight 0.005 (fedskew.fl.feded, point 4): Eq. 6 as
    # printed (weight 1) either becomes non-finite or stays far below what feded learns above.
    cfg = method_config(tiny_params, "feded", dict(rounds=10, eval_every=5, checkpoint_every=10),
                        label="fedavg", logit_weight=1.0)
    try:
        result = run_training(cfg)
    except NonFiniteError:
        return
    assert result.final["final_acc"] < 0.5


@pytest.mark.parametrize("method", ["fedlogit", "feded", "flfcr"])
def test_resume_gives_the_uninterrupted_history(project, tiny_params, method) -> None:
    cfg = _cfg(tiny_params, method)
    assert cfg.training["rounds"] == 4 and cfg.training["checkpoint_every"] == 2
    uninterrupted = run_training(cfg)
    shutil.rmtree(Path("results"))
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    checkpoint = load_checkpoint(Path(cfg.path(paths.CHECKPOINT_DIR)), cfg.run_id)
    assert checkpoint is not None and checkpoint["round"] == 2
    resumed = run_training(cfg)
    assert resumed.resumed_from == 2
    assert resumed.history == uninterrupted.history
    assert resumed.final == uninterrupted.final
    if method == "flfcr":
        assert set(checkpoint["algorithm_state"]) == {"reported_counts"}
        assert all(row["bytes_up"] > uninterrupted.history[0]["bytes_down"] for row in resumed.history)
