"""The vectorised path (training.execution) against the sequential one.

Both paths draw the same minibatches; they differ only in how kernels are batched, so
global states, training losses and step counts must agree to float round-off, for every
method that vectorises, with clients of uneven sizes (padding must not change a client's
mean loss or its number of steps).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import pytest
import torch
from torch import nn

from fedskew.algorithms import ALGORITHMS
from fedskew.engine.simulation import NonFiniteError, federated_round, run_training
from fedskew.engine.vectorised import choose_execution, round_parallelism, vectorisation_blocker
from fedskew.fl.base import ClientContext, FederatedAlgorithm, TrainingSettings
from fedskew.models import build_model
from fedskew.models.net import SplittableNet
from tests.conftest import method_config, single_setting
from tests.unit.helpers import DIGITS_INFO

NUM_CLASSES = 10
# Methods whose every client-side hook has a vectorised form (the rest fall back; see below).
VECTORISED = ["fedavg", "fedprox", "fedlc", "fedrs", "fedrs_soft", "fedlogit", "fednova", "fedadam", "fedyogi",
              "fedadagrad", "fedexp", "fedlc_fedprox"]
SEQUENTIAL_ONLY = ["scaffold", "feddyn", "fedsam", "moon", "fedntd", "feded", "feddecorr", "flfcr"]


def _settings(momentum: float = 0.9, weight_decay: float = 1e-3, epochs: int = 2) -> TrainingSettings:
    return TrainingSettings(local_epochs=epochs, batch_size=8, lr=0.05, momentum=momentum, weight_decay=weight_decay)


def _data(n: int = 160) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, NUM_CLASSES, (n,), generator=g)


def _clients(y: torch.Tensor, round_: int, sizes: tuple[int, ...] = (3, 8, 29, 17, 1, 50)) -> list[ClientContext]:
    """Clients of uneven sizes (one of a single sample, several not a multiple of the batch size), some lacking classes."""
    clients, start = [], 0
    for client_id, size in enumerate(sizes):
        indices = torch.arange(start, start + size)
        start += size
        counts = torch.bincount(y[indices], minlength=NUM_CLASSES)
        seed = 1000 * round_ + client_id
        clients.append(ClientContext(client_id, round_, indices, counts, torch.Generator().manual_seed(seed), seed))
    return clients


def _rounds(method: str, model_name: str, vectorised: bool, rounds: int = 3, settings: TrainingSettings | None = None,
            sizes: tuple[int, ...] = (3, 8, 29, 17, 1, 50)):
    torch.manual_seed(0)
    x, y = _data()
    model = build_model(model_name, DIGITS_INFO)
    algorithm = ALGORITHMS[method](settings or _settings(), len(sizes), NUM_CLASSES)
    algorithm.set_label_counts(torch.stack([c.label_counts for c in _clients(y, 1, sizes)]))
    model = algorithm.adapt_model(model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    outcomes = []
    for round_ in range(1, rounds + 1):
        outcome = federated_round(algorithm, model, state, _clients(y, round_, sizes), x, y, "test",
                                  vectorised=vectorised)
        state = outcome.global_state
        outcomes.append(outcome)
    return outcomes


@pytest.mark.parametrize("method", VECTORISED)
@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
def test_vectorised_round_agrees_with_sequential(method: str, model_name: str) -> None:
    sequential = _rounds(method, model_name, vectorised=False)
    vectorised = _rounds(method, model_name, vectorised=True)
    for seq, vec in zip(sequential, vectorised):
        assert seq.client_samples == vec.client_samples
        assert seq.traffic == vec.traffic
        assert seq.client_losses.keys() == vec.client_losses.keys()
        for client_id, loss in seq.client_losses.items():
            assert vec.client_losses[client_id] == pytest.approx(loss, rel=1e-5, abs=1e-6), client_id
        assert seq.global_state.keys() == vec.global_state.keys()
        for key, value in seq.global_state.items():
            torch.testing.assert_close(vec.global_state[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("momentum, weight_decay, epochs", [(0.0, 0.0, 1), (0.9, 0.0, 3), (0.0, 5e-4, 2)])
def test_optimiser_settings_agree(momentum: float, weight_decay: float, epochs: int) -> None:
    settings = _settings(momentum, weight_decay, epochs)
    for seq, vec in zip(_rounds("fedprox", "mlp", False, settings=settings),
                        _rounds("fedprox", "mlp", True, settings=settings)):
        for key, value in seq.global_state.items():
            torch.testing.assert_close(vec.global_state[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_padding_is_invisible_equal_and_uneven_sizes() -> None:
    """Clients whose sizes are multiples of the batch (no padding) and ones that are not give the same
    agreement; a client alone in a round trains exactly as in the sequential path."""
    for sizes in [(16, 16, 16), (1,), (9, 40, 7), (0, 9)]:  # (0, 9): an empty client takes no step
        seq = _rounds("fedlc", "logreg", False, rounds=2, sizes=sizes)
        vec = _rounds("fedlc", "logreg", True, rounds=2, sizes=sizes)
        for s, v in zip(seq, vec):
            for key, value in s.global_state.items():
                torch.testing.assert_close(v.global_state[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", SEQUENTIAL_ONLY)
def test_methods_without_a_vectorised_form_are_named(method: str) -> None:
    algorithm = ALGORITHMS[method](_settings(), 4, NUM_CLASSES)
    model = algorithm.adapt_model(build_model("mlp", DIGITS_INFO))
    blocker = vectorisation_blocker(algorithm, model, augmented=False)
    assert blocker is not None and "no vectorised form" in blocker
    vectorise, why = choose_execution("vectorised", algorithm, model, False, torch.device("cpu"))
    assert not vectorise and "one after another" in why


@pytest.mark.parametrize("method", VECTORISED)
def test_vectorisable_methods_have_no_blocker(method: str) -> None:
    algorithm = ALGORITHMS[method](_settings(), 4, NUM_CLASSES)
    model = algorithm.adapt_model(build_model("mlp", DIGITS_INFO))
    assert vectorisation_blocker(algorithm, model, augmented=False) is None


def test_a_subclass_overriding_a_declared_hook_must_declare_it_again() -> None:
    class Tweaked(ALGORITHMS["fedlc"]):
        def local_loss(self, logits, features, y, client, x=None):
            return super().local_loss(logits, features, y, client, x) * 2

    algorithm = Tweaked(_settings(), 4, NUM_CLASSES)
    assert "Tweaked" in vectorisation_blocker(algorithm, build_model("mlp", DIGITS_INFO), augmented=False)


def test_models_and_settings_that_block_vectorisation() -> None:
    algorithm = FederatedAlgorithm(_settings(), 4, NUM_CLASSES)
    assert "augmentation" in vectorisation_blocker(algorithm, build_model("mlp", DIGITS_INFO), augmented=True)
    dropout = SplittableNet(OrderedDict(flat=nn.Flatten(), drop=nn.Dropout(0.5)), 64, NUM_CLASSES, ("flat",))
    assert "dropout" in vectorisation_blocker(algorithm, dropout, augmented=False)
    norm = SplittableNet(OrderedDict(flat=nn.Flatten(), bn=nn.BatchNorm1d(64)), 64, NUM_CLASSES, ("flat",))
    assert "batch normalisation" in vectorisation_blocker(algorithm, norm, augmented=False)


def test_auto_vectorises_dense_models_on_cpu_when_it_pays_and_everything_on_gpu() -> None:
    algorithm = FederatedAlgorithm(_settings(), 4, NUM_CLASSES)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    logreg, cnn = build_model("logreg", DIGITS_INFO), build_model("cnn", DIGITS_INFO)
    assert choose_execution("auto", algorithm, logreg, False, cpu, parallelism=13.6)[0]
    vectorise, why = choose_execution("auto", algorithm, logreg, False, cpu, parallelism=2.5)
    assert not vectorise and "2.5" in why
    assert not choose_execution("auto", algorithm, cnn, False, cpu, parallelism=50)[0]
    assert choose_execution("auto", algorithm, cnn, False, cuda, parallelism=2.5)[0]
    assert choose_execution("vectorised", algorithm, cnn, False, cpu, parallelism=1.0)[0]
    assert not choose_execution("sequential", algorithm, logreg, False, cpu)[0]
    with pytest.raises(ValueError, match="training.execution"):
        choose_execution("parallel", algorithm, cnn, False, cpu)


def test_round_parallelism_by_hand() -> None:
    # steps per client at batch 10, 2 epochs: sizes 5 -> 2, 25 -> 6, 40 -> 8, 0 -> 0
    sizes = [5, 25, 40, 0]
    schedule = [[0, 1], [1, 2, 3], [0]]
    expected = ((2 + 6) / 6 + (6 + 8 + 0) / 8 + 2 / 2) / 3
    assert round_parallelism(schedule, sizes, epochs=2, batch_size=10) == pytest.approx(expected)


def test_vectorised_cnn_agrees_with_sequential() -> None:
    seq = _rounds("fedavg", "cnn", False, rounds=1, settings=_settings(epochs=1))
    vec = _rounds("fedavg", "cnn", True, rounds=1, settings=_settings(epochs=1))
    for key, value in seq[0].global_state.items():
        torch.testing.assert_close(vec[0].global_state[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("vectorised", [False, True])
def test_a_non_finite_loss_names_the_client(vectorised: bool) -> None:
    settings = TrainingSettings(local_epochs=1, batch_size=8, lr=float("inf"), momentum=0.0, weight_decay=0.0)
    with pytest.raises(NonFiniteError, match=r"non-finite training loss \(nan\) in round 1, client \d"):
        _rounds("fedavg", "logreg", vectorised, rounds=1, settings=settings)


@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


def test_run_training_logs_the_path_and_agrees(project, tiny_params, caplog) -> None:
    """Through run_training: `execution: vectorised` logs its choice, the run id changes (the numbers
    may differ at round-off), and the run ends near the sequential one."""
    caplog.set_level(logging.INFO, logger="fedskew.engine.simulation")
    results, ids = {}, {}
    for execution in ("sequential", "vectorised"):
        cfg = method_config(tiny_params, "fedlc", training={"execution": execution})
        ids[execution] = cfg.run_id
        results[execution] = run_training(cfg, root=project)
        assert f"training.execution is {execution}" in caplog.text
        assert results[execution].execution == execution  # recorded with the run (MLflow tag fedskew.execution)
    assert ids["sequential"] == method_config(tiny_params, "fedlc").run_id  # older runs keep their ids
    assert ids["vectorised"] != ids["sequential"]
    seq, vec = results["sequential"].history, results["vectorised"].history
    assert [row["round"] for row in seq] == [row["round"] for row in vec]
    for s, v in zip(seq, vec):
        assert v["train_loss"] == pytest.approx(s["train_loss"], rel=1e-4)
        if "test_acc" in s:
            assert v["test_loss"] == pytest.approx(s["test_loss"], rel=1e-4)
