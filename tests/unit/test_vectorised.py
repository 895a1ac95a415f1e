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
from fedskew.engine import stacked
from fedskew.engine.batched_forms import adjusted_objective, closed_form_steps, loss_is_adjusted_cross_entropy
from fedskew.engine.closed_form import closed_form_step, dense_forward, one_hot_targets
from fedskew.engine.rounds import NonFiniteError, federated_round
from fedskew.engine.simulation import run_training
from fedskew.engine.vectorised import choose_execution, round_parallelism, vectorisation_blocker
from fedskew.fl.base import ClientContext, FederatedAlgorithm, TrainingSettings, batched
from fedskew.fl.losses import IGNORE_INDEX, batched_cross_entropy
from fedskew.models import alexnet, build_model
from fedskew.models.dropout import Dropout
from fedskew.models.net import SplittableNet
from tests.helpers import DIGITS_INFO, method_config, single_setting

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
        counts = torch.bincount(y[indices.to(y.device)], minlength=NUM_CLASSES)
        seed = 1000 * round_ + client_id
        clients.append(ClientContext(client_id, round_, indices, counts, torch.Generator().manual_seed(seed), seed))
    return clients


def _rounds(method: str, model_name: str, vectorised: bool, rounds: int = 3, settings: TrainingSettings | None = None,
            sizes: tuple[int, ...] = (3, 8, 29, 17, 1, 50), device: str = "cpu"):
    torch.manual_seed(0)
    x, y = _data()
    x, y = x.to(device), y.to(device)
    model = _dense(model_name).to(device)
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


@pytest.mark.parametrize("gather_bytes", [1, 3 * 6 * 8 * 64 * 4])  # a step at a time; 3 steps at a time
def test_inputs_gathered_in_blocks_give_the_same_round(monkeypatch, gather_bytes: int) -> None:
    """The inputs of many steps are gathered at once, at most GATHER_BYTES at a time: any block size
    trains the same minibatches."""
    whole = _rounds("fedlc", "mlp", True, rounds=2)
    monkeypatch.setattr(stacked, "GATHER_BYTES", gather_bytes)
    for a, b in zip(whole, _rounds("fedlc", "mlp", True, rounds=2)):
        for key, value in a.global_state.items():
            torch.testing.assert_close(b.global_state[key], value, rtol=0, atol=0, msg=key)


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
    assert "nn.Dropout" in vectorisation_blocker(algorithm, dropout, augmented=False)
    own_dropout = SplittableNet(OrderedDict(flat=nn.Flatten(), drop=Dropout(0.5)), 64, NUM_CLASSES, ("flat",))
    assert vectorisation_blocker(algorithm, own_dropout, augmented=False) is None
    norm = SplittableNet(OrderedDict(flat=nn.Flatten(), bn=nn.BatchNorm1d(64)), 64, NUM_CLASSES, ("flat",))
    assert "batch normalisation" in vectorisation_blocker(algorithm, norm, augmented=False)


def test_auto_vectorises_dense_models_on_cpu_when_it_pays_and_everything_on_gpu() -> None:
    algorithm = FederatedAlgorithm(_settings(), 4, NUM_CLASSES)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    logreg, cnn = build_model("logreg", DIGITS_INFO), build_model("cnn", DIGITS_INFO)
    assert choose_execution("auto", algorithm, logreg, False, cpu, parallelism=13.6)[0]
    assert choose_execution("auto", algorithm, logreg, False, cpu, parallelism=2.5)[0]
    vectorise, why = choose_execution("auto", algorithm, logreg, False, cpu, parallelism=1.5)
    assert not vectorise and "1.5" in why
    assert not choose_execution("auto", algorithm, cnn, False, cpu, parallelism=50)[0]
    assert choose_execution("auto", algorithm, cnn, False, cuda, parallelism=1.5)[0]
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


# Methods whose batched loss is the cross entropy of their `logit_adjustment`'s logits, and the readings of a
# missing class that change it.
BATCHED_LOSSES = [("fedavg", {}), ("fedprox", {}), ("fedrs", {}), ("fedrs_soft", {}), ("fedlogit", {}),
                  ("fedlogit", {"missing_classes": "floor"}), ("fedlogit", {"missing_classes": "global"}),
                  ("fedlc", {}), ("fedlc", {"missing_classes": "floor"}), ("fedlc", {"missing_classes": "global"}),
                  ("fedlc", {"tau": 0.1}), ("fedlc_fedprox", {})]


# A stack of clients for the per-row losses: label counts with missing classes (one client holds a
# single class), batches of 6 of which each client's first REAL_ROWS are real, the rest padding.
STACK_COUNTS = torch.tensor([[5, 0, 0, 1, 0, 0, 0, 0, 0, 0], [2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
                             [0, 0, 0, 0, 0, 0, 0, 0, 9, 0], [0, 3, 0, 7, 0, 1, 0, 0, 0, 4]])
STACK_SHAPE = (4, 6)  # clients, batch
REAL_ROWS = [6, 1, 4, 6]


def _stacked_method(method: str, hyperparameters: dict) -> FederatedAlgorithm:
    algorithm = ALGORITHMS[method](_settings(), STACK_SHAPE[0], NUM_CLASSES, **hyperparameters)
    algorithm.set_label_counts(STACK_COUNTS)
    return algorithm


def _padded_labels(generator: torch.Generator) -> torch.Tensor:
    """Each client's labels drawn from its counts, IGNORE_INDEX past its real rows."""
    labels = torch.stack([torch.multinomial(c.float(), STACK_SHAPE[1], replacement=True, generator=generator)
                          for c in STACK_COUNTS])
    for client, n in enumerate(REAL_ROWS):
        labels[client, n:] = IGNORE_INDEX
    return labels


@pytest.mark.parametrize("method, hyperparameters", BATCHED_LOSSES)
def test_batched_local_loss_is_local_loss_row_by_row(method: str, hyperparameters: dict) -> None:
    """Each client's rows of the batched loss (the cross entropy of the adjusted logits), averaged over its
    real rows, equal `local_loss` on those rows alone, for clients with missing classes and padded (ignored)
    rows."""
    g = torch.Generator().manual_seed(3)
    counts, (clients, batch) = STACK_COUNTS, STACK_SHAPE
    algorithm = _stacked_method(method, hyperparameters)
    assert loss_is_adjusted_cross_entropy(algorithm)
    logits = torch.randn(clients, batch, NUM_CLASSES, generator=g) * 3
    features = torch.randn(clients, batch, 5, generator=g)
    labels = _padded_labels(g)
    rows = batched_cross_entropy(algorithm.logit_adjustment(counts, logits.dtype).apply(logits), labels)
    assert rows.shape == (clients, batch)
    for client, n in enumerate(REAL_ROWS):
        context = ClientContext(client, 1, torch.arange(n), counts[client], torch.Generator(), 0)
        expected = algorithm.local_loss(logits[client, :n], features[client, :n], labels[client, :n], context)
        torch.testing.assert_close(rows[client, :n].mean(), expected, rtol=1e-6, atol=1e-6)
        assert torch.all(rows[client, n:] == 0)  # a padded row adds nothing


def _dense(model_name: str) -> nn.Module:
    if model_name == "custom":  # every kind of layer the dense forward accepts, a bias-free layer too
        stages = OrderedDict(flat=nn.Flatten(), fc1=nn.Linear(64, 12, bias=False), act1=nn.Tanh(),
                             block=nn.Sequential(nn.Linear(12, 7), nn.GELU(), nn.Identity()), act2=nn.LeakyReLU())
        return SplittableNet(stages, 7, NUM_CLASSES, ("act1",))
    if model_name == "relu_chain":  # every kind of layer the closed-form gradient accepts
        stages = OrderedDict(flat=nn.Flatten(), fc1=nn.Linear(64, 12, bias=False), act1=nn.ReLU(),
                             block=nn.Sequential(nn.Linear(12, 7), nn.ReLU(), nn.Identity()))
        return SplittableNet(stages, 7, NUM_CLASSES, ("act1",))
    if model_name == "alexnet_small":  # SCALA's AlexNet with narrow hidden layers: two dropout layers
        return alexnet(DIGITS_INFO, hidden=32)
    return build_model(model_name, DIGITS_INFO)


@pytest.mark.parametrize("model_name", ["logreg", "mlp", "fed_dnn", "custom"])
def test_dense_forward_is_each_clients_model(model_name: str) -> None:
    """The batched-matrix-product forward gives each client's features and logits under its own parameters."""
    torch.manual_seed(0)
    model = _dense(model_name)
    names = [name for name, _ in model.named_parameters()]
    forward = dense_forward(model, names)
    assert forward is not None
    clients = 3
    params = [p.detach() + 0.1 * torch.randn(clients, *p.shape) for p in model.parameters()]
    inputs = torch.randn(clients, 5, 1, 8, 8)
    features, logits = forward(params, inputs, [])
    for client in range(clients):
        own = dict(zip(names, (p[client] for p in params)))
        expected_features = torch.func.functional_call(model.body, {k[5:]: v for k, v in own.items()
                                                                    if k.startswith("body.")}, (inputs[client],))
        torch.testing.assert_close(features[client], expected_features, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(logits[client], torch.func.functional_call(model, own, (inputs[client],)),
                                   rtol=1e-5, atol=1e-6)


def test_models_with_other_layers_take_the_vmap_forward() -> None:
    cnn = build_model("cnn", DIGITS_INFO)
    assert dense_forward(cnn, [name for name, _ in cnn.named_parameters()]) is None
    reshaped = SplittableNet(OrderedDict(flat=nn.Flatten(), fc=nn.Linear(64, 8), shape=nn.Unflatten(1, (8, 1)),
                                         again=nn.Flatten()), 8, NUM_CLASSES, ("flat",))
    assert dense_forward(reshaped, [name for name, _ in reshaped.named_parameters()]) is None


def test_a_vectorisable_loss_without_a_batched_form_runs_under_vmap() -> None:
    """A method that marks its own local_loss as its batched form (the adjustment it inherits belongs to
    another loss) trains with its local_loss under vmap, and agrees."""

    class DoubledFedLC(ALGORITHMS["fedlc"]):
        name = "doubled_fedlc"

        @batched("local_loss")
        def local_loss(self, logits, features, y, client, x=None):
            return 2 * super().local_loss(logits, features, y, client, x)

    ALGORITHMS["doubled_fedlc"] = DoubledFedLC
    try:
        assert not loss_is_adjusted_cross_entropy(DoubledFedLC(_settings(), 6, NUM_CLASSES))
        sequential = _rounds("doubled_fedlc", "mlp", vectorised=False, rounds=2)
        vectorised = _rounds("doubled_fedlc", "mlp", vectorised=True, rounds=2)
    finally:
        del ALGORITHMS["doubled_fedlc"]
    for seq, vec in zip(sequential, vectorised):
        for client_id, loss in seq.client_losses.items():
            assert vec.client_losses[client_id] == pytest.approx(loss, rel=1e-5, abs=1e-6)
        for key, value in seq.global_state.items():
            torch.testing.assert_close(vec.global_state[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("method, hyperparameters", BATCHED_LOSSES)
@pytest.mark.parametrize("model_name", ["logreg", "mlp", "fed_dnn", "relu_chain"])
def test_closed_form_gradients_are_autograds(method: str, hyperparameters: dict, model_name: str) -> None:
    """A closed-form step's gradients and losses equal autograd's through the dense forward and the
    method's own batched loss: clients at different parameters, missing classes (masked,
    floored, global), class scales, padded rows."""
    g = torch.Generator().manual_seed(5)
    counts, (clients, batch) = STACK_COUNTS, STACK_SHAPE
    algorithm = _stacked_method(method, hyperparameters)
    torch.manual_seed(1)
    model = _dense(model_name)
    names = [name for name, _ in model.named_parameters()]
    steps = closed_form_steps(algorithm, model, names)
    assert steps is not None
    params = [p.detach() + 0.3 * torch.randn(clients, *p.shape, generator=g) for p in model.parameters()]
    inputs = torch.randn(clients, batch, 1, 8, 8, generator=g)
    labels = _padded_labels(g)
    weights = (labels != IGNORE_INDEX).float()
    weights /= weights.sum(dim=1, keepdim=True)

    live = [p.clone().requires_grad_(True) for p in params]
    features, logits = dense_forward(model, names)(live, inputs, [])
    total, expected_losses = adjusted_objective(algorithm)(logits, features, labels, counts, weights)
    expected = torch.autograd.grad(total, live)
    adjustment = algorithm.logit_adjustment(counts, torch.float32)
    grads, losses = closed_form_step(steps, params, inputs, labels, weights,
                                     one_hot_targets(labels, weights, NUM_CLASSES), adjustment)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-6, atol=1e-6)
    for name, grad, want in zip(names, grads, expected):
        assert want.abs().sum() > 0, name  # a gradient to compare
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6, msg=name)


def test_where_the_closed_form_applies() -> None:
    """Every vectorisable method trains logistic regression and the MLPs in closed form; a model with other
    activations, a CNN and a loss run under vmap (any batched loss other than an adjusted cross entropy)
    take autograd."""
    dense = {name: _dense(name) for name in ("logreg", "mlp", "fed_dnn", "custom")}
    names = {key: [name for name, _ in model.named_parameters()] for key, model in dense.items()}
    for method in VECTORISED:
        algorithm = ALGORITHMS[method](_settings(), 4, NUM_CLASSES)
        for model_name in ("logreg", "mlp", "fed_dnn"):
            assert closed_form_steps(algorithm, dense[model_name], names[model_name]) is not None, method
        assert closed_form_steps(algorithm, dense["custom"], names["custom"]) is None, method
    fedavg = FederatedAlgorithm(_settings(), 4, NUM_CLASSES)
    cnn = build_model("cnn", DIGITS_INFO)
    assert closed_form_steps(fedavg, cnn, [name for name, _ in cnn.named_parameters()]) is None

    class Doubled(ALGORITHMS["fedlc"]):  # its local_loss is its own batched form: vmap
        @batched("local_loss")
        def local_loss(self, logits, features, y, client, x=None):
            return 2 * super().local_loss(logits, features, y, client, x)

    class FeaturePenalty(FederatedAlgorithm):  # a batched loss that is not an adjusted cross entropy
        @batched("local_loss")
        def local_loss(self, logits, features, y, client, x=None):
            return super().local_loss(logits, features, y, client, x) + features.pow(2).mean()

    for klass in (Doubled, FeaturePenalty):
        algorithm = klass(_settings(), 4, NUM_CLASSES)
        assert vectorisation_blocker(algorithm, dense["mlp"], augmented=False) is None, klass.__name__
        assert closed_form_steps(algorithm, dense["mlp"], names["mlp"]) is None, klass.__name__


@pytest.mark.parametrize("method", ["fedavg", "fedlc", "fedprox"])
def test_dense_models_outside_the_closed_form_agree(method: str) -> None:
    """A dense model with activations the closed form does not take (Tanh, GELU, LeakyReLU) trains through
    autograd with the method's batched loss, and agrees with the sequential path."""
    for seq, vec in zip(_rounds(method, "custom", False, rounds=2), _rounds(method, "custom", True, rounds=2)):
        for client_id, loss in seq.client_losses.items():
            assert vec.client_losses[client_id] == pytest.approx(loss, rel=1e-5, abs=1e-6)
        for key, value in seq.global_state.items():
            torch.testing.assert_close(vec.global_state[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_vectorised_cnn_agrees_with_sequential() -> None:
    seq = _rounds("fedavg", "cnn", False, rounds=1, settings=_settings(epochs=1))
    vec = _rounds("fedavg", "cnn", True, rounds=1, settings=_settings(epochs=1))
    for key, value in seq[0].global_state.items():
        torch.testing.assert_close(vec[0].global_state[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedlc"])
def test_vectorised_round_with_dropout_agrees_with_sequential(method: str) -> None:
    """Each client's dropout masks come from its own generator: drawn in advance for the batched step, on the
    fly in the sequential one, they are the same masks, so the two paths agree to round-off."""
    seq = _rounds(method, "alexnet_small", False, rounds=2, settings=_settings(epochs=1))
    vec = _rounds(method, "alexnet_small", True, rounds=2, settings=_settings(epochs=1))
    for s, v in zip(seq, vec):
        for key, value in s.global_state.items():
            torch.testing.assert_close(v.global_state[key], value, rtol=1e-4, atol=1e-5, msg=key)
        assert v.client_losses == pytest.approx(s.client_losses, rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method, model_name", [(m, "mlp") for m in VECTORISED] + [("fedavg", "cnn"), ("fedlc", "cnn"),
                                                                      ("fedavg", "alexnet_small")])
def test_vectorised_round_agrees_with_sequential_on_gpu(method: str, model_name: str) -> None:
    """The GPU is where the vectorised path is meant to run. cuDNN may pick other convolution
    algorithms for the batched (grouped) convolutions, and convolutions may use TF32 by
    default, hence the looser tolerance for the CNN."""
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if model_name == "mlp" else {"rtol": 2e-3, "atol": 2e-4}
    # (AlexNet: each client's dropout masks from its own CUDA generator, drawn the same on both paths)
    sequential = _rounds(method, model_name, False, rounds=2, device="cuda")
    vectorised = _rounds(method, model_name, True, rounds=2, device="cuda")
    for seq, vec in zip(sequential, vectorised):
        assert seq.client_samples == vec.client_samples
        for client_id, loss in seq.client_losses.items():
            assert vec.client_losses[client_id] == pytest.approx(loss, rel=tolerance["rtol"], abs=tolerance["atol"])
        for key, value in seq.global_state.items():
            assert value.device.type == "cuda", key
            torch.testing.assert_close(vec.global_state[key], value, msg=key, **tolerance)


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
