"""Cutting every registered model at every split point changes nothing: the client part then
the server part computes the model's logits, and training the parts the split-learning way
(the server sends back d loss / d activations) gives every parameter the model's gradient.
Plus the key maps, the state round-trip, and SCALA's AlexNet built and cut as described.
BatchNorm models are compared in both modes: in train mode the statistics are the batch's,
and both passes run the same modules on the same batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedskew.data.registry import DatasetInfo
from fedskew.models import MODELS, SplittableNet, build_model
from fedskew.models.split import SplitView, split_model
from tests.helpers import DIGITS_INFO

CIFAR_INFO = DatasetInfo((3, 32, 32), 10, True, False)
FMNIST_INFO = DatasetInfo((1, 28, 28), 10, True, False)
SIDE16_INFO = DatasetInfo((1, 16, 16), 10, True, False)
INFOS = {"digits": DIGITS_INFO, "cifar": CIFAR_INFO, "fmnist": FMNIST_INFO, "side16": SIDE16_INFO}

# Every model on one shape it supports, the cheapest: the digits unless listed here. FedLC's
# CNNs take only their tables' shapes; ResNet-18 and MobileNetV2 need a side of 16 or more.
SHAPE_FOR = {"fedlc_cnn_mnist": "fmnist", "fedlc_cnn_cifar": "cifar", "resnet18": "side16", "mobilenetv2": "side16"}
MODEL_CASES = [(name, SHAPE_FOR.get(name, "digits")) for name in MODELS]
# AlexNet also on the two shapes SCALA uses.
CASES = MODEL_CASES + [("alexnet", "cifar"), ("alexnet", "fmnist")]

BATCH = 3
Grads = dict[str, torch.Tensor]


def _build(name: str, dataset: str) -> SplittableNet:
    torch.manual_seed(0)
    return build_model(name, INFOS[dataset])


def _batch(info: DatasetInfo) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, *info.input_shape, generator=g), torch.arange(BATCH) % info.num_classes


def _full_pass(model: SplittableNet, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Grads]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the same dropout masks as the split pass draws (train mode)
    logits = model(x)
    F.cross_entropy(logits, y).backward()
    return logits.detach(), {key: p.grad.clone() for key, p in model.named_parameters()}


def _split_pass(model: SplittableNet, view: SplitView, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Grads]:
    """One step the split-learning way: the activations cross the cut as a fresh leaf tensor,
    the server backpropagates to it, and the client continues from the returned gradient."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    client_out = view.client(x)
    received = client_out.detach().requires_grad_()
    logits = view.server(received)
    F.cross_entropy(logits, y).backward()
    # a parameter-free client part (logreg's flatten) has nothing to backpropagate into
    assert client_out.requires_grad == any(True for _ in view.client.parameters())
    if client_out.requires_grad:
        client_out.backward(received.grad)
    grads = {}
    for part, keys in ((view.client, view.client_keys), (view.server, view.server_keys)):
        for key, param in part.named_parameters():
            grads[keys[key]] = param.grad.clone()
    return logits.detach(), grads


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name, dataset", CASES)
def test_split_parts_compute_the_model_and_its_gradients(name: str, dataset: str, mode: str) -> None:
    model = _build(name, dataset)
    model.train(mode == "train")
    x, y = _batch(INFOS[dataset])
    full_logits, full_grads = _full_pass(model, x, y)
    for point in model.split_points:
        view = split_model(model, point)
        logits, grads = _split_pass(model, view, x, y)
        assert torch.equal(logits, full_logits), point
        assert set(grads) == set(full_grads), point
        for key, grad in full_grads.items():
            assert torch.equal(grads[key], grad), (point, key)


@pytest.mark.parametrize("name, dataset", CASES)
def test_every_parameter_belongs_to_exactly_one_part(name: str, dataset: str) -> None:
    model = _build(name, dataset)
    full_keys = list(model.state_dict())
    for point in model.split_points:
        view = split_model(model, point)
        client, server = set(view.client_keys.values()), set(view.server_keys.values())
        assert not client & server, point
        assert client | server == set(full_keys), point
        # the key maps point at the very parameter objects the parts hold (shared, not copied)
        for part, keys in ((view.client, view.client_keys), (view.server, view.server_keys)):
            for key, param in part.named_parameters():
                assert param is model.get_parameter(keys[key]), (point, key)


@pytest.mark.parametrize("name, dataset", CASES)
def test_part_states_round_trip_to_the_model_state(name: str, dataset: str) -> None:
    model = _build(name, dataset)
    state = model.state_dict()
    for point in model.split_points:
        view = split_model(model, point)
        client_state, server_state = view.client_state(state), view.server_state(state)
        # the part states are what the parts themselves would load
        view.client.load_state_dict(client_state)
        view.server.load_state_dict(server_state)
        merged = view.full_state(client_state, server_state)
        assert list(merged) == list(state), point  # same keys, same order
        assert all(torch.equal(merged[key], state[key]) for key in state), point


@pytest.mark.parametrize("name, dataset", MODEL_CASES)
def test_unknown_split_point_is_refused_naming_the_known_ones(name: str, dataset: str) -> None:
    model = _build(name, dataset)
    with pytest.raises(ValueError) as error:
        split_model(model, "no-such-point")
    assert "no-such-point" in str(error.value)
    for point in model.split_points:
        assert point in str(error.value)


def test_alexnet_parameter_count_on_cifar() -> None:
    convs = [(3, 64), (64, 192), (192, 384), (384, 256), (256, 256)]
    conv_params = sum(c_in * c_out * 3 * 3 + c_out for c_in, c_out in convs)
    # 32 -> 16 -> 8 -> 4 after the three pools, 256 channels: fc1 takes 256 * 4 * 4
    fc_params = (256 * 4 * 4 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 10 + 10)
    model = _build("alexnet", "cifar")
    assert sum(p.numel() for p in model.parameters()) == conv_params + fc_params
    assert model.body.fc1.in_features == 256 * 4 * 4
    # Fashion-MNIST: 28 -> 14 -> 7 -> 3
    assert _build("alexnet", "fmnist").body.fc1.in_features == 256 * 3 * 3


# What crosses the cut at each split point, by hand: (channels, height, width) or (features,).
CUT_SHAPES = {
    "cifar": {"S1": (192, 8, 8), "S2": (256, 8, 8), "S3": (256, 4, 4), "S4": (4096,), "S5": (4096,)},
    "fmnist": {"S1": (192, 7, 7), "S2": (256, 7, 7), "S3": (256, 3, 3), "S4": (4096,), "S5": (4096,)},
    "digits": {"S1": (192, 2, 2), "S2": (256, 2, 2), "S3": (256, 1, 1), "S4": (4096,), "S5": (4096,)},
}


@pytest.mark.parametrize("dataset", sorted(CUT_SHAPES))
def test_alexnet_output_and_cut_shapes(dataset: str) -> None:
    model = _build("alexnet", dataset).eval()
    x, _ = _batch(INFOS[dataset])
    assert model.body(x).shape == (BATCH, 4096)
    assert model(x).shape == (BATCH, 10)
    assert set(model.split_points) == set(CUT_SHAPES[dataset])
    for point, shape in CUT_SHAPES[dataset].items():
        assert split_model(model, point).client(x).shape == (BATCH, *shape), point


def _layers(stages: list[str]) -> int:
    """SCALA's layer count: a ReLU belongs to the conv or fc before it; every other stage is a layer."""
    return sum(not stage.startswith("relu") for stage in stages)


def test_alexnet_default_split_is_s2_with_six_layers_on_the_client() -> None:
    model = _build("alexnet", "digits")
    assert model.default_split == "S2"
    view = split_model(model, model.default_split)
    client_stages = [stage for stage, _ in view.client.named_children()]
    server_stages = [stage for stage, _ in view.server.named_children()]
    assert client_stages == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
                             "conv3", "relu3", "conv4", "relu4"]
    assert server_stages == ["conv5", "relu5", "pool3", "flatten", "drop1", "fc1", "relu6",
                             "drop2", "fc2", "relu7", "head"]
    # "the first 6 layers as the client-side model and the last 8 layers as the server-side model"
    assert (_layers(client_stages), _layers(server_stages)) == (6, 8)


def test_alexnet_split_points_move_the_cut_deeper_from_s1_to_s5() -> None:
    model = _build("alexnet", "digits")
    stages = [stage for stage, _ in model.body.named_children()]
    depths = {point: _layers(stages[: stages.index(stage) + 1]) for point, stage in model.split_points.items()}
    assert depths == {"S1": 4, "S2": 6, "S3": 8, "S4": 11, "S5": 13}
