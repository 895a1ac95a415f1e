"""Every registered method survives the awkward clients of label skew without crashing or NaN:
a client holding one class (all other classes missing) and a client smaller than one batch."""

from __future__ import annotations

import pytest
import torch

from fedskew.data.datasets.digits import load_digits_split
from fedskew.data.registry import DatasetInfo, _normalise
from fedskew.engine.sampling import client_seed
from fedskew.engine.rounds import train_client
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientContext, TrainingSettings, trainable_parameters
from fedskew.models import build_model

SETTINGS = TrainingSettings(local_epochs=2, batch_size=32, lr=0.05, momentum=0.0, weight_decay=0.0)


@pytest.fixture(scope="module")
def digits():
    raw = load_digits_split()
    x, _, _, _ = _normalise(raw["x_train"], raw["x_test"], "digits")
    return x, raw["y_train"]


def _client(client_id: int, indices: torch.Tensor, y: torch.Tensor, round_: int = 1) -> ClientContext:
    counts = torch.bincount(y[indices], minlength=10)
    generator = torch.Generator().manual_seed(client_seed(0, round_, client_id))
    return ClientContext(client_id, round_, indices, counts, generator)


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_single_class_and_tiny_clients_train_and_aggregate_finitely(digits, method):
    x, y = digits
    torch.manual_seed(0)
    info = DatasetInfo((1, 8, 8), 10, True, False)
    algorithm = ALGORITHMS[method](SETTINGS, 3, 10)
    algorithm.set_label_counts(torch.stack([torch.bincount(y, minlength=10)] * 3))
    model = algorithm.adapt_model(build_model("mlp", info))
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    single_class = torch.nonzero(y == 3).flatten()[:40]
    tiny = torch.tensor([0, 1, 2])
    mixed = torch.arange(100, 200)
    for round_ in (1, 2):  # the second round exercises state kept from the first
        updates = [train_client(algorithm, model, global_state, x, y, _client(k, ix, y, round_), "robustness")
                   for k, ix in enumerate((single_class, tiny, mixed))]
        for update in updates:
            assert all(torch.isfinite(v).all() for v in update.state.values() if v.is_floating_point())
        global_state = algorithm.aggregate(global_state, updates, trainable_parameters(model))
        assert all(torch.isfinite(v).all() for v in global_state.values() if v.is_floating_point()), method
    assert updates[1].num_steps == SETTINGS.local_epochs  # 3 samples: one partial batch per epoch
