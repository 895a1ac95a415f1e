"""Optimiser-step and state methods: FedSAM's perturbed step and FedDyn's dynamic regulariser.

Every expected value is computed by hand (literals or plain arithmetic written out in the
test), never by calling the code under test. Beyond the hand-checked steps: both methods
learn digits, resume bit-identically, and survive degenerate clients.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from fedskew import paths
from fedskew.config import load_params
from fedskew.engine.checkpoint import load_checkpoint
from fedskew.engine.rounds import train_client
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientUpdate, FederatedAlgorithm, TrainingSettings, local_optimizer, trainable_parameters
from fedskew.fl.feddyn import FedDyn
from fedskew.fl.fedprox import FedProx
from fedskew.fl.fedsam import FedSAM
from fedskew.models import build_model
from tests.helpers import DIGITS_INFO, random_digits, single_setting
from tests.helpers import make_client as _client

METHODS = ["fedsam", "feddyn"]
LR = 0.1
PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=32, lr=LR, momentum=0.0, weight_decay=0.0)


def test_registered_with_paper_defaults() -> None:
    assert ALGORITHMS["fedsam"] is FedSAM and ALGORITHMS["feddyn"] is FedDyn
    assert FedSAM.defaults == {"rho": 0.05}
    assert FedDyn.defaults == {"alpha": 0.01}
    assert FedSAM(PLAIN_SGD, 4, 10, rho=0.1).hp["rho"] == 0.1
    with pytest.raises(ValueError, match="rh0"):
        FedSAM(PLAIN_SGD, 4, 10, rh0=0.1)
    with pytest.raises(ValueError, match="alpha"):
        FedDyn(PLAIN_SGD, 4, 10, alpha=0.0)  # θ_s uses h/α


# =========================================================================== FedSAM
#
# Model: logits = w·x + b (head Linear(2, 1), identity body), loss = mean_k ½(w·x_k + b − t_k)².
# Samples x_1 = [1, 0], x_2 = [0, 2], targets t = [0, 0]. At w = [2, 1], b = 0:
#   residuals r = [2, 2];  g_w = ½[r_1·1, r_2·2] = [1, 2];  g_b = ½(r_1 + r_2) = 2
#   ‖g‖ (over both tensors) = √(1 + 4 + 4) = 3
# With ρ = 0.3: e = ρ·g/‖g‖ = [0.1, 0.2 | 0.2], so w + e = [2.1, 1.2], b + e = 0.2
#   r' = [2.1 + 0.2, 2·1.2 + 0.2] = [2.3, 2.6];  g'_w = ½[2.3, 5.2] = [1.15, 2.6];  g'_b = ½·4.9 = 2.45
# and the step from w with lr 0.1: w = [2 − 0.115, 1 − 0.26] = [1.885, 0.74], b = −0.245.

class _Line(nn.Module):
    def __init__(self, weight=(2.0, 1.0), bias=0.0, batchnorm: bool = False) -> None:
        super().__init__()
        self.body = nn.BatchNorm1d(2, affine=False) if batchnorm else nn.Identity()
        self.head = nn.Linear(2, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([weight]))
            self.head.bias.fill_(bias)


class _SquaredLoss(FederatedAlgorithm):
    """A parent that only changes the loss: ½ mean squared residual (so gradients are by hand)."""

    def local_loss(self, logits, features, y, client, x=None):
        return 0.5 * ((logits.squeeze(1) - y) ** 2).mean()


class _SquaredSAM(FedSAM, _SquaredLoss):
    """FedSAM's step on _SquaredLoss's objective: also shows the loss composes through local_loss."""


class _SquaredSGD(_SquaredLoss):
    pass


class _SquaredSAMProx(FedSAM, FedProx, _SquaredLoss):
    """FedSAM + FedProx (+ the squared loss): the proximal term must act on the final gradient."""

    hyperparameters = {**FedSAM.defaults, **FedProx.defaults}


X2 = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
T2 = torch.tensor([0.0, 0.0])


def _step(algorithm, model, client=None) -> float:
    """One local step on X2, T2 (`client`: the one begin_local set up, if any)."""
    loss = algorithm.local_step(model, local_optimizer(model.parameters(), algorithm.settings), X2, T2,
                                client if client is not None else _client([2]))
    return loss.item()


def _params(model) -> tuple[list[float], float]:
    return model.head.weight.detach()[0].tolist(), model.head.bias.item()


def test_fedsam_step_uses_gradient_at_the_perturbed_point() -> None:
    model = _Line()
    loss = _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=0.3), model)
    weight, bias = _params(model)
    assert weight == pytest.approx([2 - LR * 1.15, 1 - LR * 2.6], abs=1e-6)
    assert weight == pytest.approx([1.885, 0.74], abs=1e-6)
    assert bias == pytest.approx(-0.245, abs=1e-6)
    # the reported loss is the one at w (before the ascent): ½·mean(2², 2²) = 2
    assert loss == pytest.approx(2.0, abs=1e-6)


def test_fedsam_uses_the_global_norm_over_all_parameters() -> None:
    # A per-tensor norm would ascend by ρ·[1, 2]/√5 on w and by ρ on b instead; then
    # r'_1 = 2 + 0.3/√5 + 0.3 and the first weight would move by LR·½·r'_1.
    per_tensor_r1 = 2 + 0.3 / math.sqrt(5) + 0.3
    model = _Line()
    _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=0.3), model)
    assert abs(_params(model)[0][0] - (2 - LR * 0.5 * per_tensor_r1)) > 1e-3


def test_fedsam_general_rho_matches_closed_form() -> None:
    # Same point, ρ = 0.05: e = ρ/3·[1, 2 | 2], r' = [2 + ρ/3 + 2ρ/3, 2 + 4ρ/3 + 2ρ/3] = [2 + ρ, 2 + 2ρ]
    rho = 0.05
    r1, r2 = 2 + rho, 2 + 2 * rho
    model = _Line()
    _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=rho), model)
    weight, bias = _params(model)
    assert weight == pytest.approx([2 - LR * 0.5 * r1, 1 - LR * 0.5 * 2 * r2], abs=1e-6)
    assert bias == pytest.approx(0 - LR * 0.5 * (r1 + r2), abs=1e-6)


def test_fedsam_with_rho_zero_is_plain_sgd() -> None:
    sam, sgd = _Line(), _Line()
    _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=0.0), sam)
    _step(_SquaredSGD(PLAIN_SGD, 1, 1), sgd)
    # plain SGD by hand: w − 0.1·[1, 2] = [1.9, 0.8], b − 0.1·2 = −0.2
    assert _params(sgd)[0] == pytest.approx([1.9, 0.8], abs=1e-6)
    assert _params(sgd)[1] == pytest.approx(-0.2, abs=1e-6)
    assert torch.equal(sam.head.weight, sgd.head.weight) and torch.equal(sam.head.bias, sgd.head.bias)

    # and with the default cross entropy on a real model, bit for bit like FedAvg
    x, y = random_digits()
    models = []
    for algorithm in (FedSAM(PLAIN_SGD, 1, 10, rho=0.0), ALGORITHMS["fedavg"](PLAIN_SGD, 1, 10)):
        torch.manual_seed(0)
        model = build_model("mlp", DIGITS_INFO)
        algorithm.local_step(model, local_optimizer(model.parameters(), PLAIN_SGD), x[:8], y[:8], _client([1] * 8))
        models.append(model)
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))


def test_fedsam_zero_gradient_is_guarded() -> None:
    # w = 0, b = 0, targets 0: every residual is 0, so g = 0 and ‖g‖ = 0; no ascent, no NaN.
    model = _Line(weight=(0.0, 0.0), bias=0.0)
    loss = _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=0.05), model)
    assert loss == 0.0
    assert _params(model) == ([0.0, 0.0], 0.0)


def test_fedsam_composes_with_fedprox_on_the_final_gradient() -> None:
    mu = 0.5
    algorithm = _SquaredSAMProx(PLAIN_SGD, 1, 1, rho=0.3, mu=mu)
    assert algorithm.hp == {"rho": 0.3, "mu": mu}
    model = _Line(weight=(1.0, 1.0), bias=0.0)  # the round's global model (FedProx's anchor)
    client = _client([2])
    algorithm.begin_local(model, {k: v.clone() for k, v in model.state_dict().items()}, client)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor([[2.0, 1.0]]))  # where the step happens: w − w_t = [1, 0]
    _step(algorithm, model, client)
    # The ascent uses the loss gradient only (as above); the descent adds μ(w − w_t) = [0.5, 0 | 0]:
    # w = [2 − 0.1·(1.15 + 0.5), 1 − 0.1·2.6] = [1.835, 0.74], b = −0.245
    weight, bias = _params(model)
    assert weight == pytest.approx([1.835, 0.74], abs=1e-6)
    assert bias == pytest.approx(-0.245, abs=1e-6)


def test_fedsam_counts_batchnorm_statistics_once_per_step() -> None:
    model = _Line(batchnorm=True)
    model.train()
    _step(_SquaredSAM(PLAIN_SGD, 1, 1, rho=0.05), model)
    bn = model.body
    # One update with momentum 0.1: batch mean [0.5, 1], unbiased batch variance [0.5, 2].
    assert bn.num_batches_tracked.item() == 1  # the probe at w + e is not counted
    assert bn.running_mean.tolist() == pytest.approx([0.05, 0.1], abs=1e-6)
    assert bn.running_var.tolist() == pytest.approx([0.9 + 0.05, 0.9 + 0.2], abs=1e-6)


# =========================================================================== FedDyn
#
# Two parameters (w, b) of logits = w·x + b, plus one float buffer `stat`; m = 3 clients,
# α = 0.5. Round 1 from θ_s = (1, 0): client 0 ends at (2, 1), client 1 at (0, 3).
#   g_0 = −α(θ_0 − θ_s) = −0.5·(1, 1) = (−0.5, −0.5);  g_1 = −0.5·(−1, 3) = (0.5, −1.5)
#   h = 0 − (α/m)·[(1, 1) + (−1, 3)] = −(1/6)·(0, 4) = (0, −2/3)
#   θ_s = mean(θ_i) − h/α = (1, 2) − (0, −4/3) = (1, 10/3)
# Round 2 from θ_s = (1, 10/3): client 0 ends at (1.5, 3), client 2 (new) at (1, 4).
#   gradient at (1.5, 3) with data gradient (0.2, −0.4):
#     (0.2, −0.4) − g_0 + α(θ − θ_s) = (0.2 + 0.5 + 0.25, −0.4 + 0.5 + 0.5·(3 − 10/3))
#   g_0 = (−0.5, −0.5) − 0.5·(0.5, −1/3) = (−0.75, −1/3);  g_2 = −0.5·(0, 2/3) = (0, −1/3)
#   h = (0, −2/3) − (0.5/3)·[(0.5, −1/3) + (0, 2/3)] = (−1/12, −2/3 − 1/18)
#   θ_s = ((1.5 + 1)/2, (3 + 4)/2) − h/0.5 = (1.25 + 1/6, 3.5 + 2·(2/3 + 1/18))

class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Identity()
        self.head = nn.Linear(1, 1)
        self.register_buffer("stat", torch.zeros(1))


SCALAR_PARAMETERS = trainable_parameters(_Scalar())  # head.weight, head.bias; `stat` is a buffer


def _scalar_state(w: float, b: float, stat: float = 0.0) -> dict[str, torch.Tensor]:
    return {"head.weight": torch.tensor([[w]]), "head.bias": torch.tensor([b]), "stat": torch.tensor([stat])}


def _wb(tensors: dict[str, torch.Tensor]) -> list[float]:
    return [tensors["head.weight"].item(), tensors["head.bias"].item()]


def _local_round(algorithm: FedDyn, model: _Scalar, global_state, client_id: int, end: tuple[float, float],
                 data_grad: tuple[float, float] = (0.0, 0.0), num_samples: int = 10, stat: float = 0.0):
    """A client's round: load θ_s, begin, move to `end`, one after_backward, upload; returns (grads, update)."""
    client = _client([num_samples], client_id=client_id)
    model.load_state_dict(global_state)
    algorithm.begin_local(model, global_state, client)
    model.load_state_dict(_scalar_state(*end, stat))
    model.head.weight.grad = torch.tensor([[data_grad[0]]])
    model.head.bias.grad = torch.tensor([data_grad[1]])
    algorithm.after_backward(model, client)
    grads = [model.head.weight.grad.item(), model.head.bias.grad.item()]
    payload = algorithm.end_local(model, client, num_steps=1)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return grads, ClientUpdate(client_id, num_samples, state, 1, 0.0, payload)


def test_feddyn_two_rounds_by_hand() -> None:
    alpha = 0.5
    dyn = FedDyn(PLAIN_SGD, num_clients=3, num_classes=1, alpha=alpha)
    model = _Scalar()
    theta_s = _scalar_state(1.0, 0.0)

    # ---- round 1: g_i = 0, so only α(θ − θ_s) is added to the data gradient
    grads, u0 = _local_round(dyn, model, theta_s, 0, (2.0, 1.0), data_grad=(0.1, 0.2), num_samples=10, stat=1.0)
    assert grads == pytest.approx([0.1 + 0.5 * 1, 0.2 + 0.5 * 1], abs=1e-6)
    assert u0.payload == {}  # g_i stays on the client
    _, u1 = _local_round(dyn, model, theta_s, 1, (0.0, 3.0), num_samples=30, stat=5.0)
    state = dyn.state_dict()
    assert _wb(state["client_grads"][0]) == pytest.approx([-0.5, -0.5], abs=1e-6)
    assert _wb(state["client_grads"][1]) == pytest.approx([0.5, -1.5], abs=1e-6)
    assert 2 not in state["client_grads"]  # never trained: zero, not stored

    theta_s = dyn.aggregate(theta_s, [u0, u1], SCALAR_PARAMETERS)
    assert _wb(dyn.state_dict()["h"]) == pytest.approx([0.0, -2 / 3], abs=1e-6)
    # unweighted mean of parameters (10 and 30 samples would give (0.5, 2.5) if weighted)
    assert _wb(theta_s) == pytest.approx([1.0, 10 / 3], abs=1e-6)
    # buffers: FedAvg's sample-weighted mean, 0.25·1 + 0.75·5 = 4
    assert theta_s["stat"].item() == pytest.approx(4.0, abs=1e-6)

    # ---- checkpoint round trip: round 2 runs on a fresh instance loaded from the state
    reloaded = FedDyn(PLAIN_SGD, num_clients=3, num_classes=1, alpha=alpha)
    reloaded.load_state_dict(copy.deepcopy(dyn.state_dict()))
    dyn = reloaded

    grads, u0 = _local_round(dyn, model, theta_s, 0, (1.5, 3.0), data_grad=(0.2, -0.4))
    assert grads == pytest.approx([0.2 + 0.5 + 0.25, -0.4 + 0.5 + 0.5 * (3 - 10 / 3)], abs=1e-6)
    assert grads == pytest.approx([0.95, -1 / 15], abs=1e-6)
    _, u2 = _local_round(dyn, model, theta_s, 2, (1.0, 4.0))
    state = dyn.state_dict()
    assert _wb(state["client_grads"][0]) == pytest.approx([-0.75, -1 / 3], abs=1e-6)
    assert _wb(state["client_grads"][1]) == pytest.approx([0.5, -1.5], abs=1e-6)  # not sampled: unchanged
    assert _wb(state["client_grads"][2]) == pytest.approx([0.0, -1 / 3], abs=1e-6)

    theta_s = dyn.aggregate(theta_s, [u0, u2], SCALAR_PARAMETERS)
    assert _wb(dyn.state_dict()["h"]) == pytest.approx([-1 / 12, -2 / 3 - 1 / 18], abs=1e-6)
    assert _wb(theta_s) == pytest.approx([1.25 + 1 / 6, 3.5 + 2 * (2 / 3 + 1 / 18)], abs=1e-5)


def test_feddyn_local_step_adds_linear_and_quadratic_terms() -> None:
    # Two real local steps with the squared loss of the FedSAM section.
    # θ_s = (w, b) = ([2, 1], 0), g_i = 0, first step at θ_s: the regulariser adds nothing,
    # so the step is plain SGD: [1.9, 0.8], −0.2 (see the FedSAM section).
    class SquaredDyn(FedDyn, _SquaredLoss):
        pass

    dyn = SquaredDyn(PLAIN_SGD, num_clients=3, num_classes=1, alpha=0.5)
    model = _Line()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    client = _client([2])
    dyn.begin_local(model, global_state, client)
    _step(dyn, model, client)
    assert _params(model)[0] == pytest.approx([1.9, 0.8], abs=1e-6)
    assert _params(model)[1] == pytest.approx(-0.2, abs=1e-6)
    # second step at ([1.9, 0.8], −0.2): residuals [1.7, 1.4]; data gradient ½[1.7, 2.8 | 3.1];
    # regulariser α(θ − θ_s) = 0.5·[−0.1, −0.2 | −0.2]
    _step(dyn, model, client)
    weight, bias = _params(model)
    assert weight == pytest.approx([1.9 - LR * (0.85 - 0.05), 0.8 - LR * (1.4 - 0.1)], abs=1e-6)
    assert bias == pytest.approx(-0.2 - LR * (1.55 - 0.1), abs=1e-6)


# =========================================================================== learning and resume

@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


SPECS = {"fedsam": {"algorithm": "fedsam", "rho": 0.05}, "feddyn": {"algorithm": "feddyn", "alpha": 0.01}}


def _cfg(tiny_params: dict, method: str, **training):
    """The tiny digits/dir0.5 run (4 clients, 2 per round) with `method` swapped in.

    The schema (and so load_params) is built for fedavg; the method is replaced afterwards.
    """
    cfg = load_params(copy.deepcopy(tiny_params)).run("tiny", "digits", "dir0.5", "fedavg", 0)
    return dataclasses.replace(cfg, method=method, method_spec=dict(SPECS[method]),
                               training={**cfg.training, **training})


def _clear_results() -> None:
    shutil.rmtree(Path("results"), ignore_errors=True)


@pytest.mark.parametrize("method", METHODS)
def test_learns_digits_without_collapsing(project, tiny_params, method) -> None:
    # 20 rounds: FedAvg reaches ~0.89 here, FedDyn (α = 0.01) ~0.95, FedSAM ~0.89; chance is 0.1.
    cfg = _cfg(tiny_params, method, rounds=20, eval_every=5, checkpoint_every=20)
    result = run_training(cfg)
    assert [row["round"] for row in result.history] == list(range(1, 21))
    assert all(math.isfinite(row["train_loss"]) for row in result.history)
    assert result.final["final_acc"] > 0.8
    assert result.final["final_balanced_acc"] > 0.8
    # no divergence (some public FedDyn ports collapse: docs/methods.md, "FedDyn's alpha"):
    # losses fall and stay down
    test_losses = [row["test_loss"] for row in result.history if "test_loss" in row]
    assert len(test_losses) == 4 and all(math.isfinite(v) for v in test_losses)
    assert test_losses[-1] < 0.5 * math.log(10)  # well below the uniform-guess loss ln 10
    assert result.history[-1]["train_loss"] < 0.25 * result.history[0]["train_loss"]
    assert max(row["train_loss"] for row in result.history[10:]) < 0.5 * result.history[0]["train_loss"]


@pytest.mark.parametrize("method", METHODS)
def test_resume_gives_the_uninterrupted_run(project, tiny_params, method) -> None:
    cfg = _cfg(tiny_params, method, rounds=4, checkpoint_every=2)
    directory = Path(cfg.path(paths.CHECKPOINT_DIR))
    uninterrupted = run_training(cfg)
    final_state = load_checkpoint(directory, cfg.run_id)
    _clear_results()

    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    checkpoint = load_checkpoint(directory, cfg.run_id)
    assert checkpoint["round"] == 2
    if method == "feddyn":
        # the client state and h are in the checkpoint, for the clients of rounds 1–2 only
        state = checkpoint["algorithm_state"]
        assert set(state) == {"h", "client_grads"} and state["h"]
        assert 1 <= len(state["client_grads"]) <= 4
    resumed = run_training(cfg)
    assert resumed.resumed_from == 2
    assert json.dumps(resumed.history, sort_keys=True) == json.dumps(uninterrupted.history, sort_keys=True)
    assert resumed.final == uninterrupted.final
    resumed_state = load_checkpoint(directory, cfg.run_id)
    for key, value in final_state["global_state"].items():
        assert torch.equal(resumed_state["global_state"][key], value), key


def test_feddyn_resume_depends_on_the_saved_state(project, tiny_params, monkeypatch) -> None:
    """The resume test above is sensitive: dropping FedDyn's state on load changes the run."""
    cfg = _cfg(tiny_params, "feddyn", rounds=4, checkpoint_every=2)
    uninterrupted = run_training(cfg)
    _clear_results()
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    monkeypatch.setattr(FedDyn, "load_state_dict", lambda self, state: None)
    forgetful = run_training(cfg)
    assert forgetful.history[:2] == uninterrupted.history[:2]
    assert forgetful.history[3]["test_loss"] != uninterrupted.history[3]["test_loss"]


# =========================================================================== robustness

def _train(method: str, settings: TrainingSettings, x, y, indices, counts):
    algorithm = ALGORITHMS[method](settings, num_clients=2, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(algorithm, model, global_state, x, y, _client(counts, indices), "run-x")
    new_global = algorithm.aggregate(global_state, [update], trainable_parameters(model))
    return global_state, update, new_global


def _all_finite(state) -> bool:
    return all(torch.isfinite(v).all() for v in state.values())


@pytest.mark.parametrize("method", METHODS)
def test_single_class_client_trains_without_nan(method) -> None:
    x, y = random_digits()
    y[:20] = 3
    counts = torch.bincount(y[:20], minlength=10)
    assert counts.tolist() == [0, 0, 0, 20, 0, 0, 0, 0, 0, 0]
    settings = TrainingSettings(local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4)
    global_state, update, new_global = _train(method, settings, x, y, torch.arange(20), counts)
    assert update.num_steps == 2 * 3  # ceil(20 / 8) = 3 batches per epoch
    assert math.isfinite(update.train_loss) and update.train_loss > 0
    assert _all_finite(update.state) and _all_finite(new_global)
    assert any(not torch.equal(update.state[k], global_state[k]) for k in global_state)


@pytest.mark.parametrize("method", METHODS)
def test_client_smaller_than_one_batch(method) -> None:
    x, y = random_digits()
    indices = torch.tensor([5, 17, 26])  # labels 5, 7, 6
    counts = torch.bincount(y[indices], minlength=10)
    settings = TrainingSettings(local_epochs=3, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    global_state, update, new_global = _train(method, settings, x, y, indices, counts)
    assert update.num_samples == 3 and update.num_steps == 3  # one partial batch per epoch
    assert math.isfinite(update.train_loss) and update.train_loss > 0
    assert _all_finite(update.state) and _all_finite(new_global)
    assert any(not torch.equal(update.state[k], global_state[k]) for k in global_state)


def test_single_sample_client_with_feddyn_state() -> None:
    """A one-sample client taking part twice: the stored g_i is used and stays finite."""
    x, y = random_digits()
    settings = TrainingSettings(local_epochs=2, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    dyn = FedDyn(settings, num_clients=2, num_classes=10)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    for round_ in (1, 2):
        client = _client(torch.bincount(y[[7]], minlength=10), torch.tensor([7]), round_=round_)
        update = train_client(dyn, model, global_state, x, y, client, "run-x")
        global_state = dyn.aggregate(global_state, [update], trainable_parameters(model))
        assert math.isfinite(update.train_loss) and _all_finite(global_state)
    assert set(dyn.state_dict()["client_grads"]) == {0}
    assert all(torch.isfinite(t).all() for t in dyn.state_dict()["client_grads"][0].values())
