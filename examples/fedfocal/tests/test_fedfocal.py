"""FedFocal: its loss against values computed by hand, γ = 0 as cross entropy bit for bit, and learning on a
tiny problem, trained by fedskew's own client loop (fedskew.engine.rounds.train_client).

Self-contained: it needs fedskew and this package, not fedskew's test helpers. The expected values are
computed with `math`, never by calling the code under test.
"""

import fedskew  # noqa: F401  first: pins the portable CPU kernels before torch computes (fedskew.numerics)

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.declarations import describe_method
from fedskew.engine.rounds import train_client
from fedskew.fl.base import ClientContext, TrainingSettings, trainable_parameters
from fedskew.fl.fedavg import FedAvg

from fedfocal.method import FedFocal, focal_loss

SETTINGS = TrainingSettings(local_epochs=1, batch_size=8, lr=0.5, momentum=0.0, weight_decay=0.0)
LOGITS = [[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]]
TARGETS = [0, 2]


def _focal_by_hand(row: list[float], y: int, gamma: float) -> float:
    p = math.exp(row[y]) / sum(math.exp(z) for z in row)
    return -((1 - p) ** gamma) * math.log(p)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0, 5.0])
def test_focal_loss_is_the_hand_computed_mean(gamma: float) -> None:
    expected = sum(_focal_by_hand(row, y, gamma) for row, y in zip(LOGITS, TARGETS)) / len(TARGETS)
    got = focal_loss(torch.tensor(LOGITS, dtype=torch.float64), torch.tensor(TARGETS), gamma)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_gamma_zero_is_cross_entropy_exactly_with_its_gradient() -> None:
    logits = torch.randn(16, 10, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = torch.arange(16) % 10
    ours = focal_loss(logits, y, 0.0)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = F.cross_entropy(logits, y)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    assert torch.equal(ours, reference) and torch.equal(ours_grad, reference_grad)


def test_confident_predictions_keep_a_finite_gradient_below_gamma_one() -> None:
    logits = torch.tensor([[40.0, 0.0, 0.0]], requires_grad=True)  # p_t rounds to 1 in float32
    (grad,) = torch.autograd.grad(focal_loss(logits, torch.tensor([0]), 0.5), logits)
    assert torch.isfinite(grad).all()


def test_declares_gamma_with_the_papers_default() -> None:
    assert FedFocal.name == "fedfocal" and FedFocal.defaults == {"gamma": 2.0}
    record = describe_method(FedFocal)
    assert record["family"] == "federated" and "focal loss" in record["summary"]
    assert record["hyperparameters"]["gamma"]["schema"] == {"type": "number", "minimum": 0}


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


def _train(cls: type, rounds: int, **hyperparameters: float) -> tuple[nn.Module, dict]:
    """`rounds` rounds of two clients with skewed labels (client 0 holds most of class 0); the model and state."""
    torch.manual_seed(0)
    model, (x, y) = Linear(), _blobs()
    method = cls(SETTINGS, 2, 3, **hyperparameters)
    clients = [torch.nonzero(y != 2).flatten(), torch.nonzero(y != 0).flatten()]
    state = {key: value.clone() for key, value in model.state_dict().items()}
    for round_ in range(1, rounds + 1):
        updates = []
        for cid, indices in enumerate(clients):
            client = ClientContext(cid, round_, indices, torch.bincount(y[indices], minlength=3),
                                   torch.Generator().manual_seed(100 * round_ + cid))
            updates.append(train_client(method, model, state, x, y, client, "test"))
        state = method.aggregate(state, updates, trainable_parameters(model))
    model.load_state_dict(state)
    return model, state


def test_gamma_zero_trains_bit_for_bit_as_fedavg() -> None:
    _, focal = _train(FedFocal, 2, gamma=0.0)
    _, fedavg = _train(FedAvg, 2)
    assert all(torch.equal(focal[key], fedavg[key]) for key in fedavg)


def test_learns_the_tiny_problem() -> None:
    model, _ = _train(FedFocal, 5)
    x, y = _blobs()
    with torch.no_grad():
        accuracy = float((model(x).argmax(dim=1) == y).float().mean())
    assert accuracy > 0.9
