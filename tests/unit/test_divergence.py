"""A diverging run: a clear error by default, or a recorded result that the tables show."""

from __future__ import annotations

import argparse
import json

import pytest

from fedskew import paths
from fedskew.cli import cmd_aggregate, cmd_train
from fedskew.config import load_params
from fedskew.engine.rounds import NonFiniteError


@pytest.fixture
def tiny_params(tiny_params):
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    tiny_params["training"]["tiny"]["lr"] = 1e6  # diverges in round 1
    return tiny_params


def _train_all(params) -> None:
    for cfg in params.runs():
        cmd_train(params, argparse.Namespace(threads=1, **cfg.keys))


def test_divergence_fails_the_run_by_default(project, tiny_params):
    params = load_params(tiny_params)
    with pytest.raises(NonFiniteError, match=r"run [0-9a-f]+: .*round 1, client \d+"):
        _train_all(params)
    assert not list(project.glob("results/runs/**/metrics.json"))


def test_recorded_divergence_reaches_the_table(project, tiny_params):
    tiny_params["training"]["tiny"]["on_divergence"] = "record"
    params = load_params(tiny_params)
    _train_all(params)
    cfg = params.runs()[0]
    metrics = json.loads((project / cfg.path(paths.RUN_METRICS)).read_text())
    assert metrics["status"] == "diverged" and metrics["diverged_round"] == 1
    assert metrics["final_acc"] is None and "non-finite" in metrics["error"]

    cmd_aggregate(params, argparse.Namespace(suite="tiny"))
    table = (project / "results/tables/tiny.md").read_text()
    assert "| fedavg | diverged (2/2 seeds) |" in table
    summary = json.loads((project / "results/tables/tiny.json").read_text())
    assert summary["digits/dir0.5/fedavg"] == {"final_acc_mean": None, "final_acc_std": None,
                                               "seeds": 0, "diverged": 2,
                                               "mb_up_mean": None, "mb_down_mean": None,  # no whole run to count
                                               **{f"final_clients_{n}_acc_{s}": None for n in ("mean", "worst10",
                                                  "spread") for s in ("mean", "std")}}  # nor per-client outcomes
    # The recording policy does not change what a converging run is: same run id.
    assert cfg.run_id == load_params({**tiny_params, "training": {"tiny": {
        k: v for k, v in tiny_params["training"]["tiny"].items() if k != "on_divergence"}}}).runs()[0].run_id


@pytest.mark.parametrize(("samples", "advice", "not_advice"), [
    ({3: 0, 5: 40}, "client(s) [3] hold 0 training samples (0 local steps), the likely cause", "lower training.lr"),
    ({3: 25, 5: 40}, "lower training.lr", "0 training samples"),
])
def test_the_nan_guard_names_an_empty_client_rather_than_the_learning_rate(samples, advice, not_advice):
    # An empty client divides by zero (0 samples, 0 local steps): a lower lr would not help.
    import torch

    from fedskew.engine.rounds import check_finite
    from fedskew.fl.base import RoundResult

    nan_model = RoundResult({"w": torch.tensor([float("nan")])}, {3: 0.5, 5: 0.4}, samples, {})
    nan_loss = RoundResult({"w": torch.zeros(1)}, {3: float("nan"), 5: 0.4}, samples, {})
    for outcome, words in ((nan_model, "aggregated model has non-finite values in 'w' after round 2"),
                           (nan_loss, "non-finite training loss (nan) in round 2, client 3")):
        message = str(pytest.raises(NonFiniteError, check_finite, outcome, "abc", 2).value)
        assert words in message and advice in message and not_advice not in message
