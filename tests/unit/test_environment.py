"""The environment: torch and torchvision are a matching pair that works on a CPU-only machine."""

from pathlib import Path

import torch

LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def _pin(name: str) -> str:
    for line in LOCK.read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==")[1]
    raise AssertionError(f"{name} is not pinned in requirements.lock")


def test_torchvision_imports_and_its_operators_match_torch():
    import torchvision

    # "operator torchvision::nms does not exist" is what a mismatched pair raises here.
    keep = torchvision.ops.nms(torch.tensor([[0.0, 0, 1, 1], [0, 0, 1, 1]]), torch.tensor([0.9, 0.8]), 0.5)
    assert keep.tolist() == [0]
    assert torch.__version__.split("+")[0] == _pin("torch")
    assert torchvision.__version__.split("+")[0] == _pin("torchvision")


def test_a_torchvision_dataset_object_builds_and_yields_tensors():
    from torchvision import datasets, transforms

    data = datasets.FakeData(size=3, image_size=(3, 8, 8), num_classes=4, transform=transforms.ToTensor())
    image, label = data[0]
    assert len(data) == 3
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32
    assert 0 <= int(label) < 4


def test_training_runs_on_cpu_without_an_accelerator():
    model = torch.nn.Linear(4, 2)
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    assert model.weight.grad is not None and torch.isfinite(model.weight.grad).all()
