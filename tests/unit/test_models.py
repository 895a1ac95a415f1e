"""Model registry: every model builds for the shapes it supports, runs forward and backward,
splits into body + head, and refuses datasets it cannot handle with a clear message."""

from __future__ import annotations

import pytest
import torch

from fedskew.data.registry import DatasetInfo
from fedskew.models import MODELS, build_model, example_info, incompatibility

DIGITS = DatasetInfo((1, 8, 8), 10, True, False)
VECTOR = DatasetInfo((60,), 10, False, True)
CIFAR_LIKE = DatasetInfo((3, 32, 32), 100, True, False)
INFOS = {"digits": DIGITS, "vector": VECTOR, "cifar_like": CIFAR_LIKE}

# Which (model, dataset) pairs must work, decided by hand: cnn and alexnet need images.
# (The papers' models, added later, have their own table in test_paper_models.py.)
SUPPORTED = {
    ("logreg", "digits"), ("logreg", "vector"), ("logreg", "cifar_like"),
    ("mlp", "digits"), ("mlp", "vector"), ("mlp", "cifar_like"),
    ("cnn", "digits"), ("cnn", "cifar_like"),
    ("alexnet", "digits"), ("alexnet", "cifar_like"),
}

# Parameter counts by hand.
PARAM_COUNTS = {
    ("logreg", "digits"): 64 * 10 + 10,
    ("logreg", "vector"): 60 * 10 + 10,
    ("mlp", "digits"): (64 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10),
    ("mlp", "vector"): (60 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10),
    # conv1 1->16 3x3, conv2 16->32 3x3, fc1 32*4*4 -> 128, head 128 -> 10
    ("cnn", "digits"): (1 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 4 * 4 * 128 + 128) + (128 * 10 + 10),
    # convs 1->64->192->384->256->256 (3x3), 8x8 pooled three times to 1x1: fc 256 -> 4096 -> 4096 -> 10
    ("alexnet", "digits"): (1 * 64 * 9 + 64) + (64 * 192 * 9 + 192) + (192 * 384 * 9 + 384)
    + (384 * 256 * 9 + 256) + (256 * 256 * 9 + 256) + (256 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 10 + 10),
}


BASIC_MODELS = sorted({name for name, _ in SUPPORTED})


def test_registry_has_the_expected_models() -> None:
    assert {"logreg", "mlp", "cnn", "alexnet"} <= set(MODELS)
    assert {"fedlc_cnn_mnist", "fedlc_cnn_cifar", "resnet18", "resnet32", "mobilenetv2",
            "fed_dnn", "flfcr_mlp", "flfcr_cnn"} <= set(MODELS)


@pytest.mark.parametrize("name", BASIC_MODELS)
@pytest.mark.parametrize("dataset", sorted(INFOS))
def test_compatibility_matches_expectation(name, dataset) -> None:
    problem = incompatibility(name, INFOS[dataset])
    if (name, dataset) in SUPPORTED:
        assert problem is None
    else:
        assert problem is not None and "image" in problem


@pytest.mark.parametrize("name, dataset", sorted(SUPPORTED))
def test_model_forward_backward_and_split(name, dataset) -> None:
    info = INFOS[dataset]
    torch.manual_seed(0)
    model = build_model(name, info)
    if (name, dataset) in PARAM_COUNTS:
        assert sum(p.numel() for p in model.parameters()) == PARAM_COUNTS[(name, dataset)]

    batch = 5
    x = torch.randn(batch, *info.input_shape)
    logits = model(x)  # training mode (dropout on, for the models that have it)
    assert logits.shape == (batch, info.num_classes)
    assert torch.isfinite(logits).all()

    # backward reaches every parameter
    torch.nn.functional.cross_entropy(logits, torch.arange(batch) % info.num_classes).backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname
    assert model.head.weight.grad.abs().sum() > 0

    # the model is its body followed by its linear head (dropout off, so passes can be compared)
    model.eval()
    features = model.body(x)
    assert features.ndim == 2 and features.shape[0] == batch
    assert torch.equal(model.head(features), model(x))
    assert isinstance(model.head, torch.nn.Linear)
    assert model.head.out_features == info.num_classes

    # split points name stages of the body, and cutting at any of them composes back to the body
    stages = [stage for stage, _ in model.body.named_children()]
    assert model.split_points and set(model.split_points.values()) <= set(stages)
    for point, stage in model.split_points.items():
        cut = stages.index(stage) + 1
        client_part, server_part = model.body[:cut], model.body[cut:]
        assert torch.equal(server_part(client_part(x)), features), point


def test_batch_of_one_works() -> None:
    # In train mode (the engine's last batch may hold one sample): every model on the digits
    # if it takes them, else on the shape it is listed with.
    for name in MODELS:
        info = DIGITS if incompatibility(name, DIGITS) is None else example_info(name)
        torch.manual_seed(0)
        model = build_model(name, info).train()
        assert model(torch.randn(1, *info.input_shape)).shape == (1, info.num_classes), name


@pytest.mark.parametrize("name", ["cnn", "alexnet"])
def test_image_models_on_vectors_are_refused_with_a_clear_message(name) -> None:
    message = incompatibility(name, VECTOR)
    assert message is not None
    assert "image" in message and name in message
    with pytest.raises(ValueError, match="image"):
        build_model(name, VECTOR)


def test_alexnet_refuses_images_its_three_pools_would_empty() -> None:
    # 4 -> 2 -> 1 -> 0 pixels after the third pool: no features left for fc1
    message = incompatibility("alexnet", DatasetInfo((1, 4, 4), 10, True, False))
    assert message is not None and "8×8" in message


def test_unknown_model_is_refused() -> None:
    message = incompatibility("resnet9000", DIGITS)
    assert message is not None and "resnet9000" in message
    with pytest.raises(ValueError, match="resnet9000"):
        build_model("resnet9000", DIGITS)


def test_models_are_deterministic_under_a_seed() -> None:
    torch.manual_seed(42)
    a = build_model("cnn", DIGITS).state_dict()
    torch.manual_seed(42)
    b = build_model("cnn", DIGITS).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
