"""FL-FCR's server retraining settings the paper leaves silent: its size (`samples_per_class: balanced`),
and which model the features come from (`features_from: aggregated`, a second exchange a round).

Expected values are built from the pieces the paper defines (Eq. 3–6 statistics of a body, the pooled
sampling and head retraining), assembled here by hand, never by running the setting under test.
"""

from __future__ import annotations

import pytest
import torch

from fedskew.config import RunConfig
from fedskew.engine.rounds import federated_round
from fedskew.fl.base import TrainingSettings
from fedskew.fl.flfcr import FLFCR
from fedskew.fl.flfcr_features import ClassStatisticsPool, class_feature_statistics
from fedskew.fl.traffic import tensor_bytes
from fedskew.models import build_model
from tests.helpers import DIGITS_INFO, random_digits
from tests.helpers import make_client as _client

PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=16, lr=0.1, momentum=0.0, weight_decay=0.0)
SPLITS = [torch.arange(0, 20), torch.arange(20, 40)]  # two clients, every class on each


def _round(algorithm: FLFCR, seed: int = 0):
    """One round of `algorithm` through the engine from one seeded mlp: (global, new state, traffic, model, x, y)."""
    x, y = random_digits()
    torch.manual_seed(seed)
    model = build_model("mlp", DIGITS_INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    clients = [_client(torch.bincount(y[ix], minlength=10), ix, client_id=k, seed=100 + k)
               for k, ix in enumerate(SPLITS)]
    outcome = federated_round(algorithm, model, global_state, clients, x, y, "run-x")
    return global_state, outcome, model, x, y


def test_balanced_resampling_draws_n_over_c_features_a_class() -> None:
    algorithm = FLFCR(PLAIN_SGD, 2, 3, samples_per_class="balanced")
    assert algorithm.samples_for(torch.tensor([30, 20, 11])) == [61 // 3] * 3
    assert FLFCR(PLAIN_SGD, 2, 3).samples_for(torch.tensor([30, 20, 11])) == [200] * 3  # the default: fixed
    # "Resample D_c": as many as the class's pooled data holds, its imbalance kept
    assert FLFCR(PLAIN_SGD, 2, 3, samples_per_class="class_sized").samples_for(torch.tensor([30, 20, 11])) == [30, 20, 11]


def test_balanced_resampling_sizes_the_virtual_set_from_the_rounds_pooled_counts(monkeypatch) -> None:
    seen = {}

    def spy(weight, bias, features, labels, classes, epochs, lr, batch_size, generator):
        seen.update(n=features.shape[0], labels=torch.bincount(labels, minlength=10).tolist(), epochs=epochs)
        return weight, bias

    monkeypatch.setattr("fedskew.fl.flfcr.retrain_head", spy)
    _round(FLFCR(PLAIN_SGD, 2, 10, samples_per_class="balanced", retrain_epochs=3))
    total = sum(int(ix.numel()) for ix in SPLITS)
    assert seen == {"n": 10 * (total // 10), "labels": [total // 10] * 10, "epochs": 3}
    _round(FLFCR(PLAIN_SGD, 2, 10, samples_per_class="class_sized"))
    _, y = random_digits()
    counts = torch.bincount(y[torch.cat(SPLITS)], minlength=10).tolist()
    assert seen == {"n": sum(counts), "labels": counts, "epochs": 1}


def test_aggregated_features_are_the_averaged_bodys_statistics_over_each_local_set(monkeypatch) -> None:
    calibrations = []
    original = FLFCR._calibrate

    def recording(self, state, pool, seed):
        calibrations.append((dict(state), pool.result()))
        return original(self, state, pool, seed)

    monkeypatch.setattr(FLFCR, "_calibrate", recording)
    algorithm = FLFCR(PLAIN_SGD, 2, 10, features_from="aggregated", samples_per_class=30)
    _, outcome, model, x, y = _round(algorithm)
    (averaged, (total, mean, cov)), = calibrations  # one calibration, after the second exchange

    # The state it calibrates is FedAvg of the round (FL-FCR with no retraining is FedAvg) ...
    _, fedavg, _, _, _ = _round(FLFCR(PLAIN_SGD, 2, 10, retrain_epochs=0))
    assert all(torch.equal(averaged[key], fedavg.global_state[key]) for key in fedavg.global_state)
    for key in fedavg.global_state:
        if not key.startswith("head."):  # the body is the average, untouched by the retraining
            assert torch.equal(outcome.global_state[key], fedavg.global_state[key]), key
    # ... and the statistics are Eq. 3–6 of that averaged body's features over each client's whole
    # local set, pooled, not those of the clients' local models.
    model.load_state_dict(fedavg.global_state)
    model.eval()
    pool = ClassStatisticsPool(10, fedavg.global_state["head.weight"].shape[1])
    with torch.no_grad():
        for ix in SPLITS:
            counts, means, covs = class_feature_statistics(model.body(x[ix]), y[ix], 10)
            pool.add(counts, means.float(), covs.float())
    by_hand = pool.result()
    assert torch.equal(total, by_hand[0]) and torch.equal(mean, by_hand[1]) and torch.equal(cov, by_hand[2])
    # the retraining then moves the head only
    assert not torch.equal(outcome.global_state["head.weight"], fedavg.global_state["head.weight"])


def test_aggregated_features_cost_one_more_model_down_and_the_statistics_up() -> None:
    local_state, local, _, _, _ = _round(FLFCR(PLAIN_SGD, 2, 10))
    _, aggregated, _, _, _ = _round(FLFCR(PLAIN_SGD, 2, 10, features_from="aggregated"))
    model_bytes = tensor_bytes(local_state)
    d = local_state["head.weight"].shape[1]
    statistics = 10 * 8 + 10 * d * 4 + 10 * (d * (d + 1) // 2) * 4  # counts, means, packed covariances
    assert aggregated.traffic["down_weights"] == local.traffic["down_weights"] + 2 * model_bytes
    # up: the same statistics, in the second exchange instead of with the update, plus the counts
    # each client still sends with its update (for the margins' N_c)
    assert aggregated.traffic["up_payload"] == local.traffic["up_payload"] + 2 * 10 * 8
    assert local.traffic["up_payload"] == 2 * statistics  # (the seed, one Python int, is not a tensor)


def test_local_features_remain_the_default_and_keep_their_run_ids() -> None:
    assert FLFCR.defaults["features_from"] == "local"
    spec = {"algorithm": "flfcr", "H": 1.0, "global_counts": 1, "samples_per_class": 200, "retrain_epochs": 1,
            "retrain_lr": 0.0}
    training = {"model": "mlp", "rounds": 1}

    def run_id(method_spec: dict) -> str:
        return RunConfig("s", "digits", {}, "dir0.1", {}, "flfcr", method_spec, 0, training).run_id

    assert run_id({**spec, "features_from": "local"}) == run_id(spec)       # the published runs' behaviour
    assert run_id({**spec, "features_from": "aggregated"}) != run_id(spec)


@pytest.mark.parametrize("bad, says", [({"samples_per_class": "all"}, "samples_per_class"),
                                       ({"samples_per_class": 2.5}, "samples_per_class"),
                                       ({"features_from": "global"}, "features_from"),
                                       ({"retrain_epochs": -1}, "retrain_epochs")])
def test_bad_retraining_settings_are_refused_with_the_choices(bad, says) -> None:
    with pytest.raises(ValueError, match=says):
        FLFCR(PLAIN_SGD, 2, 10, **bad)


def test_params_accept_balanced_and_refuse_an_unknown_size_naming_the_choices() -> None:
    import copy

    from fedskew.config import ConfigError, load_params
    from tests.helpers import TINY_PARAMS

    params = copy.deepcopy(TINY_PARAMS)
    params["methods"]["fedlc"] = {"algorithm": "flfcr", "samples_per_class": "balanced", "retrain_epochs": 3,
                                  "features_from": "aggregated"}
    run = load_params(params).run("tiny", "digits", "q2", "fedlc", 0)
    assert run.method_spec["samples_per_class"] == "balanced" and run.method_spec["features_from"] == "aggregated"
    params["methods"]["fedlc"]["samples_per_class"] = "all"
    with pytest.raises(ConfigError) as info:
        load_params(params)
    assert "methods.fedlc.samples_per_class" in str(info.value) and "balanced" in str(info.value)


def test_methods_listing_gives_each_flfcr_setting_its_default_and_paper_status(capsys) -> None:
    from fedskew.cli import main

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for key, declared in FLFCR.hyperparameters.items():
        assert f"  {key}={declared.default}: {declared.status}" in out
    assert "samples_per_class=200: paper silent" in out and "features_from=local: paper:" in out
