"""The papers' combinations are compositions of their parents; every method's traffic is counted."""

from __future__ import annotations

import pytest

from fedskew.engine.simulation import run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.feded import FedED
from fedskew.fl.fedexp import FedExp
from fedskew.fl.fedlc import FedLC
from fedskew.fl.fedprox import FedProx
from fedskew.fl.fedsam import FedSAM
from fedskew.fl.scaffold import Scaffold
from tests.helpers import method_config, single_setting


@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


def _run(tiny_params, method: str, rounds: int = 4, **hyperparameters):
    label = "-".join([method, *(f"{k}{v}" for k, v in sorted(hyperparameters.items()))])
    cfg = method_config(tiny_params, method, {"rounds": rounds, "eval_every": 1}, label, **hyperparameters)
    return run_training(cfg)


@pytest.mark.parametrize("name,parts", [
    ("fedlc_scaffold", {"local_loss": FedLC, "after_backward": Scaffold, "begin_aggregate": Scaffold}),
    ("fedlc_fedprox", {"local_loss": FedLC, "after_backward": FedProx}),
    ("feded_fedexp", {"local_loss": FedED, "begin_aggregate": FedExp, "local_start": FedExp}),
    ("feded_fedsam", {"local_loss": FedED, "local_step": FedSAM}),
])
def test_combinations_take_each_hook_from_the_parent_that_defines_it(name, parts):
    cls = ALGORITHMS[name]
    for hook, parent in parts.items():
        owner = next(klass for klass in cls.__mro__ if hook in vars(klass))
        assert issubclass(parent, owner) or owner is parent, (name, hook, owner)
        assert getattr(cls, hook) is getattr(parent, hook), (name, hook)
    expected = {}
    for parent in {p for p in parts.values()}:
        expected.update(parent.hyperparameters)
    assert set(expected) <= set(cls.hyperparameters)


def test_fedlc_with_a_zero_proximal_term_is_exactly_fedlc(project, tiny_params):
    alone = _run(tiny_params, "fedlc").history
    combined = _run(tiny_params, "fedlc_fedprox", mu=0.0).history
    assert combined == alone
    assert _run(tiny_params, "fedlc_fedprox", mu=1.0).history != alone


@pytest.mark.parametrize("name", ["fedlc_scaffold", "fedlc_fedprox"])
def test_fedlc_combinations_learn(project, tiny_params, name):
    result = _run(tiny_params, name, rounds=10)
    assert result.final["final_acc"] > 0.5


def test_communication_counts_what_each_method_sends(project, tiny_params):
    fedavg = _run(tiny_params, "fedavg", rounds=1).history[0]
    scaffold = _run(tiny_params, "scaffold", rounds=1).history[0]
    flfcr = _run(tiny_params, "flfcr", rounds=1).history[0]
    # The MLP has no buffers, so a control variate is exactly one more model's worth of bytes.
    assert scaffold["bytes_down"] == 2 * fedavg["bytes_down"]
    assert scaffold["bytes_up"] == 2 * fedavg["bytes_up"]
    # FL-FCR uploads per-class feature means and covariances on top of the model.
    assert flfcr["bytes_up"] > fedavg["bytes_up"]
