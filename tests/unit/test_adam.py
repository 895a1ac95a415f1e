"""Local training with Adam (`training.optimizer: adam`, fedskew.numerics.adam)."""

from __future__ import annotations

import copy

import pytest
import torch

from fedskew.config import ConfigError, load_params
from fedskew.engine.vectorised import vectorisation_blocker
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import TrainingSettings, local_optimizer
from fedskew.numerics.adam import Adam
from fedskew.numerics.sgd import SGD
from tests.helpers import TINY_PARAMS


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_is_torch_adam_bit_for_bit(weight_decay):
    """The same operations in the same order as torch.optim.Adam's single-tensor path, over steps where a
    parameter sometimes has no gradient."""
    torch.manual_seed(0)
    ours = [torch.randn(5, 3, requires_grad=True), torch.randn(4, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_(True) for p in ours]
    mine = Adam(ours, lr=1e-3, weight_decay=weight_decay)
    reference = torch.optim.Adam(theirs, lr=1e-3, weight_decay=weight_decay, foreach=False)
    for step in range(7):
        grads = [torch.randn_like(p) for p in ours]
        for params in (ours, theirs):
            for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
                param.grad = None if (step == 3 and i == 1) else grad.clone()
        mine.step()
        reference.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)


def test_the_optimiser_follows_the_setting():
    params = [torch.zeros(2, requires_grad=True)]
    assert isinstance(local_optimizer(params, TrainingSettings(1, 8, 0.1, 0.9, 0.0)), SGD)
    assert isinstance(local_optimizer(params, TrainingSettings(1, 8, 0.1, 0.0, 0.0, "adam")), Adam)
    with pytest.raises(ValueError, match="training.optimizer must be sgd or adam"):
        local_optimizer(params, TrainingSettings(1, 8, 0.1, 0.0, 0.0, "lbfgs"))


def _params(**training) -> dict:
    raw = copy.deepcopy(TINY_PARAMS)
    raw["training"]["tiny"].update(training)
    return raw


def test_an_sgd_run_keeps_its_id_and_adam_gets_another():
    base = load_params(_params()).runs()[0]
    sgd = load_params(_params(optimizer="sgd")).runs()[0]
    adam = load_params(_params(optimizer="adam")).runs()[0]
    assert sgd.run_id == base.run_id != adam.run_id


def test_adam_with_momentum_or_an_sgd_only_method_is_refused():
    with pytest.raises(ConfigError, match="momentum 0.9 is SGD's"):
        load_params(_params(optimizer="adam", momentum=0.9))
    raw = _params(optimizer="adam")
    raw["suites"][next(iter(raw["suites"]))]["methods"] = ["scaffold"]
    with pytest.raises(ConfigError, match="method 'scaffold' corrects each step"):
        load_params(raw)


def test_vectorised_clients_fall_back_to_sequential_under_adam():
    from fedskew.data.registry import DatasetInfo
    from fedskew.models import build_model

    model = build_model("mlp", DatasetInfo((10,), 3, False, False))
    algorithm = ALGORITHMS["fedavg"](TrainingSettings(1, 8, 0.1, 0.0, 0.0, "adam"), 4, 3)
    assert "SGD only" in vectorisation_blocker(algorithm, model, augmented=False)


def test_a_client_trains_with_adam_and_starts_from_fresh_moments():
    """train_client makes the optimiser per client and round: two rounds of the same client from the same global
    model give the same update (no moments carried over), and the update is Adam's, not SGD's."""
    from fedskew.data.registry import DatasetInfo
    from fedskew.engine.rounds import train_client
    from fedskew.models import build_model
    from tests.helpers import make_client, random_digits

    x, y = random_digits(40)
    x = x.reshape(len(x), -1)
    torch.manual_seed(0)
    model = build_model("mlp", DatasetInfo((x.shape[1],), 10, False, False))
    start = copy.deepcopy(model.state_dict())
    updates = {}
    for optimizer in ("adam", "adam", "sgd"):
        algorithm = ALGORITHMS["fedavg"](TrainingSettings(1, 8, 0.01, 0.0, 0.0, optimizer), 1, 10)
        client = make_client(torch.bincount(y, minlength=10), torch.arange(len(y)))
        updates.setdefault(optimizer, []).append(train_client(algorithm, model, start, x, y, client, "t").state)
    first, second = updates["adam"]
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], updates["sgd"][0][k]) for k in first)
    assert any(not torch.equal(first[k], start[k]) for k in first)
