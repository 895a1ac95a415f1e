"""Control-variate and server-side methods: SCAFFOLD, FedNova, FedAdam/FedYogi/FedAdagrad, FedEXP.

Every expected value is computed by hand (literals, or the paper's formula written out
as plain arithmetic on Python floats), never by calling the code under test. Then
each method learns digits, resumes bit-identically, and survives degenerate clients.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from fedskew import paths
from fedskew.engine.checkpoint import load_checkpoint
from fedskew.engine.rounds import train_client
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientUpdate, TrainingSettings, trainable_parameters
from fedskew.fl.fedexp import FedExp
from fedskew.fl.fednova import FedNova
from fedskew.fl.fedopt import FedAdagrad, FedAdam, FedYogi
from fedskew.fl.scaffold import Scaffold
from fedskew.fl.server_math import normalizing_factor
from fedskew.fl.traffic import tensor_bytes
from fedskew.models import build_model
from tests.helpers import DIGITS_INFO, TinyNet, method_config, random_digits, single_setting
from tests.helpers import make_client as _client

METHODS = ["scaffold", "fednova", "fedadam", "fedyogi", "fedadagrad", "fedexp"]
PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=1, lr=0.1, momentum=0.0, weight_decay=0.0)


def _settings(**changes) -> TrainingSettings:
    return dataclasses.replace(PLAIN_SGD, **changes)


def _update(client_id: int, n: int, state: dict, steps: int = 1, payload: dict | None = None) -> ClientUpdate:
    return ClientUpdate(client_id, n, state, num_steps=steps, train_loss=0.0, payload=payload or {})


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _close(tensor: torch.Tensor, expected, tol: float = 1e-6) -> bool:
    return torch.allclose(tensor, _t(expected), atol=tol, rtol=0)


class ParamAndBuffers(nn.Module):
    """Two parameters (w) plus a float and an integer buffer, like BatchNorm's."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))
        self.register_buffer("running_mean", torch.zeros(2))
        self.register_buffer("num_batches_tracked", torch.tensor(0))


def _state(w, running_mean=(0.0, 0.0), tracked: int = 0) -> dict:
    return {"w": _t(w), "running_mean": _t(running_mean), "num_batches_tracked": torch.tensor(tracked)}


W = trainable_parameters(ParamAndBuffers())  # ("w",): the rest of _state is buffers


# --------------------------------------------------------------------------- registry

def test_methods_are_registered_with_paper_defaults() -> None:
    assert ALGORITHMS["scaffold"] is Scaffold and ALGORITHMS["fednova"] is FedNova
    assert ALGORITHMS["fedadam"] is FedAdam and ALGORITHMS["fedyogi"] is FedYogi
    assert ALGORITHMS["fedadagrad"] is FedAdagrad and ALGORITHMS["fedexp"] is FedExp
    assert "_serveroptimizer" not in ALGORITHMS and "parameterawarealgorithm" not in ALGORITHMS
    assert Scaffold.defaults == {} and FedNova.defaults == {}
    assert FedAdam.defaults == {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    assert FedYogi.defaults == {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    assert FedAdagrad.defaults == {"server_lr": 0.1, "beta1": 0.9, "tau": 1e-3}
    assert FedExp.defaults == {"epsilon": 1e-3, "average_last_two": True}


@pytest.mark.parametrize("cls, bad", [(FedAdagrad, "beta2"), (Scaffold, "server_lr"), (FedNova, "momentum"),
                                      (FedExp, "eps")])
def test_unknown_hyperparameter_raises(cls, bad) -> None:
    with pytest.raises(ValueError, match=bad):
        cls(PLAIN_SGD, 4, 10, **{bad: 0.1})


@pytest.mark.parametrize("cls, bad", [(FedAdam, {"tau": 0.0}), (FedYogi, {"beta2": 1.0}),
                                      (FedAdam, {"server_lr": -1.0}), (FedExp, {"epsilon": -1.0})])
def test_invalid_hyperparameter_values_raise(cls, bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        cls(PLAIN_SGD, 4, 10, **bad)


# --------------------------------------------------------------------------- SCAFFOLD

# c and c_1 for TinyNet (head.weight 2x2, head.bias 2), and their difference c - c_1.
C = {"head.weight": [[0.2, 0.0], [0.0, 0.2]], "head.bias": [0.1, -0.1]}
C1 = {"head.weight": [[0.1, 0.1], [0.0, 0.0]], "head.bias": [0.0, 0.2]}
C_MINUS_C1 = {"head.weight": [[0.1, -0.1], [0.0, 0.2]], "head.bias": [0.1, -0.3]}
W0, B0 = [[0.5, -0.5], [0.25, 1.0]], [0.0, 0.1]


def _tiny(weight=W0, bias=B0) -> TinyNet:
    model = TinyNet()
    with torch.no_grad():
        model.head.weight.copy_(_t(weight))
        model.head.bias.copy_(_t(bias))
    return model


def _with_controls(algorithm: Scaffold) -> Scaffold:
    algorithm.load_state_dict({"c": {k: _t(v) for k, v in C.items()},
                               "client_c": {1: {k: _t(v) for k, v in C1.items()}}})
    return algorithm


def test_scaffold_control_variates_start_at_zero_and_travel_both_ways() -> None:
    scaffold = Scaffold(PLAIN_SGD, num_clients=5, num_classes=2)
    model = scaffold.adapt_model(_tiny())
    state = scaffold.state_dict()
    assert state["client_c"] == {}
    assert set(state["c"]) == {"head.weight", "head.bias"}
    assert all(torch.equal(t, torch.zeros_like(t)) for t in state["c"].values())
    assert state["c"]["head.weight"].shape == (2, 2) and state["c"]["head.bias"].shape == (2,)

    # The server sends c with the model: 6 floats = 24 bytes.
    client = _client([3, 0], client_id=2)
    download = scaffold.download_payload(client)
    assert tensor_bytes(download) == 24 and set(download["c"]) == {"head.weight", "head.bias"}

    # A never-seen client starts from c_i = 0 and uploads Δc_i, also 24 bytes.
    x = _t([[1.0, 2.0]] * 3)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    update = train_client(scaffold, model, global_state, x, torch.zeros(3, dtype=torch.int64), client, "run")
    assert tensor_bytes(update.payload) == 24
    assert set(update.payload["delta_c"]) == {"head.weight", "head.bias"}
    assert set(scaffold.state_dict()["client_c"]) == {2}


def test_scaffold_after_backward_adds_c_minus_ci() -> None:
    scaffold = _with_controls(Scaffold(PLAIN_SGD, num_clients=5, num_classes=2))
    model = _tiny()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    g_w, g_b = [[1.0, 2.0], [-1.0, -2.0]], [1.0, -1.0]

    client = _client([1, 0], client_id=1)
    scaffold.begin_local(model, global_state, client)
    model.head.weight.grad, model.head.bias.grad = _t(g_w), _t(g_b)
    scaffold.after_backward(model, client)
    # g + c - c_1: [[1 + 0.1, 2 - 0.1], [-1 + 0, -2 + 0.2]] and [1 + 0.1, -1 - 0.3]
    assert _close(model.head.weight.grad, [[1.1, 1.9], [-1.0, -1.8]])
    assert _close(model.head.bias.grad, [1.1, -1.3])

    # client 3 has no c_i yet (zero): g + c
    client = _client([1, 0], client_id=3)
    scaffold.begin_local(model, global_state, client)
    model.head.weight.grad, model.head.bias.grad = _t(g_w), _t(g_b)
    scaffold.after_backward(model, client)
    assert _close(model.head.weight.grad, [[1.2, 2.0], [-1.0, -1.8]])
    assert _close(model.head.bias.grad, [1.1, -1.1])


class LinearLossScaffold(Scaffold):
    """SCAFFOLD with loss Σ_j v_j·logit_j: for input [1, 2] and v = [1, -1] the gradient is
    the constant g_W = [[1, 2], [-1, -2]], g_b = [1, -1] (not registered: no own name)."""

    def local_loss(self, logits, features, y, client, x=None):
        return (logits * _t([1.0, -1.0])).sum() / logits.shape[0]


def _three_steps_of_linear_loss(settings: TrainingSettings):
    scaffold = _with_controls(LinearLossScaffold(settings, num_clients=5, num_classes=2))
    model = _tiny()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    x = _t([[1.0, 2.0]] * 3)  # three identical samples, batch size 1: K = 3 steps
    update = train_client(scaffold, model, global_state, x, torch.zeros(3, dtype=torch.int64),
                          _client([3, 0], client_id=1), "run")
    return scaffold, update


def test_scaffold_control_variate_after_k_plain_sgd_steps() -> None:
    scaffold, update = _three_steps_of_linear_loss(PLAIN_SGD)
    assert update.num_steps == 3
    # corrected gradient g + c - c_1 = [[1.1, 1.9], [-1, -1.8]], [1.1, -1.3]; y = x - 3·0.1·that
    assert _close(update.state["head.weight"], [[0.5 - 0.33, -0.5 - 0.57], [0.25 + 0.3, 1.0 + 0.54]], 1e-6)
    assert _close(update.state["head.bias"], [0.0 - 0.33, 0.1 + 0.39], 1e-6)
    # c_1+ = c_1 - c + (x - y)/(K·η) = c_1 - c + (g + c - c_1) = g exactly
    new_c1 = scaffold.state_dict()["client_c"][1]
    assert _close(new_c1["head.weight"], [[1.0, 2.0], [-1.0, -2.0]], 1e-5)
    assert _close(new_c1["head.bias"], [1.0, -1.0], 1e-5)
    # Δc_1 = c_1+ - c_1
    delta = update.payload["delta_c"]
    assert _close(delta["head.weight"], [[0.9, 1.9], [-1.0, -2.0]], 1e-5)
    assert _close(delta["head.bias"], [1.0, -1.2], 1e-5)
    assert _close(scaffold.state_dict()["c"]["head.bias"], C["head.bias"])  # c changes only on the server


def test_scaffold_control_variate_with_momentum_uses_effective_steps() -> None:
    # With momentum 0.9 the three gradients are applied with weights 1 + 0.9 + 0.81, 1 + 0.9, 1:
    # a = 2.71 + 1.9 + 1 = 5.61 (not K = 3), so y = x - 0.1·5.61·(g + c - c_1).
    scaffold, update = _three_steps_of_linear_loss(_settings(momentum=0.9))
    assert _close(update.state["head.bias"], [0.0 - 0.561 * 1.1, 0.1 + 0.561 * 1.3], 1e-5)
    # dividing by η·a recovers the gradient again: c_1+ = g
    # (the literal K·η would give c_1 - c + (5.61/3)·(g + c - c_1), nearly twice g)
    new_c1 = scaffold.state_dict()["client_c"][1]
    assert _close(new_c1["head.weight"], [[1.0, 2.0], [-1.0, -2.0]], 1e-5)
    assert _close(new_c1["head.bias"], [1.0, -1.0], 1e-5)


def test_scaffold_server_update_divides_by_all_clients() -> None:
    scaffold = Scaffold(PLAIN_SGD, num_clients=10, num_classes=2)
    scaffold.load_state_dict({"c": {"w": _t([1.0, -2.0])}, "client_c": {}})
    updates = [_update(0, 1, {"w": _t([0.0, 4.0])}, payload={"delta_c": {"w": _t([2.0, -4.0])}}),
               _update(3, 3, {"w": _t([4.0, 8.0])}, payload={"delta_c": {"w": _t([1.0, 1.0])}})]
    out = scaffold.aggregate({"w": _t([0.0, 0.0])}, updates, ["w"])
    assert _close(out["w"], [3.0, 7.0])  # (1·[0, 4] + 3·[4, 8]) / 4
    # c + (Δc_0 + Δc_3)/N = [1, -2] + [3, -3]/10 (N = 10 clients, not the 2 of this round)
    assert _close(scaffold.state_dict()["c"]["w"], [1.3, -2.3])


# --------------------------------------------------------------------------- FedNova

def test_fednova_normalizing_factor_by_hand() -> None:
    assert normalizing_factor(2, 0.0) == 2.0 and normalizing_factor(5, 0.0) == 5.0
    # ρ = 0.9: Σ_k (1 - 0.9^(τ-k))/0.1 over the τ steps
    assert normalizing_factor(2, 0.9) == pytest.approx(1.9 + 1.0, abs=1e-12)  # 2.9
    assert normalizing_factor(5, 0.9) == pytest.approx(4.0951 + 3.439 + 2.71 + 1.9 + 1.0, abs=1e-9)  # 13.1441


def _nova_round(momentum: float) -> dict:
    fednova = FedNova(_settings(momentum=momentum), num_clients=4, num_classes=2)
    updates = [_update(0, 1, _state([0.0, 1.0], [4.0, 0.0], 5), steps=2),
               _update(1, 3, _state([0.5, 3.0], [0.0, 8.0], 7), steps=5)]
    return fednova.aggregate(_state([1.0, 2.0]), updates, W)


def test_fednova_plain_sgd_two_clients() -> None:
    out = _nova_round(0.0)
    # p = (1/4, 3/4), a = (2, 5); d_1 = ([1, 2] - [0, 1])/2 = [0.5, 0.5], d_2 = ([1, 2] - [0.5, 3])/5 = [0.1, -0.2]
    # Σ p d = [0.125 + 0.075, 0.125 - 0.15] = [0.2, -0.025]; τ_eff = 0.5 + 3.75 = 4.25
    # x = [1 - 4.25·0.2, 2 + 4.25·0.025] = [0.15, 2.10625]   (FedAvg would give [0.375, 2.5])
    assert _close(out["w"], [0.15, 2.10625])
    assert _close(out["running_mean"], [1.0, 6.0])  # buffers: plain weighted average
    assert out["num_batches_tracked"].item() == 7


def test_fednova_momentum_two_clients() -> None:
    out = _nova_round(0.9)
    a1, a2 = 2.9, 13.1441  # from the hand sums above
    tau_eff = 0.25 * a1 + 0.75 * a2  # 10.583075
    direction = [0.25 * 1.0 / a1 + 0.75 * 0.5 / a2, 0.25 * 1.0 / a1 + 0.75 * (-1.0) / a2]
    expected = [1.0 - tau_eff * direction[0], 2.0 - tau_eff * direction[1]]
    assert expected == pytest.approx([-0.2142682, 1.6915343], abs=1e-6)
    assert _close(out["w"], expected, 1e-5)
    assert _close(out["running_mean"], [1.0, 6.0])


def test_fednova_equal_steps_is_fedavg() -> None:
    fednova = FedNova(PLAIN_SGD, num_clients=2, num_classes=2)
    updates = [_update(0, 1, _state([0.0, 4.0]), steps=3), _update(1, 3, _state([4.0, 8.0]), steps=3)]
    assert _close(fednova.aggregate(_state([1.0, 1.0]), updates, W)["w"], [3.0, 7.0])


# --------------------------------------------------------------------------- FedOpt

TAU, B1, B2, LR = 1e-3, 0.9, 0.99, 0.1
X0 = [1.0, -1.0]
# Client changes (n = 1 and n = 3) in the two rounds and the weighted pseudo-gradients:
ROUND1 = ([0.6, 0.2], [0.2, 0.2])      # Δ_1 = 0.25·[0.6, 0.2] + 0.75·[0.2, 0.2] = [0.3, 0.2]
ROUND2 = ([0.004, 0.8], [0.0, 0.0])    # Δ_2 = [0.001, 0.2]
D1, D2 = [0.3, 0.2], [0.001, 0.2]


def _fedopt_two_rounds(algorithm):
    x, outs = _state(X0), []
    for changes in (ROUND1, ROUND2):
        updates = [_update(0, 1, _state([a + b for a, b in zip(x["w"].tolist(), changes[0])], [2.0, 0.0], 3)),
                   _update(1, 3, _state([a + b for a, b in zip(x["w"].tolist(), changes[1])], [6.0, 4.0], 9))]
        x = algorithm.aggregate(x, updates, W)
        outs.append(x)
    return outs


def _expected_x(v1: list[float], v2: list[float]) -> tuple[list[float], list[float]]:
    m1 = [(1 - B1) * d for d in D1]
    m2 = [B1 * m + (1 - B1) * d for m, d in zip(m1, D2)]
    x1 = [x + LR * m / (math.sqrt(v) + TAU) for x, m, v in zip(X0, m1, v1)]
    x2 = [x + LR * m / (math.sqrt(v) + TAU) for x, m, v in zip(x1, m2, v2)]
    return x1, x2


def test_fedadam_two_server_steps_by_hand() -> None:
    out1, out2 = _fedopt_two_rounds(FedAdam(PLAIN_SGD, 4, 2, server_lr=LR))
    v0 = TAU ** 2  # v_{-1} = τ²
    v1 = [B2 * v0 + (1 - B2) * d * d for d in D1]
    v2 = [B2 * v + (1 - B2) * d * d for v, d in zip(v1, D2)]
    x1, x2 = _expected_x(v1, v2)
    # first step by hand: 0.1·0.03/(√(9.0099e-4) + 1e-3) = 0.0967227; 0.1·0.02/(√(4.0099e-4) + 1e-3) = 0.0951262
    assert x1 == pytest.approx([1.0967227, -0.9048738], abs=1e-6)
    assert _close(out1["w"], x1, 1e-5) and _close(out2["w"], x2, 1e-5)
    # buffers are averaged as in FedAvg, not optimised
    assert _close(out2["running_mean"], [5.0, 3.0]) and out2["num_batches_tracked"].item() == 9


def test_fedyogi_two_server_steps_by_hand() -> None:
    algorithm = FedYogi(PLAIN_SGD, 4, 2, server_lr=LR)
    out1, out2 = _fedopt_two_rounds(algorithm)
    v0 = TAU ** 2
    # round 1: v0 = 1e-6 < Δ² in both coordinates, sign(v - Δ²) = -1: v grows by (1 - β2)Δ²
    v1 = [v0 + (1 - B2) * d * d for d in D1]
    # round 2: coordinate 0 has v = 9.01e-4 > Δ² = 1e-6 (sign +1, v shrinks); coordinate 1: 4.01e-4 < 0.04
    v2 = [v1[0] - (1 - B2) * D2[0] ** 2, v1[1] + (1 - B2) * D2[1] ** 2]
    x1, x2 = _expected_x(v1, v2)
    assert _close(out1["w"], x1, 1e-5) and _close(out2["w"], x2, 1e-5)
    # Yogi and Adam differ in the second step (Adam's v would be 0.99·9.01e-4 + 1e-8)
    assert not math.isclose(v2[0], B2 * v1[0] + (1 - B2) * D2[0] ** 2, rel_tol=1e-4)
    state = algorithm.state_dict()
    assert _close(state["m"]["w"], [B1 * 0.1 * 0.3 + 0.1 * 0.001, B1 * 0.1 * 0.2 + 0.1 * 0.2], 1e-6)
    assert torch.allclose(state["v"]["w"], _t(v2), rtol=1e-4, atol=0)
    assert set(state["m"]) == {"w"}  # moments only for parameters, not for buffers


def test_fedadagrad_two_server_steps_by_hand() -> None:
    out1, out2 = _fedopt_two_rounds(FedAdagrad(PLAIN_SGD, 4, 2, server_lr=LR))
    v0 = TAU ** 2
    v1 = [v0 + d * d for d in D1]
    v2 = [v + d * d for v, d in zip(v1, D2)]
    x1, x2 = _expected_x(v1, v2)
    assert _close(out1["w"], x1, 1e-5) and _close(out2["w"], x2, 1e-5)


def test_fedopt_steps_only_the_parameters_it_is_given() -> None:
    algorithm = FedAdam(PLAIN_SGD, 4, 2)
    out = algorithm.aggregate(_state(X0), [_update(0, 1, _state([2.0, 0.0], [4.0, 4.0], 3))], parameters=())
    assert _close(out["w"], [2.0, 0.0]) and _close(out["running_mean"], [4.0, 4.0])  # all averaged, as FedAvg
    assert algorithm.state_dict() == {"m": {}, "v": {}}


# --------------------------------------------------------------------------- FedEXP

def _fedexp(**hp) -> FedExp:
    return FedExp(PLAIN_SGD, num_clients=4, num_classes=2, **hp)


def test_fedexp_extrapolates_when_updates_disagree() -> None:
    fedexp = _fedexp(average_last_two=False)
    x = _state([1.0, 1.0])
    updates = [_update(0, 2, _state([4.0, 1.0], [2.0, 2.0])), _update(1, 2, _state([0.0, 1.0], [4.0, 0.0]))]
    out = fedexp.aggregate(x, updates, W)
    # Δ = [3, 0] and [-1, 0], p = 1/2 each: ½·(9 + 1)/2 = 2.5; Δ̄ = [1, 0], ‖Δ̄‖² = 1; S·ε = 2e-3
    eta = 2.5 / 1.002
    assert fedexp.last_server_lr == pytest.approx(eta, rel=1e-9) and eta > 2.49
    assert _close(out["w"], [1.0 + eta, 1.0], 1e-5)
    assert _close(out["running_mean"], [3.0, 1.0])  # buffers averaged, not extrapolated


def test_fedexp_sample_weighted_step() -> None:
    fedexp = _fedexp(average_last_two=False)
    updates = [_update(0, 1, _state([4.0, 0.0])), _update(1, 3, _state([0.0, -4.0 / 3.0]))]
    out = fedexp.aggregate(_state([0.0, 0.0]), updates, W)
    # p = (1/4, 3/4): Σ p‖Δ‖² = 4 + 0.75·16/9 = 16/3; Δ̄ = [1, -1], ‖Δ̄‖² = 2
    eta = 0.5 * (16 / 3) / (2 + 2e-3)  # 1.332001 (4/3 is stored in float32: hence rel=1e-6)
    assert fedexp.last_server_lr == pytest.approx(eta, rel=1e-6)
    assert _close(out["w"], [eta, -eta], 1e-5)


def test_fedexp_clamps_to_one_when_updates_agree() -> None:
    fedexp = _fedexp(average_last_two=False)
    updates = [_update(0, 1, _state([2.0, 2.0])), _update(1, 3, _state([2.0, 2.0]))]
    out = fedexp.aggregate(_state([1.0, 1.0]), updates, W)
    # identical Δ = [1, 1]: ½·2/(2 + 0.002) < 1, so η_g = 1 and the step is FedAvg's
    assert fedexp.last_server_lr == 1.0
    assert _close(out["w"], [2.0, 2.0])


def test_fedexp_epsilon_is_scaled_by_the_number_of_clients() -> None:
    fedexp = _fedexp(average_last_two=False)
    updates = [_update(0, 1, _state([0.1, 0.0])), _update(1, 1, _state([-0.1, 0.0]))]
    fedexp.aggregate(_state([0.0, 0.0]), updates, W)
    # Δ̄ = 0: η = ½·0.01/(0 + 2·1e-3) = 2.5 (the paper's "+ ε" form would give 5)
    assert fedexp.last_server_lr == pytest.approx(2.5, rel=1e-6)
    # no change at all and ε = 0: 0/0 is taken as η_g = 1, not NaN
    fedexp = _fedexp(average_last_two=False, epsilon=0.0)
    out = fedexp.aggregate(_state([1.0, 2.0]), [_update(0, 1, _state([1.0, 2.0]))], W)
    assert fedexp.last_server_lr == 1.0 and _close(out["w"], [1.0, 2.0])


def test_fedexp_evaluates_the_average_of_the_last_two_iterates_and_trains_from_the_last() -> None:
    fedexp = _fedexp()  # average_last_two on by default

    def round_(global_state, client_states):
        started_from = fedexp.local_start(global_state)["w"].clone()  # what the engine loads for every client
        out = fedexp.aggregate(global_state, [_update(i, 1, _state(w)) for i, w in enumerate(client_states)], W)
        return started_from, out

    # round 1: Δ = [1, 0] twice -> η = 1, x_1 = [1, 0]; nothing to average with yet
    _, g1 = round_(_state([0.0, 0.0]), [[1.0, 0.0], [1.0, 0.0]])
    assert _close(g1["w"], [1.0, 0.0])
    # round 2 from x_1: Δ = [2, 0], [0, 0] -> ½·2/(1 + 0.002) < 1, η = 1, x_2 = [2, 0]; evaluated (x_2 + x_1)/2
    start2, g2 = round_(g1, [[3.0, 0.0], [1.0, 0.0]])
    assert _close(start2, [1.0, 0.0]) and _close(g2["w"], [1.5, 0.0])
    # round 3: clients start from x_2 = [2, 0], not from the evaluated [1.5, 0]
    start3, g3 = round_(g2, [[2.0, 2.0], [2.0, 0.0]])
    assert _close(start3, [2.0, 0.0])
    # Δ = [0, 2], [0, 0] -> η = 1, x_3 = [2, 1]; evaluated (x_3 + x_2)/2 = [2, 0.5]
    assert _close(g3["w"], [2.0, 0.5])
    assert _close(fedexp.state_dict()["iterate"]["w"], [2.0, 1.0])
    assert _close(fedexp.local_start(g3)["w"], [2.0, 1.0])  # round 4 starts from x_3 too


# --------------------------------------------------------------------------- every method learns

@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


def _cfg(tiny_params: dict, method: str, **training):
    return method_config(tiny_params, method, training)


@pytest.mark.parametrize("method, momentum", [(m, 0.0) for m in METHODS] + [("scaffold", 0.9), ("fednova", 0.9)])
def test_every_method_learns_digits(project, tiny_params, method, momentum) -> None:
    cfg = _cfg(tiny_params, method, rounds=10, eval_every=5, checkpoint_every=10, momentum=momentum)
    result = run_training(cfg)
    assert [row["round"] for row in result.history] == list(range(1, 11))
    assert all(math.isfinite(row["train_loss"]) for row in result.history)
    assert result.final["final_acc"] > 0.5  # chance is 0.1; 10 rounds reach about 0.8-0.9
    assert result.final["final_balanced_acc"] > 0.5
    assert result.history[-1]["train_loss"] < 0.5 * result.history[0]["train_loss"]


def test_scaffold_counts_control_variates_as_communication(project, tiny_params) -> None:
    fedavg = run_training(_cfg(tiny_params, "fedavg", rounds=2)).history
    scaffold = run_training(_cfg(tiny_params, "scaffold", rounds=2)).history
    # c down and Δc_i up are one model's worth of parameters (the mlp has no buffers) per client
    for a, b in zip(fedavg, scaffold):
        assert b["bytes_up"] == 2 * a["bytes_up"] and b["bytes_down"] == 2 * a["bytes_down"]


# --------------------------------------------------------------------------- resume

@pytest.mark.parametrize("method", METHODS)
def test_resume_gives_the_uninterrupted_history(project, tiny_params, method) -> None:
    cfg = _cfg(tiny_params, method, momentum=0.5)
    assert cfg.training["rounds"] == 4 and cfg.training["checkpoint_every"] == 2
    uninterrupted = run_training(cfg)
    shutil.rmtree(Path("results"))

    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    checkpoint = load_checkpoint(Path(cfg.path(paths.CHECKPOINT_DIR)), cfg.run_id)
    assert checkpoint is not None and checkpoint["round"] == 2 and checkpoint["algorithm_state"] is not None
    resumed = run_training(cfg)
    assert resumed.resumed_from == 2
    assert json.dumps(resumed.history, sort_keys=True) == json.dumps(uninterrupted.history, sort_keys=True)
    assert resumed.final == uninterrupted.final


# --------------------------------------------------------------------------- robustness

def _train_and_aggregate(method: str, settings: TrainingSettings, x, y, indices) -> tuple[ClientUpdate, dict, dict]:
    algorithm = ALGORITHMS[method](settings, num_clients=3, num_classes=10)
    torch.manual_seed(0)
    model = algorithm.adapt_model(build_model("mlp", DIGITS_INFO))
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    counts = torch.bincount(y[indices], minlength=10)
    update = train_client(algorithm, model, global_state, x, y, _client(counts, indices), "run-x")
    out = algorithm.aggregate(global_state, [update], trainable_parameters(model))
    return update, out, global_state


@pytest.mark.parametrize("method", METHODS)
def test_single_class_client_trains_and_aggregates_without_nan(method) -> None:
    x, y = random_digits()
    y[:20] = 3
    settings = TrainingSettings(local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4)
    update, out, _ = _train_and_aggregate(method, settings, x, y, torch.arange(20))
    assert update.num_steps == 2 * 3  # ceil(20 / 8) = 3 batches per epoch
    assert math.isfinite(update.train_loss) and update.train_loss > 0
    assert all(torch.isfinite(v).all() for v in update.state.values())
    assert all(torch.isfinite(v).all() for v in out.values())
    assert all(torch.isfinite(t).all() for t in update.payload.get("delta_c", {}).values())


@pytest.mark.parametrize("method", METHODS)
def test_client_smaller_than_one_batch(method) -> None:
    x, y = random_digits()
    settings = TrainingSettings(local_epochs=3, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)
    update, out, global_state = _train_and_aggregate(method, settings, x, y, torch.tensor([5, 17, 26]))
    assert update.num_samples == 3 and update.num_steps == 3  # one partial batch per epoch
    assert math.isfinite(update.train_loss) and update.train_loss > 0
    assert all(torch.isfinite(v).all() for v in out.values())
    assert any(not torch.equal(out[k], global_state[k]) for k in out)  # the server model moved
