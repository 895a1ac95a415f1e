"""Federated methods: FedLC's calibrated loss, FedProx's proximal step, FedAvg's aggregation,
hyperparameter checking, learning on digits and robustness on degenerate clients.

Every expected value is computed by hand (literals, `math`, or numpy written out
independently of the implementation), never by calling the code under test.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedskew.config import load_params
from fedskew.engine.rounds import train_client
from fedskew.engine.simulation import run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientUpdate, TrainingSettings, local_optimizer
from fedskew.fl.fedavg import FedAvg
from fedskew.fl.fedlc import FedLC
from fedskew.fl.fedprox import FedProx
from fedskew.fl.losses import logit_calibrated_cross_entropy
from fedskew.fl.server_math import weighted_average
from fedskew.models import build_model
from tests.helpers import DIGITS_INFO, TinyNet, random_digits
from tests.helpers import make_client as _client

METHODS = ["fedavg", "fedprox", "fedlc"]
PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=32, lr=0.1, momentum=0.0, weight_decay=0.0)


def _ce_by_hand(row: list[float], y: int, exclude: set[int] = frozenset()) -> float:
    """-log softmax(row)[y] over the classes not in `exclude`, with math.exp/math.log."""
    denominator = sum(math.exp(z) for c, z in enumerate(row) if c not in exclude)
    return -row[y] + math.log(denominator)


# --------------------------------------------------------------------------- FedLC loss

def test_fedlc_loss_all_classes_present_matches_hand_computation() -> None:
    # counts [16, 1, 81], tau = 1: margins 16^(-1/4) = 1/2, 1^(-1/4) = 1, 81^(-1/4) = 1/3.
    margins = [0.5, 1.0, 1.0 / 3.0]
    logits = [[2.0, 1.0, 0.5], [-1.0, 0.25, 3.0]]
    targets = [0, 2]
    expected = sum(_ce_by_hand([z - m for z, m in zip(row, margins)], y)
                   for row, y in zip(logits, targets)) / 2
    # first row by hand: z' = [1.5, 0, 1/6]; -1.5 + log(4.4817 + 1 + 1.1814) = -1.5 + 1.8966 ≈ 0.3966
    assert _ce_by_hand([1.5, 0.0, 1 / 6], 0) == pytest.approx(0.39658, abs=1e-4)

    loss = logit_calibrated_cross_entropy(torch.tensor(logits), torch.tensor(targets),
                                          torch.tensor([16, 1, 81]), tau=1.0)
    assert loss.item() == pytest.approx(expected, abs=1e-6)

    fedlc = FedLC(PLAIN_SGD, num_clients=1, num_classes=3)  # default tau = 1.0
    via_method = fedlc.local_loss(torch.tensor(logits), torch.zeros(2, 4), torch.tensor(targets),
                                  _client([16, 1, 81]))
    assert via_method.item() == pytest.approx(expected, abs=1e-6)


def test_fedlc_tau_scales_the_margins() -> None:
    tau = 0.5
    margins = [tau * 0.5, tau * 1.0, tau / 3.0]
    row = [2.0, 1.0, 0.5]
    expected = _ce_by_hand([z - m for z, m in zip(row, margins)], 1)
    fedlc = FedLC(PLAIN_SGD, num_clients=1, num_classes=3, tau=tau)
    loss = fedlc.local_loss(torch.tensor([row]), torch.zeros(1, 4), torch.tensor([1]), _client([16, 1, 81]))
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_fedlc_missing_class_is_masked_exactly() -> None:
    counts = [10, 0, 5]
    m0, m2 = 10 ** -0.25, 5 ** -0.25
    targets = [0, 2]
    for masked_logit in (-5.0, 0.0, 100.0):  # whatever the missing class's logit, it must not count
        logits = torch.tensor([[1.0, masked_logit, 2.0], [0.5, masked_logit, -0.5]], requires_grad=True)
        expected = (_ce_by_hand([1.0 - m0, 0.0, 2.0 - m2], 0, exclude={1})
                    + _ce_by_hand([0.5 - m0, 0.0, -0.5 - m2], 2, exclude={1})) / 2
        loss = logit_calibrated_cross_entropy(logits, torch.tensor(targets), torch.tensor(counts), tau=1.0)
        assert math.isfinite(loss.item())
        assert loss.item() == pytest.approx(expected, abs=1e-6)
        loss.backward()
        assert torch.isfinite(logits.grad).all()
        assert torch.equal(logits.grad[:, 1], torch.zeros(2))
        # the other columns get the usual softmax-minus-onehot gradient (over the two kept classes)
        a, b = 1.0 - m0, 2.0 - m2
        p0 = math.exp(a) / (math.exp(a) + math.exp(b))
        assert logits.grad[0, 0].item() == pytest.approx((p0 - 1) / 2, abs=1e-6)
        assert logits.grad[0, 2].item() == pytest.approx((1 - p0) / 2, abs=1e-6)


def test_fedlc_tau_zero_is_plain_cross_entropy() -> None:
    logits = [[2.0, 1.0, 0.5], [-1.0, 0.25, 3.0], [0.0, 0.0, 0.0]]
    targets = [0, 2, 1]
    expected = sum(_ce_by_hand(row, y) for row, y in zip(logits, targets)) / 3
    loss = logit_calibrated_cross_entropy(torch.tensor(logits), torch.tensor(targets),
                                          torch.tensor([16, 1, 81]), tau=0.0)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    fedlc = FedLC(PLAIN_SGD, num_clients=1, num_classes=3, tau=0.0)
    fedavg = FedAvg(PLAIN_SGD, num_clients=1, num_classes=3)
    args = (torch.tensor(logits), torch.zeros(3, 4), torch.tensor(targets), _client([16, 1, 81]))
    assert fedlc.local_loss(*args).item() == pytest.approx(expected, abs=1e-6)
    assert fedavg.local_loss(*args).item() == pytest.approx(expected, abs=1e-6)


def test_fedlc_keeps_true_class_in_denominator() -> None:
    # Paper's Eq. 7 literally: -log( e^{z'_y} / sum_{i != y} e^{z'_i} ); implementations keep i = y.
    margins = [0.5, 1.0, 1.0 / 3.0]
    row, y = [2.0, 1.0, 0.5], 0
    adjusted = [z - m for z, m in zip(row, margins)]
    full = _ce_by_hand(adjusted, y)
    paper = -adjusted[y] + math.log(sum(math.exp(adjusted[i]) for i in range(3) if i != y))
    # The two forms are related by full = log(1 + e^paper) (softplus), so they differ.
    assert full == pytest.approx(math.log1p(math.exp(paper)), abs=1e-12)
    assert abs(full - paper) > 0.1

    loss = logit_calibrated_cross_entropy(torch.tensor([row]), torch.tensor([y]), torch.tensor([16, 1, 81]), 1.0)
    assert loss.item() == pytest.approx(full, abs=1e-6)
    assert abs(loss.item() - paper) > 0.1
    assert loss.item() > 0  # the Σ_{i≠y} form can be negative (here -1.5 + log(1 + e^(1/6)) ≈ -0.72), a true CE cannot
    assert paper < 0


# --------------------------------------------------------------------------- FedProx

W_T = np.array([[0.5, -0.5], [0.25, 1.0]])   # the round's global model (anchor)
B_T = np.array([0.0, 0.1])
W_NOW = np.array([[0.75, -0.5], [0.0, 1.5]])  # where the client is when the step happens
B_NOW = np.array([0.2, 0.1])
X = np.array([[1.0, 2.0]])
Y = 0


def _tiny(weight: np.ndarray, bias: np.ndarray) -> TinyNet:
    model = TinyNet()
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor(weight))
        model.head.bias.copy_(torch.tensor(bias))
    return model


def _placed_at_anchor_then_moved(algorithm):
    """Load the global model, let the method start its local phase, then move to W_NOW; the model and its client."""
    model, client = _tiny(W_T, B_T), _client([1, 0])
    algorithm.begin_local(model, {k: v.clone() for k, v in model.state_dict().items()}, client)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor(W_NOW))
        model.head.bias.copy_(torch.tensor(B_NOW))
    return model, client


def _ce_grad_by_hand(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d CE / d(W, b) for one sample: (softmax(z) - onehot(y)) x^T and softmax(z) - onehot(y)."""
    z = weight @ X[0] + bias
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    delta = p - np.eye(2)[Y]
    return np.outer(delta, X[0]), delta


def test_fedprox_after_backward_adds_mu_times_distance_to_anchor() -> None:
    mu = 0.1
    prox = FedProx(PLAIN_SGD, num_clients=1, num_classes=2, mu=mu)
    model, client = _placed_at_anchor_then_moved(prox)
    model.head.weight.grad = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    model.head.bias.grad = torch.tensor([-0.5, 0.5])
    prox.after_backward(model, client)
    # g + mu (w - w_t): weight [[0.1 + 0.1*0.25, 0.2 + 0], [0.3 + 0.1*(-0.25), 0.4 + 0.1*0.5]]
    assert torch.allclose(model.head.weight.grad, torch.tensor([[0.125, 0.2], [0.275, 0.45]]), atol=1e-7)
    # bias: [-0.5 + 0.1*0.2, 0.5 + 0]
    assert torch.allclose(model.head.bias.grad, torch.tensor([-0.48, 0.5]), atol=1e-7)


def test_fedprox_one_local_step_matches_hand_update() -> None:
    mu, lr = 0.5, 0.1
    settings = TrainingSettings(local_epochs=1, batch_size=32, lr=lr, momentum=0.0, weight_decay=0.0)
    prox = FedProx(settings, num_clients=1, num_classes=2, mu=mu)
    model, client = _placed_at_anchor_then_moved(prox)
    optimizer = local_optimizer(model.parameters(), prox.settings)
    prox.local_step(model, optimizer, torch.tensor(X, dtype=torch.float32), torch.tensor([Y]), client)

    g_w, g_b = _ce_grad_by_hand(W_NOW, B_NOW)
    expected_w = W_NOW - lr * (g_w + mu * (W_NOW - W_T))
    expected_b = B_NOW - lr * (g_b + mu * (B_NOW - B_T))
    assert np.allclose(model.head.weight.detach().numpy(), expected_w, atol=1e-6)
    assert np.allclose(model.head.bias.detach().numpy(), expected_b, atol=1e-6)
    # and the proximal term did matter: plain SGD would land elsewhere
    assert not np.allclose(model.head.weight.detach().numpy(), W_NOW - lr * g_w, atol=1e-4)


def test_fedprox_with_mu_zero_steps_like_fedavg() -> None:
    lr = 0.1
    settings = TrainingSettings(local_epochs=1, batch_size=32, lr=lr, momentum=0.0, weight_decay=0.0)
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor([Y])
    models = []
    for algorithm in (FedProx(settings, 1, 2, mu=0.0), FedAvg(settings, 1, 2)):
        model, client = _placed_at_anchor_then_moved(algorithm)
        algorithm.local_step(model, local_optimizer(model.parameters(), settings), x, y, client)
        models.append(model)
    prox_model, avg_model = models
    assert torch.equal(prox_model.head.weight, avg_model.head.weight)
    assert torch.equal(prox_model.head.bias, avg_model.head.bias)
    g_w, g_b = _ce_grad_by_hand(W_NOW, B_NOW)
    assert np.allclose(avg_model.head.weight.detach().numpy(), W_NOW - lr * g_w, atol=1e-6)
    assert np.allclose(avg_model.head.bias.detach().numpy(), B_NOW - lr * g_b, atol=1e-6)


# --------------------------------------------------------------------------- FedAvg aggregation

def test_weighted_average_weights_by_sample_counts() -> None:
    states = [{"w": torch.tensor([0.0, 4.0])}, {"w": torch.tensor([4.0, 8.0])}]
    out = weighted_average(states, [1, 3])
    # (1*[0, 4] + 3*[4, 8]) / 4 = [3, 7]
    assert torch.allclose(out["w"], torch.tensor([3.0, 7.0]), atol=1e-6)

    states = [{"w": torch.tensor([10.0])}, {"w": torch.tensor([20.0])}, {"w": torch.tensor([70.0])}]
    # 0.1*10 + 0.2*20 + 0.7*70 = 1 + 4 + 49 = 54
    assert weighted_average(states, [10, 20, 70])["w"].item() == pytest.approx(54.0, abs=1e-5)


def test_fedavg_aggregate_averages_bn_buffers_and_maxes_integer_buffers() -> None:
    bn = nn.BatchNorm1d(2)
    keys = set(bn.state_dict())
    assert {"running_mean", "running_var", "num_batches_tracked"} <= keys

    def state(mean, var, weight, tracked):
        return {"weight": torch.tensor(weight), "bias": torch.tensor([0.0, 0.0]),
                "running_mean": torch.tensor(mean), "running_var": torch.tensor(var),
                "num_batches_tracked": torch.tensor(tracked)}

    updates = [
        ClientUpdate(0, 30, state([1.0, -2.0], [1.0, 1.0], [1.0, 2.0], 7), num_steps=1, train_loss=0.0),
        ClientUpdate(1, 10, state([5.0, 2.0], [3.0, 5.0], [3.0, 6.0], 2), num_steps=1, train_loss=0.0),
    ]
    fedavg = FedAvg(PLAIN_SGD, num_clients=2, num_classes=2)
    out = fedavg.aggregate(state([0.0, 0.0], [1.0, 1.0], [1.0, 1.0], 0), updates, ["weight", "bias"])
    assert set(out) == keys
    # weights 30/40 = 0.75 and 10/40 = 0.25
    assert torch.allclose(out["running_mean"], torch.tensor([2.0, -1.0]), atol=1e-6)
    assert torch.allclose(out["running_var"], torch.tensor([1.5, 2.0]), atol=1e-6)
    assert torch.allclose(out["weight"], torch.tensor([1.5, 3.0]), atol=1e-6)
    assert out["num_batches_tracked"].dtype == torch.int64
    assert out["num_batches_tracked"].item() == 7  # max, not the weighted mean 5.75
    bn.load_state_dict(out)  # the result is a valid BatchNorm state


# --------------------------------------------------------------------------- hyperparameters

@pytest.mark.parametrize("cls, bad", [(FedAvg, "mu"), (FedProx, "muu"), (FedLC, "temperature"), (FedLC, "mu")])
def test_unknown_hyperparameter_raises_naming_it(cls, bad) -> None:
    with pytest.raises(ValueError, match=bad):
        cls(PLAIN_SGD, 4, 10, **{bad: 0.1})


def test_known_hyperparameters_override_defaults() -> None:
    assert FedProx(PLAIN_SGD, 4, 10, mu=0.5).hp["mu"] == 0.5
    assert FedLC(PLAIN_SGD, 4, 10, tau=0.1).hp["tau"] == 0.1
    assert set(ALGORITHMS) >= set(METHODS)


# --------------------------------------------------------------------------- every method learns

@pytest.fixture
def tiny_params(tiny_params):
    """One partition and one seed (faster `project` set-up); every method in the suite."""
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    tiny_params["suites"]["tiny"]["seeds"] = [0]
    tiny_params["suites"]["tiny"]["methods"] = list(METHODS)
    return tiny_params


@pytest.mark.parametrize("method", METHODS)
def test_every_method_learns_digits(project, tiny_params, method) -> None:
    params = copy.deepcopy(tiny_params)
    # 10 rounds reach ~0.8 accuracy for each method on this partition (chance is 0.1).
    params["training"]["tiny"].update(rounds=10, eval_every=5, checkpoint_every=10)
    cfg = load_params(params).run("tiny", "digits", "dir0.5", method, 0)
    result = run_training(cfg)
    assert [row["round"] for row in result.history] == list(range(1, 11))
    assert all(math.isfinite(row["train_loss"]) for row in result.history)
    assert result.final["final_round"] == 10
    assert result.final["final_acc"] > 0.5
    assert result.final["final_balanced_acc"] > 0.5
    # training made progress: the loss of the last round is well below that of the first
    assert result.history[-1]["train_loss"] < 0.5 * result.history[0]["train_loss"]


# --------------------------------------------------------------------------- robustness

@pytest.mark.parametrize("method", METHODS)
def test_single_class_client_trains_without_nan(method) -> None:
    x, y = random_digits()
    y[:20] = 3  # the client holds samples 0..19, all of class 3
    counts = torch.bincount(y[:20], minlength=10)
    assert counts.tolist() == [0, 0, 0, 20, 0, 0, 0, 0, 0, 0]
    settings = TrainingSettings(local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4)
    algorithm = ALGORITHMS[method](settings, num_clients=1, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, torch.arange(20)), "run-x")
    assert update.num_samples == 20
    assert update.num_steps == 2 * 3  # ceil(20 / 8) = 3 batches per epoch
    assert math.isfinite(update.train_loss)
    assert all(torch.isfinite(v).all() for v in update.state.values())
    if method == "fedlc":
        # Only class 3 is unmasked: log-softmax over one class is exactly 0, so is the loss.
        assert update.train_loss == 0.0
    else:
        assert update.train_loss > 0.0


@pytest.mark.parametrize("method", METHODS)
def test_single_class_client_update_is_exactly_zero_only_for_fedlc(method) -> None:
    x, y = random_digits()
    y[:20] = 3
    counts = torch.bincount(y[:20], minlength=10)
    algorithm = ALGORITHMS[method](PLAIN_SGD, num_clients=1, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, torch.arange(20)), "run-x")
    unchanged = all(torch.equal(update.state[k], global_state[k]) for k in global_state)
    # FedLC's gradient is exactly zero there (softmax over one class = onehot); CE's is not.
    assert unchanged == (method == "fedlc")


@pytest.mark.parametrize("method", METHODS)
def test_client_smaller_than_one_batch(method) -> None:
    x, y = random_digits()
    indices = torch.tensor([5, 17, 26])  # labels 5, 7, 6
    counts = torch.bincount(y[indices], minlength=10)
    settings = TrainingSettings(local_epochs=3, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    algorithm = ALGORITHMS[method](settings, num_clients=1, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, indices), "run-x")
    assert update.num_samples == 3
    assert update.num_steps == 3  # one (partial) batch per epoch
    assert math.isfinite(update.train_loss) and update.train_loss > 0
    assert all(torch.isfinite(v).all() for v in update.state.values())
    assert any(not torch.equal(update.state[k], global_state[k]) for k in global_state)

