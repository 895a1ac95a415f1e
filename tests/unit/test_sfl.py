"""Split-federated methods: each defining computation against an independent expectation.

The tiny split model is x -> [client: Linear 4->3, Tanh] -> [server: Linear 3->C]; every
expected value is computed here from the equations with plain autograd on one full
model, never with fedskew's own loss functions.
"""

from __future__ import annotations

import copy
import math
import shutil
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedskew import paths
from fedskew.engine.rounds import NonFiniteError
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.models import SplittableNet
from fedskew.models.split import split_model
from fedskew import sfl
from fedskew.sfl.base import BatchStream, SplitRound, minibatch_sizes
from fedskew.sfl.parts import PartCopy
from fedskew.sfl.scala import SCALA
from tests.helpers import method_config, single_setting

C = 4
LR = 0.1
PLAIN_SGD = TrainingSettings(local_epochs=1, batch_size=32, lr=LR, momentum=0.0, weight_decay=0.0)


def tiny_model(seed: int = 0) -> SplittableNet:
    torch.manual_seed(seed)
    stages = OrderedDict(fc=nn.Linear(4, 3), act=nn.Tanh())
    return SplittableNet(stages, 3, C, ("act",))


def tiny_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 4, generator=g)
    # client 0 holds classes {0, 1} (2 and 3 missing), client 1 holds {1, 2} (0 and 3 missing)
    y = torch.tensor([0, 0, 1, 0, 1, 1, 2, 2, 1, 2, 2, 1])
    return x, y, [torch.arange(0, 4), torch.arange(4, 12)]


def contexts(y, parts, round_=1, seed=0) -> list[ClientContext]:
    return [ClientContext(k, round_, idx, torch.bincount(y[idx], minlength=C),
                          torch.Generator().manual_seed(seed * 100 + k)) for k, idx in enumerate(parts)]


def make_round(model, x, y, parts, seed=0, settings=PLAIN_SGD) -> SplitRound:
    view = split_model(model, "act")
    return SplitRound(1, view, {k: v.clone() for k, v in model.state_dict().items()}, contexts(y, parts, seed=seed),
                      x, y, torch.Generator().manual_seed(seed))


def hand_adjusted_ce(logits: torch.Tensor, y: torch.Tensor, counts: list[float] | None) -> torch.Tensor:
    """−log softmax(z + log P)[y], classes with P = 0 removed from the denominator."""
    if counts is None:
        return -torch.log_softmax(logits, dim=1).gather(1, y[:, None]).mean()
    prior = torch.tensor(counts, dtype=logits.dtype) / sum(counts)
    adjusted = logits + torch.log(prior)  # log 0 = −inf: e^{−inf} = 0 in the denominator
    return -(adjusted.gather(1, y[:, None]).squeeze(1) - torch.logsumexp(adjusted, dim=1)).mean()


# --------------------------------------------------------------------------- Eq. 3: B_k

def test_minibatch_sizes_follow_eq3_rounded_at_least_one_at_most_the_data() -> None:
    assert minibatch_sizes([100, 50, 10], 32) == [20, 10, 2]          # exact: 32·n/160
    assert minibatch_sizes([1, 1000], 10) == [1, 10]                   # 0.01 rounds to 0, kept at 1
    assert minibatch_sizes([3, 5], 100) == [3, 5]                      # never more than a client holds
    assert minibatch_sizes([10, 10, 10], 320) == [10, 10, 10]
    assert minibatch_sizes([150, 50], 10) == [8, 3]                    # 7.5 -> 8, 2.5 -> 3 (half up)


def test_batch_stream_is_a_reshuffled_pass_and_never_straddles_two() -> None:
    client = ClientContext(0, 1, torch.arange(10, 17), torch.zeros(C), torch.Generator().manual_seed(3))
    stream = BatchStream(client, 3)
    first_pass = [stream.next() for _ in range(2)]
    assert len(set(torch.cat(first_pass).tolist())) == 6            # no repeats within a pass
    third = stream.next()                                           # 1 left < 3: a new permutation
    assert third.numel() == 3 and set(third.tolist()) <= set(range(10, 17))


# --------------------------------------------------------------------------- SCALA, Eq. 7, 8, 14, 15

@pytest.mark.parametrize("name, server_prior, client_prior", [
    ("scala", "server", "client"),
    ("scala_concat", None, None),
    ("scala_server_la", "server", "server"),
])
def test_scala_gradients_and_server_step_match_the_equations(name, server_prior, client_prior) -> None:
    x, y, parts = tiny_data()
    model = tiny_model()
    view = split_model(model, "act")
    algorithm = sfl.ALGORITHMS[name](PLAIN_SGD, 2, C)
    clients = contexts(y, parts)
    counts = {"client": [[3.0, 1.0, 0.0, 0.0], [0.0, 4.0, 4.0, 0.0]], "server": [[3.0, 5.0, 4.0, 0.0]] * 2,
              None: [None, None]}
    server_counts = [3.0, 5.0, 4.0, 0.0]  # P_s: the participants' data pooled; class 3 is held by nobody
    assert torch.equal(torch.stack([c.label_counts for c in clients]).sum(0), torch.tensor([3, 5, 4, 0]))

    w_s, b_s = model.head.weight.detach().clone(), model.head.bias.detach().clone()
    activations = [torch.tanh(model.body.fc(x[idx])).detach() for idx in parts]
    labels = [y[idx] for idx in parts]

    # Independent expectation: G_k = ∂/∂A_k of client k's loss with w_s^t (Eq. 8, 15).
    expected_grads = []
    for k, a in enumerate(activations):
        a = a.clone().requires_grad_(True)
        loss = hand_adjusted_ce(a @ w_s.T + b_s, labels[k], counts[client_prior][k])
        expected_grads.append(torch.autograd.grad(loss, a)[0])
    # ... and w_s^{t+1} = w_s^t − η ∇ of the concatenated loss (Eq. 7, 14).
    w, b = w_s.clone().requires_grad_(True), b_s.clone().requires_grad_(True)
    server_loss = hand_adjusted_ce(torch.cat(activations) @ w.T + b, torch.cat(labels),
                                   server_counts if server_prior else None)
    gw, gb = torch.autograd.grad(server_loss, (w, b))

    server = PartCopy(view.server, view.server_state(model.state_dict()), PLAIN_SGD)
    received = [a.clone().requires_grad_(True) for a in activations]
    grads, _ = algorithm.server_iteration(server, received, labels, clients, torch.tensor([3, 5, 4, 0]))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.state["head.weight"].detach(), w_s - LR * gw, rtol=0, atol=1e-6)
    torch.testing.assert_close(server.state["head.bias"].detach(), b_s - LR * gb, rtol=0, atol=1e-6)
    if server_prior:  # P_s(3) = 0: class 3 is masked, its server logit gets no gradient at all
        assert gb[3] == 0 and torch.equal(server.state["head.bias"][3].detach(), b_s[3])
    if client_prior == "client":  # client 0 lacks class 2, client 1 lacks class 0: those logits are masked
        a0 = activations[0].clone().requires_grad_(True)
        logits = a0 @ w_s.T + b_s
        logits.retain_grad()
        hand_adjusted_ce(logits, labels[0], counts["client"][0]).backward()
        assert torch.all(logits.grad[:, 2:] == 0)


def test_scala_round_updates_clients_by_their_own_gradient_and_averages_by_data_size() -> None:
    x, y, parts = tiny_data()
    model = tiny_model()
    rnd = make_round(model, x, y, parts)
    algorithm = SCALA(PLAIN_SGD, 2, C, local_iterations=1, server_batch=1000)  # > 12: each batch = all local data
    result = algorithm.run_round(rnd)

    # Client k: w_c − η ∇_{w_c} l_k(w_c, w_s^0) with P_k (Eq. 9, 15); the average weighs |D_k| = 4, 8 (Eq. 10).
    expected = {}
    for k, idx in enumerate(parts):
        clone = copy.deepcopy(model)
        counts = torch.bincount(y[idx], minlength=C).float().tolist()
        loss = hand_adjusted_ce(clone(x[idx]), y[idx], counts)
        grads = torch.autograd.grad(loss, [clone.body.fc.weight, clone.body.fc.bias])
        expected[k] = [clone.body.fc.weight - LR * grads[0], clone.body.fc.bias - LR * grads[1]]
    for i, key in enumerate(["body.fc.weight", "body.fc.bias"]):
        average = (4 * expected[0][i] + 8 * expected[1][i]) / 12
        torch.testing.assert_close(result.global_state[key], average.detach(), rtol=0, atol=1e-6)
    # The server part moved once, with the P_s-adjusted loss on the concatenated batch.
    assert not torch.equal(result.global_state["head.weight"], model.head.weight)


def test_scala_traffic_counts_activations_labels_gradients_and_client_parts() -> None:
    x, y, parts = tiny_data()
    rnd = make_round(tiny_model(), x, y, parts)
    result = SCALA(PLAIN_SGD, 2, C, local_iterations=3, server_batch=1000).run_round(rnd)
    samples = 3 * 12                       # T iterations x Σ B_k
    client_part = (4 * 3 + 3) * 4          # fc weight + bias, float32
    assert result.traffic == {
        "up_activations": samples * 3 * 4, "up_labels": samples * 8, "down_gradients": samples * 3 * 4,
        "down_weights": 2 * client_part, "up_weights": 2 * client_part,
    }


# --------------------------------------------------------------------------- the SplitFed family

def test_splitfed_v1_equals_fedavg_with_the_same_minibatches() -> None:
    x, y, parts = tiny_data()
    settings = TrainingSettings(1, 32, LR, 0.0, 0.0)
    model = tiny_model()
    rnd = make_round(model, x, y, parts, settings=settings)
    # B = 6: B_k = 2 and 4, several passes over the data in 5 iterations
    result = sfl.ALGORITHMS["splitfed_v1"](settings, 2, C, local_iterations=5, server_batch=6).run_round(rnd)
    reference = _fedavg_reference_with(settings, model, x, y, parts, contexts(y, parts), 5)
    for key, value in reference.items():
        torch.testing.assert_close(result.global_state[key], value, rtol=0, atol=1e-6)


def _fedavg_reference_with(settings, model, x, y, parts, clients, iterations):
    """FedAvg on the full model with the minibatches SplitFed's clients draw (same generators)."""
    states = []
    sizes = minibatch_sizes([len(p) for p in parts], 6)
    for client, size in zip(clients, sizes):
        clone = copy.deepcopy(model)
        optimizer = torch.optim.SGD(clone.parameters(), lr=settings.lr)
        stream = BatchStream(client, size)
        for _ in range(iterations):
            batch = stream.next()
            optimizer.zero_grad()
            F.cross_entropy(clone(x[batch]), y[batch]).backward()
            optimizer.step()
        states.append(clone.state_dict())
    return {k: (4 * states[0][k] + 8 * states[1][k]) / 12 for k in states[0]}


def _sequential_reference(settings, model, x, y, parts, clients, order, iterations):
    """SplitFedV2 by hand: one full model per client sharing one server part, clients in `order`."""
    sizes = minibatch_sizes([len(p) for p in parts], 6)
    server = copy.deepcopy(model.head)
    client_states = {}
    for k in order:
        clone = copy.deepcopy(model)
        clone.head = server  # the server part as the previous client left it
        optimizer = torch.optim.SGD(clone.parameters(), lr=settings.lr)
        stream = BatchStream(clients[k], sizes[k])
        for _ in range(iterations):
            batch = stream.next()
            optimizer.zero_grad()
            F.cross_entropy(clone(x[batch]), y[batch]).backward()
            optimizer.step()
        client_states[k] = {n: p.detach().clone() for n, p in clone.body.state_dict().items()}
    body = {f"body.{n}": (4 * client_states[0][n] + 8 * client_states[1][n]) / 12 for n in client_states[0]}
    return body | {f"head.{n}": p.detach() for n, p in server.state_dict().items()}


def test_splitfed_v2_trains_one_server_part_client_after_client_in_a_seeded_order() -> None:
    x, y, parts = tiny_data()
    settings = TrainingSettings(1, 32, LR, 0.0, 0.0)
    model = tiny_model()
    orders = set()
    for seed in range(6):
        algorithm = sfl.ALGORITHMS["splitfed_v2"](settings, 2, C, local_iterations=3, server_batch=6)
        result = algorithm.run_round(make_round(model, x, y, parts, seed=seed, settings=settings))
        order = torch.randperm(2, generator=torch.Generator().manual_seed(seed)).tolist()  # the round's server generator
        orders.add(tuple(order))
        reference = _sequential_reference(settings, model, x, y, parts, contexts(y, parts, seed=seed), order, 3)
        for key, value in reference.items():
            torch.testing.assert_close(result.global_state[key], value, rtol=0, atol=1e-6)
        # the other order gives another server part: the turns really are sequential
        other = _sequential_reference(settings, model, x, y, parts, contexts(y, parts, seed=seed), order[::-1], 3)
        assert not torch.allclose(other["head.weight"], result.global_state["head.weight"], atol=1e-6)
    assert orders == {(0, 1), (1, 0)}  # the order is drawn per round, not fixed by client id


def test_splitfed_v3_keeps_client_parts_personal_and_evaluates_personalised_models() -> None:
    x, y, parts = tiny_data()
    settings = TrainingSettings(1, 32, LR, 0.0, 0.0)
    model = tiny_model()
    # three registered clients; client 2 never takes part
    algorithm = sfl.ALGORITHMS["splitfed_v3"](settings, 3, C, local_iterations=2, server_batch=6)
    algorithm.set_label_counts(torch.stack([torch.bincount(y[p], minlength=C) for p in parts]
                                           + [torch.tensor([1, 1, 1, 1])]))
    rnd = make_round(model, x, y, parts, settings=settings)
    result = algorithm.run_round(rnd)
    initial = rnd.view.client_state(rnd.global_state)
    # the global client part is never averaged: it stays the initial one; the personal ones moved apart
    assert all(torch.equal(result.global_state[f"body.{k}"], v) for k, v in initial.items())
    personal = algorithm.state_dict()["personal"]
    assert set(personal) == {"0", "1"}
    assert not torch.allclose(personal["0"]["fc.weight"], personal["1"]["fc.weight"])
    # with V1's server copies: the averaged server part is V1's server part of the same round
    v1 = sfl.ALGORITHMS["splitfed_v1"](settings, 3, C, local_iterations=2, server_batch=6).run_round(
        make_round(model, x, y, parts, settings=settings))
    torch.testing.assert_close(result.global_state["head.weight"], v1.global_state["head.weight"], rtol=0, atol=0)

    # evaluation: each client's own model on the whole test set, averaged over all 3 clients
    seen = []

    def evaluate(m):
        seen.append({k: v.clone() for k, v in m.state_dict().items()})
        acc = float(len(seen))  # 1, 2, 3: tells the clients apart
        return {"loss": acc, "acc": acc / 10, "balanced_acc": acc / 10, "per_class_acc": [acc / 10] * C}

    metrics = algorithm.evaluate_global(copy.deepcopy(model), result.global_state, evaluate)
    assert len(seen) == 3
    assert torch.equal(seen[0]["body.fc.weight"], personal["0"]["fc.weight"])
    assert torch.equal(seen[2]["body.fc.weight"], initial["fc.weight"])  # never trained: the initial part
    assert all(torch.equal(s["head.weight"], result.global_state["head.weight"]) for s in seen)
    assert metrics["acc"] == pytest.approx(0.2) and metrics["per_class_acc"] == pytest.approx([0.2] * C)
    assert algorithm.round_metrics() == {"personal_acc": pytest.approx(0.2)}

    restored = sfl.ALGORITHMS["splitfed_v3"](settings, 3, C)
    restored.load_state_dict(algorithm.state_dict())
    assert restored.state_dict().keys() == algorithm.state_dict().keys()


def test_sfl_local_loss_sends_no_gradient_and_trains_clients_on_their_aux_head_only() -> None:
    x, y, parts = tiny_data()
    settings = TrainingSettings(1, 32, LR, 0.0, 0.0)
    results = []
    for server_seed in (0, 1):  # two different server parts, same client part
        model = tiny_model()
        torch.manual_seed(100 + server_seed)
        model.head.reset_parameters()
        algorithm = sfl.ALGORITHMS["sfl_local_loss"](settings, 2, C, local_iterations=3, server_batch=6)
        results.append((algorithm.run_round(make_round(model, x, y, parts, settings=settings)), algorithm))
    (first, algo), (second, _) = results
    assert first.traffic["down_gradients"] == 0 and first.traffic["up_activations"] > 0
    # no gradient comes back: the client parts do not depend on the server part at all
    for key in ("body.fc.weight", "body.fc.bias"):
        torch.testing.assert_close(first.global_state[key], second.global_state[key], rtol=0, atol=0)
    assert not torch.equal(first.global_state["head.weight"], second.global_state["head.weight"])
    # the auxiliary head is the method's state (averaged), and its weights cross the network
    aux = algo.state_dict()["aux_head"]
    assert aux["1.weight"].shape == (C, 3)
    client_part = (4 * 3 + 3) * 4
    assert first.traffic["up_weights"] == 2 * (client_part + (3 * C + C) * 4)


@pytest.mark.parametrize("name", sorted(sfl.ALGORITHMS))
def test_every_split_method_survives_single_class_and_tiny_clients(name) -> None:
    x, y, _ = tiny_data()
    parts = [torch.tensor([0]), torch.tensor([6, 7, 9])]  # one sample of class 0; class 2 only
    settings = TrainingSettings(1, 32, LR, 0.9, 0.0)
    algorithm = sfl.ALGORITHMS[name](settings, 2, C)
    algorithm.set_label_counts(torch.stack([torch.bincount(y[p], minlength=C) for p in parts]))
    result = algorithm.run_round(make_round(tiny_model(), x, y, parts, settings=settings))
    assert all(torch.isfinite(v).all() for v in result.global_state.values())
    assert all(math.isfinite(loss) for loss in result.client_losses.values())


# --------------------------------------------------------------------------- stacked client parts

def _alexnet_rounds(name: str, vectorised: bool, rounds: int = 2, **hyperparameters) -> list:
    """SCALA-family rounds of a narrow AlexNet cut at S2 (convolutions on the client, dropout on the server),
    with uneven clients (one of a single sample), momentum and weight decay."""
    from fedskew.algorithms import ALGORITHMS
    from fedskew.models import alexnet
    from tests.helpers import DIGITS_INFO

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(108, 1, 8, 8, generator=g), torch.randint(0, 10, (108,), generator=g)
    model = alexnet(DIGITS_INFO, hidden=16)
    view = split_model(model, "S2")
    settings = TrainingSettings(local_epochs=1, batch_size=32, lr=0.05, momentum=0.9, weight_decay=1e-3)
    algorithm = ALGORITHMS[name](settings, 6, 10, local_iterations=3, server_batch=40, **hyperparameters)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    outcomes = []
    sizes = (3, 8, 29, 17, 1, 50)
    for round_ in range(1, rounds + 1):
        clients, start = [], 0
        for k, size in enumerate(sizes):
            idx = torch.arange(start, start + size)
            start += size
            clients.append(ClientContext(k, round_, idx, torch.bincount(y[idx], minlength=10),
                                         torch.Generator().manual_seed(100 * round_ + k)))
        torch.manual_seed(round_)  # the server part's dropout, as the engine seeds it per round
        outcome = algorithm.run_round(SplitRound(round_, view, state, clients, x, y,
                                                 torch.Generator().manual_seed(round_), vectorised=vectorised))
        state = outcome.global_state
        outcomes.append(outcome)
    return outcomes


@pytest.mark.parametrize("name, hyperparameters", [("scala", {}), ("scala_concat", {}), ("scala_server_la", {}),
                                                   ("scala", {"missing_classes": "floor"}),
                                                   ("splitfed_v1", {}), ("splitfed_v3", {})])
def test_stacked_client_parts_agree_with_one_after_another(name: str, hyperparameters: dict) -> None:
    # (SplitFedV1/V3: the per-client server copies keep their dropout, drawn in client order either way)
    sequential = _alexnet_rounds(name, False, **hyperparameters)
    stacked = _alexnet_rounds(name, True, **hyperparameters)
    for seq, vec in zip(sequential, stacked):
        assert vec.traffic == seq.traffic and vec.client_samples == seq.client_samples
        assert vec.client_losses == pytest.approx(seq.client_losses, rel=1e-4, abs=1e-6)
        for key, value in seq.global_state.items():
            torch.testing.assert_close(vec.global_state[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_which_split_methods_stack_their_client_parts_and_why_not() -> None:
    from fedskew.algorithms import ALGORITHMS
    from fedskew.engine.vectorised import choose_split_execution
    from fedskew.models import alexnet
    from tests.helpers import DIGITS_INFO

    view = split_model(alexnet(DIGITS_INFO, hidden=16), "S2")
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    scala = ALGORITHMS["scala"](PLAIN_SGD, 4, 10)
    assert choose_split_execution("vectorised", scala, view.client, cpu)[0]
    assert choose_split_execution("auto", scala, view.client, gpu)[0]
    assert "pays on a GPU only" in choose_split_execution("auto", scala, view.client, cpu)[1]
    assert not choose_split_execution("sequential", scala, view.client, gpu)[0]
    for stacking in ("splitfed_v1", "splitfed_v3"):  # per-client server copies; the client parts stack
        assert choose_split_execution("vectorised", ALGORITHMS[stacking](PLAIN_SGD, 4, 10), view.client, gpu)[0]
    for other in ("splitfed_v2", "sfl_local_loss"):  # one server part trained client after client
        vectorise, why = choose_split_execution("vectorised", ALGORITHMS[other](PLAIN_SGD, 4, 10), view.client, gpu)
        assert not vectorise and "one after another" in why, other
    deep = split_model(alexnet(DIGITS_INFO, hidden=16), "S4")  # the first dropout is on the client
    assert "dropout" in choose_split_execution("vectorised", scala, deep.client, gpu)[1]


# --------------------------------------------------------------------------- through the engine

@pytest.fixture
def tiny_params(tiny_params):
    return single_setting(tiny_params)


def test_alexnet_split_run_with_dropout_resumes_bit_identically(project, tiny_params) -> None:
    # AlexNet has dropout in its server part: the server's randomness is seeded per round
    # (not drawn from a stream a resumed run would not have advanced).
    cfg = method_config(tiny_params, "scala", dict(model="alexnet", rounds=4, checkpoint_every=2, eval_every=2,
                                                   participation=0.5), local_iterations=2, server_batch=32)
    uninterrupted = run_training(cfg).history
    shutil.rmtree(project / cfg.path(paths.CHECKPOINT_DIR))
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    assert run_training(cfg).history == uninterrupted
    assert uninterrupted[-1]["bytes_down_gradients"] == uninterrupted[-1]["bytes_up_activations"] > 0


def test_a_vectorised_split_run_stacks_its_client_parts_and_agrees(project, tiny_params, caplog) -> None:
    from fedskew.sfl.parts import StackedClientParts

    training = dict(model="cnn", rounds=3, eval_every=1, participation=1.0)
    sequential = run_training(method_config(tiny_params, "scala", training, local_iterations=2, server_batch=32))
    stacked_cfg = method_config(tiny_params, "scala", {**training, "execution": "vectorised"},
                                local_iterations=2, server_batch=32)
    made = []
    original = StackedClientParts.__init__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StackedClientParts, "__init__", lambda self, *a: made.append(1) or original(self, *a))
        with caplog.at_level("INFO", logger="fedskew.engine.simulation"):
            stacked = run_training(stacked_cfg)
    assert stacked.execution == "vectorised" and len(made) == 3  # one stack per round
    assert "client parts train at once" in caplog.text
    for seq, vec in zip(sequential.history, stacked.history):
        assert vec["test_acc"] == pytest.approx(seq["test_acc"], abs=0.01)
        assert vec["train_loss"] == pytest.approx(seq["train_loss"], rel=1e-4)


def test_split_point_chooses_the_cut_and_the_traffic_follows(project, tiny_params) -> None:
    # mlp on digits: cut after relu1 (default) or relu2 sends 200 floats per sample either way,
    # but the client part (and the weight traffic) is larger at relu2.
    rows = {}
    for point in ("relu1", "relu2"):
        cfg = method_config(tiny_params, "splitfed_v1", dict(rounds=1, split_point=point))
        rows[point] = run_training(cfg).history[0]
    assert rows["relu1"]["bytes_up_activations"] == rows["relu2"]["bytes_up_activations"]
    assert rows["relu2"]["bytes_down_weights"] > rows["relu1"]["bytes_down_weights"]
    assert rows["relu1"]["bytes_down_weights"] % ((64 * 200 + 200) * 4) == 0  # whole copies of fc1


def test_a_diverging_split_run_names_the_round_and_the_client(project, tiny_params) -> None:
    cfg = method_config(tiny_params, "scala", dict(lr=1e12, rounds=3))
    with pytest.raises(NonFiniteError, match=r"round \d+, client \d+|non-finite values"):
        run_training(cfg)
