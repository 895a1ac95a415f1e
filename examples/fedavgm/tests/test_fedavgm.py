"""FedAvgM: its server step against values worked out by hand, its velocity carried across rounds and through a
checkpoint file (a run stopped halfway resumes bit for bit), β = 0 with η = 1 as FedAvg's average, and learning
on a tiny problem, trained by fedskew's own client loop (fedskew.engine.rounds.train_client).

Self-contained: it needs fedskew and this package, not fedskew's test helpers. The expected values are worked
out by hand (every number in them is exact in binary), never by calling the code under test.
"""

import fedskew  # noqa: F401  first: pins the portable CPU kernels before torch computes (fedskew.numerics)

from pathlib import Path

import pytest
import torch
from torch import nn

from fedskew.declarations import describe_method
from fedskew.engine.checkpoint import CHECKPOINT_NAME, read_checkpoint, save_checkpoint
from fedskew.engine.rounds import train_client
from fedskew.fl.base import ClientContext, ClientUpdate, TrainingSettings, trainable_parameters
from fedskew.fl.fedavg import FedAvg

from fedavgm.method import FedAvgM

SETTINGS = TrainingSettings(local_epochs=1, batch_size=8, lr=0.5, momentum=0.0, weight_decay=0.0)


def _update(client_id: int, num_samples: int, w: list[float], mean: float, count: int) -> ClientUpdate:
    """A client's update of a two-entry parameter `w` and two buffers (a float statistic, an integer count)."""
    state = {"w": torch.tensor(w, dtype=torch.float64), "stat": torch.tensor(mean, dtype=torch.float64),
             "count": torch.tensor(count)}
    return ClientUpdate(client_id, num_samples, state, num_steps=1, train_loss=0.0)


def test_two_rounds_step_along_the_velocity_worked_out_by_hand() -> None:
    method = FedAvgM(SETTINGS, 2, 3, server_lr=0.5, server_momentum=0.5)
    x0 = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "stat": torch.tensor(9.0, dtype=torch.float64),
          "count": torch.tensor(3)}
    # Round 1: p = (1/4, 3/4); Δ_0 = (1, 0), Δ_1 = (0, 4); Δ = (0.25, 3); v = Δ; x = x0 + 0.5·v = (1.125, 3.5).
    x1 = method.aggregate(x0, [_update(0, 1, [2.0, 2.0], 0.0, 5), _update(1, 3, [1.0, 6.0], 4.0, 4)], ["w"])
    assert x1["w"].tolist() == [1.125, 3.5]
    assert method.velocity["w"].tolist() == [0.25, 3.0]
    assert float(x1["stat"]) == 3.0 and int(x1["count"]) == 5  # buffers: FedAvg's average, the integer's maximum
    # Round 2: p = (1/2, 1/2); Δ_0 = (1, 0), Δ_1 = (0, −2); Δ = (0.5, −1); v = 0.5·(0.25, 3) + Δ = (0.625, 0.5);
    # x = x1 + 0.5·v = (1.4375, 3.75).
    x2 = method.aggregate(x1, [_update(0, 2, [2.125, 3.5], 1.0, 6), _update(1, 2, [1.125, 1.5], 2.0, 6)], ["w"])
    assert x2["w"].tolist() == [1.4375, 3.75]
    assert method.velocity["w"].tolist() == [0.625, 0.5]
    assert float(x2["stat"]) == 1.5 and int(x2["count"]) == 6


def test_declares_its_hyperparameters_and_cites_its_paper() -> None:
    assert FedAvgM.name == "fedavgm" and FedAvgM.defaults == {"server_lr": 1.0, "server_momentum": 0.9}
    record = describe_method(FedAvgM)
    assert record["family"] == "federated" and "Hsu, Qi and Brown" in record["summary"]
    assert record["hyperparameters"]["server_momentum"]["schema"] == {
        "type": "number", "minimum": 0, "exclusiveMaximum": 1}


def test_a_state_of_another_method_is_refused() -> None:
    method = FedAvgM(SETTINGS, 2, 3)
    with pytest.raises(ValueError, match="unexpected checkpoint state"):
        method.load_state_dict({"m": {}, "v": {}})  # FedAdam's moments
    with pytest.raises(ValueError, match="not a mapping of parameter names to tensors"):
        method.load_state_dict({"velocity": {"head.weight": [0.0]}})
    assert method.velocity == {}


class Linear(nn.Module):
    """logits = W x + b; the engine trains `body` and `head`."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Identity()
        self.head = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _blobs(n: int = 90) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well-separated Gaussian blobs in the plane, labels 0, 1, 2 in turn."""
    y = torch.arange(n) % 3
    centres = torch.tensor([[3.0, 0.0], [-3.0, 3.0], [-3.0, -3.0]])
    return centres[y] + 0.5 * torch.randn(n, 2, generator=torch.Generator().manual_seed(1)), y


def _initial_state() -> dict:
    torch.manual_seed(0)
    return {key: value.clone() for key, value in Linear().state_dict().items()}


def _rounds(method, state: dict, first: int, last: int) -> dict:
    """Rounds `first` to `last` of two clients with skewed labels (client 0 holds no class 2, client 1 no class 0),
    from `state`; each client's generator is seeded by its round, as the engine's is. The global state after."""
    model, (x, y) = Linear(), _blobs()
    clients = [torch.nonzero(y != 2).flatten(), torch.nonzero(y != 0).flatten()]
    for round_ in range(first, last + 1):
        updates = []
        for cid, indices in enumerate(clients):
            client = ClientContext(cid, round_, indices, torch.bincount(y[indices], minlength=3),
                                   torch.Generator().manual_seed(100 * round_ + cid))
            updates.append(train_client(method, model, state, x, y, client, "test"))
        state = method.aggregate(state, updates, trainable_parameters(model))
    return state


def _stopped_after(rounds: int, directory: Path) -> None:
    """Train `rounds` rounds and write the engine's checkpoint of them; the method object is gone afterwards, as
    with a process killed after its checkpoint: what is left is the file."""
    method = FedAvgM(SETTINGS, 2, 3)
    state = _rounds(method, _initial_state(), 1, rounds)
    save_checkpoint(directory, {"run_id": "fedavgm-example", "round": rounds, "global_state": state,
                                "algorithm_state": method.state_dict(),
                                "history": [{"round": r} for r in range(1, rounds + 1)]})


def test_a_run_stopped_halfway_resumes_from_its_checkpoint_file_bit_for_bit(tmp_path) -> None:
    straight = FedAvgM(SETTINGS, 2, 3)
    uninterrupted = _rounds(straight, _initial_state(), 1, 6)

    _stopped_after(3, tmp_path)
    payload = read_checkpoint(tmp_path / CHECKPOINT_NAME)  # torch's weights-only loader, as the engine reads it
    resumed = FedAvgM(SETTINGS, 2, 3)
    resumed.load_state_dict(payload["algorithm_state"])
    finished = _rounds(resumed, payload["global_state"], 4, 6)

    assert all(torch.equal(finished[key], uninterrupted[key]) for key in uninterrupted)
    assert all(torch.equal(resumed.velocity[key], straight.velocity[key]) for key in straight.velocity)
    # Without the velocity the resumed run would start its momentum afresh, and end elsewhere.
    forgetful = _rounds(FedAvgM(SETTINGS, 2, 3), payload["global_state"], 4, 6)
    assert not all(torch.equal(forgetful[key], uninterrupted[key]) for key in uninterrupted)


def test_a_state_dict_is_a_snapshot_of_its_round() -> None:
    method = FedAvgM(SETTINGS, 2, 3)
    _rounds(method, _initial_state(), 1, 2)
    taken = method.state_dict()
    kept = {key: value.clone() for key, value in taken["velocity"].items()}
    _rounds(method, _initial_state(), 3, 3)
    assert all(torch.equal(taken["velocity"][key], kept[key]) for key in kept)
    assert not all(torch.equal(method.velocity[key], kept[key]) for key in kept)


def test_no_momentum_and_a_unit_rate_is_fedavgs_average_up_to_rounding() -> None:
    ours = _rounds(FedAvgM(SETTINGS, 2, 3, server_momentum=0.0, server_lr=1.0), _initial_state(), 1, 3)
    fedavg = _rounds(FedAvg(SETTINGS, 2, 3), _initial_state(), 1, 3)
    assert all(torch.allclose(ours[key], fedavg[key], rtol=0, atol=1e-5) for key in fedavg)


def test_learns_the_tiny_problem() -> None:
    state = _rounds(FedAvgM(SETTINGS, 2, 3), _initial_state(), 1, 5)
    model, (x, y) = Linear(), _blobs()
    model.load_state_dict(state)
    with torch.no_grad():
        accuracy = float((model(x).argmax(dim=1) == y).float().mean())
    assert accuracy > 0.9
