"""Traffic is counted once, where tensors are sent: the counter, and what each split method's round reports.

Expected byte counts are written out from the tiny split model's shapes (x -> [Linear 4->3, Tanh] -> [Linear
3->C]), never computed with fedskew's own counting.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from fedskew import sfl
from fedskew.engine import rounds
from fedskew.fl import traffic as fl_traffic
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.fl.traffic import Traffic, tensor_bytes
from fedskew.models import SplittableNet
from fedskew.models.split import split_model
from fedskew.sfl.base import SplitRound

C = 4
SGD = TrainingSettings(local_epochs=1, batch_size=32, lr=0.1, momentum=0.0, weight_decay=0.0)
CLIENT_PART = (4 * 3 + 3) * 4   # fc weight + bias, float32
AUX_HEAD = (3 * C + C) * 4      # SFLLocalLoss's linear head on the 3 activations
SPLIT_KEYS = {"down_weights", "down_gradients", "up_activations", "up_labels", "up_weights"}


def test_tensor_bytes_counts_every_tensor_of_nested_containers_and_nothing_else() -> None:
    nested = {"a": torch.zeros(2, 3), "b": [torch.zeros(5, dtype=torch.int64), (torch.zeros(1, dtype=torch.float16),)],
              "n": 7, "none": None}
    assert tensor_bytes(nested) == 2 * 3 * 4 + 5 * 8 + 2
    # one definition, for the federated round too: it counts through the same Traffic and defines no count of its own
    assert rounds.Traffic is fl_traffic.Traffic and not hasattr(rounds, "tensor_bytes")


def test_traffic_reports_declared_kinds_counts_each_send_and_returns_what_it_sent() -> None:
    counter = Traffic(down=("weights", "gradients"), up=("weights",))
    assert counter.counts() == {"down_weights": 0, "down_gradients": 0, "up_weights": 0}
    state = {"w": torch.zeros(10)}
    assert counter.send_down("weights", state, copies=3) is state       # to three clients
    counter.send_up("weights", [state, state])                           # two clients' uploads
    counter.send_up("payload", torch.zeros(2, dtype=torch.float64))      # a kind nobody declared
    assert counter.counts() == {"down_weights": 120, "down_gradients": 0, "up_weights": 80, "up_payload": 16}
    counts = counter.counts()
    counts["up_weights"] = 0  # a copy: the round's record is not changed through it
    assert counter.counts()["up_weights"] == 80


def _round(seed: int = 0) -> SplitRound:
    torch.manual_seed(seed)
    model = SplittableNet(OrderedDict(fc=nn.Linear(4, 3), act=nn.Tanh()), 3, C, ("act",))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.tensor([0, 0, 1, 0, 1, 1, 2, 2, 1, 2, 2, 1])
    parts = [torch.arange(0, 4), torch.arange(4, 12)]
    clients = [ClientContext(k, 1, idx, torch.bincount(y[idx], minlength=C), torch.Generator().manual_seed(k))
               for k, idx in enumerate(parts)]
    return SplitRound(1, split_model(model, "act"), dict(model.state_dict()), clients, x, y,
                      torch.Generator().manual_seed(seed))


def test_a_split_round_sends_activations_detached_and_counts_them_with_their_labels() -> None:
    rnd = _round()
    weight = torch.ones(3, requires_grad=True)
    activations = [torch.ones(2, 3) * weight, torch.ones(5, 3) * weight]   # part of a client's graph
    labels = [torch.zeros(2, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)]
    received = rnd.send_activations_up(activations, labels)
    assert all(r.grad_fn is None and not r.requires_grad for r in received)   # the server's graph starts here
    assert all(torch.equal(r, a) for r, a in zip(received, activations))
    rnd.send_gradients_down([torch.ones(2, 3), torch.ones(5, 3)])
    assert rnd.traffic.counts() == {"down_weights": 0, "down_gradients": 7 * 3 * 4, "up_activations": 7 * 3 * 4,
                                    "up_labels": 7 * 8, "up_weights": 0}
    assert _round().traffic.counts()["up_activations"] == 0  # every round counts afresh


# Per method, with T = 3 iterations of B_k = 4 and 8 samples (server_batch 1000 > 12: all local data each time):
# the client part down and up (SplitFedV3: personal parts, never sent; SFLLocalLoss: its aux head with it),
# 12 activations of 3 floats and 12 int64 labels up per iteration, and as many gradients down but in SFLLocalLoss.
SAMPLES = 3 * 12
EXPECTED = {
    "scala": (2 * CLIENT_PART, True), "scala_concat": (2 * CLIENT_PART, True),
    "scala_server_la": (2 * CLIENT_PART, True), "splitfed_v1": (2 * CLIENT_PART, True),
    "splitfed_v2": (2 * CLIENT_PART, True), "splitfed_v3": (0, True),
    "sfl_local_loss": (2 * (CLIENT_PART + AUX_HEAD), False),
}


@pytest.mark.parametrize("name", sorted(sfl.ALGORITHMS))
def test_every_split_method_reports_the_bytes_its_round_sends(name) -> None:
    weights, gradients = EXPECTED[name]
    algorithm = sfl.ALGORITHMS[name](SGD, 2, C, local_iterations=3, server_batch=1000)
    algorithm.set_label_counts(torch.tensor([[3, 1, 0, 0], [0, 4, 4, 0]]))
    assert algorithm.run_round(_round()).traffic == {
        "down_weights": weights, "up_weights": weights, "up_activations": SAMPLES * 3 * 4, "up_labels": SAMPLES * 8,
        "down_gradients": SAMPLES * 3 * 4 if gradients else 0,
    }
    assert set(EXPECTED) == set(sfl.ALGORITHMS) and set(algorithm.run_round(_round()).traffic) == SPLIT_KEYS
