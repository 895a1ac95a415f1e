"""fedskew.numerics.sgd.SGD against torch.optim.SGD: bit for bit, and without importing torch._dynamo."""

import subprocess
import sys

import pytest
import torch

from fedskew.numerics.sgd import SGD


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 5e-4), (0.9, 5e-4)])
def test_matches_torch_sgd_bit_for_bit(momentum: float, weight_decay: float) -> None:
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    theirs = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    theirs.load_state_dict(ours.state_dict())
    ours[2].bias.requires_grad_(False)  # a parameter without a gradient is skipped by both
    theirs[2].bias.requires_grad_(False)
    opt_ours = SGD(ours.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay)
    for step in range(6):
        x, y = torch.randn(11, 7), torch.randint(0, 3, (11,))
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad(set_to_none=step % 2 == 0)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()):
        assert torch.equal(a, b)


def test_local_training_does_not_import_dynamo() -> None:
    """The reason SGD exists: torch.optim imports torch._dynamo (~1.5 CPU-s per training job)."""
    code = ("import sys, torch\n"
            "from fedskew.numerics.sgd import SGD\n"
            "m = torch.nn.Linear(3, 2); opt = SGD(m.parameters(), lr=0.1)\n"
            "m(torch.randn(4, 3)).sum().backward(); opt.step(); opt.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_refuses_no_parameters() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        SGD([], lr=0.1)
