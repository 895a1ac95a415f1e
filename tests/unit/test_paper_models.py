"""The papers' models: which datasets each one takes (a table written by hand from the papers,
not from `incompatibility`), forward and backward on every shape it takes, FedLC's CNNs
parameter by parameter against Tables 8–9, and the published parameter counts of ResNet-18,
ResNet-32 and MobileNetV2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision

from fedskew.data.registry import DatasetInfo
from fedskew.models import MODELS, build_model, example_info, incompatibility
from fedskew.models.resnet import ZeroPadShortcut

# The datasets of the four papers, by shape (FEMNIST: LEAF's 28×28 grayscale, 62 classes;
# Adult Income: a vector after encoding, 105 is as good as any length).
DATASETS = {
    "digits": DatasetInfo((1, 8, 8), 10, True, False),
    "mnist": DatasetInfo((1, 28, 28), 10, True, False),
    "fashionmnist": DatasetInfo((1, 28, 28), 10, True, False),
    "femnist": DatasetInfo((1, 28, 28), 62, True, True),
    "cifar10": DatasetInfo((3, 32, 32), 10, True, False),
    "cifar100": DatasetInfo((3, 32, 32), 100, True, False),
    "svhn": DatasetInfo((3, 32, 32), 10, True, False),
    "tinyimagenet": DatasetInfo((3, 64, 64), 200, True, False),
    "imagenet_subset": DatasetInfo((3, 64, 64), 12, True, False),
    "adult": DatasetInfo((105,), 2, False, False),
}
ANY = set(DATASETS)
IMAGES = ANY - {"adult"}
# By hand: flattening nets take anything; conv nets need images; FedLC's CNNs are pinned to
# the shapes of their tables (fc1 = 320 for 1×28×28, 2048 for 3×32×32); the deep BatchNorm
# nets need the last stage's maps to be at least 2×2 (ResNet-18 and MobileNetV2 downsample
# by 8, so no 8×8 digits; ResNet-32 by 4).
SUPPORTED = {
    "logreg": ANY, "mlp": ANY, "fed_dnn": ANY, "flfcr_mlp": ANY,
    "cnn": IMAGES, "alexnet": IMAGES, "flfcr_cnn": IMAGES, "resnet32": IMAGES,
    "resnet18": IMAGES - {"digits"}, "mobilenetv2": IMAGES - {"digits"},
    "fedlc_cnn_mnist": {"mnist", "fashionmnist", "femnist"},
    "fedlc_cnn_cifar": {"cifar10", "cifar100", "svhn"},
}
# The feature vector each model's body gives (the head's input), by hand.
FEATURE_DIM = {
    "fedlc_cnn_mnist": 50, "fedlc_cnn_cifar": 128 * 4 * 4, "resnet18": 512, "resnet32": 64,
    "mobilenetv2": 1280, "fed_dnn": 200, "flfcr_mlp": 64, "flfcr_cnn": 128,
}
# Split points by hand, the default first.
SPLIT_POINTS = {
    "fedlc_cnn_mnist": ["pool2", "pool1", "relu3"],
    "fedlc_cnn_cifar": ["pool2", "pool1", "pool3"],
    "resnet18": ["layer1", "stem", "layer2", "layer3", "layer4"],
    "resnet32": ["layer1", "stem", "layer2", "layer3"],
    "mobilenetv2": ["stage2", "stem", "stage1", "stage3", "stage4", "stage5", "stage6", "stage7", "last"],
    "fed_dnn": ["relu1", "relu2"],
    "flfcr_mlp": ["relu1", "relu2", "relu3", "relu4"],
    "flfcr_cnn": ["pool2", "pool1", "relu4", "pool3", "relu6"],
}


def _shape_text(info: DatasetInfo) -> str:
    return "×".join(map(str, info.input_shape)) if info.is_image else str(info.input_shape)


def test_the_table_covers_every_model() -> None:
    assert set(SUPPORTED) == set(MODELS)
    assert set(FEATURE_DIM) | {"logreg", "mlp", "cnn", "alexnet"} == set(MODELS)


@pytest.mark.parametrize("dataset", sorted(DATASETS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_incompatibility_refuses_exactly_the_unsupported_combinations(name: str, dataset: str) -> None:
    info = DATASETS[dataset]
    problem = incompatibility(name, info)
    if dataset in SUPPORTED[name]:
        assert problem is None
    else:
        # a clear message: the model, what it needs, what the dataset gives
        assert problem is not None
        assert repr(name) in problem and "needs" in problem and _shape_text(info) in problem, problem
        with pytest.raises(ValueError, match="needs"):
            build_model(name, info)


@pytest.mark.parametrize("info, needed", [
    (DatasetInfo((3, 28, 28), 10, True, False), "1×28×28"),   # right size, wrong channels
    (DatasetInfo((1, 32, 32), 10, True, False), "1×28×28"),
])
def test_fedlc_mnist_cnn_names_its_only_shape(info: DatasetInfo, needed: str) -> None:
    problem = incompatibility("fedlc_cnn_mnist", info)
    assert problem is not None and needed in problem and "Table 8" in problem and "320" in problem


@pytest.mark.parametrize("info", [DatasetInfo((1, 32, 32), 10, True, False), DatasetInfo((3, 28, 28), 10, True, False)])
def test_fedlc_cifar_cnn_names_its_only_shape(info: DatasetInfo) -> None:
    problem = incompatibility("fedlc_cnn_cifar", info)
    assert problem is not None and "3×32×32" in problem and "Table 9" in problem and "2048" in problem


def test_minimum_sides_are_exact() -> None:
    for name, side in [("resnet18", 16), ("mobilenetv2", 16), ("resnet32", 8), ("flfcr_cnn", 8)]:
        assert incompatibility(name, DatasetInfo((3, side, side), 10, True, False)) is None, name
        problem = incompatibility(name, DatasetInfo((3, side - 1, side), 10, True, False))
        assert problem is not None and f"{side}×{side}" in problem, name


def test_why_the_batchnorm_nets_refuse_small_images() -> None:
    # Built around the check, ResNet-18 on 8×8 leaves 1×1 maps, and BatchNorm cannot train
    # on the one value a batch of one gives: the refusal prevents this crash mid-training.
    model = MODELS["resnet18"](DATASETS["digits"]).train()
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(torch.randn(1, 1, 8, 8))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_example_info_is_supported(name: str) -> None:
    # what a listing of the models (fedskew models) can build each model for
    assert incompatibility(name, example_info(name)) is None


def _cases() -> list[tuple[str, str]]:
    """Each model once per input shape it supports (the class count only sizes the head, which
    `test_every_supported_dataset_builds_with_its_class_count` checks): the dataset with the
    most classes stands for its shape."""
    cases = []
    for name in sorted(MODELS):
        by_shape: dict[tuple[int, ...], str] = {}
        for dataset in sorted(SUPPORTED[name]):
            shape = DATASETS[dataset].input_shape
            if shape not in by_shape or DATASETS[dataset].num_classes > DATASETS[by_shape[shape]].num_classes:
                by_shape[shape] = dataset
        cases += [(name, dataset) for dataset in by_shape.values()]
    return cases


# AlexNet on 64×64 has an 87M-parameter fc stack (256·8·8 → 4096 → 4096): too slow to train
# here; its shapes are still checked on the meta device below.
SLOW = {("alexnet", "tinyimagenet")}


@pytest.mark.parametrize("name, dataset", _cases())
def test_forward_and_backward_on_every_supported_shape(name: str, dataset: str) -> None:
    if (name, dataset) in SLOW:
        pytest.skip("too large for a CPU unit test; shapes checked on the meta device")
    info = DATASETS[dataset]
    torch.manual_seed(0)
    model = build_model(name, info).train()
    batch = 2  # BatchNorm in train mode needs more than one value per channel
    x = torch.randn(batch, *info.input_shape)
    features = model.body(x)
    logits = model.head(features)
    assert features.ndim == 2 and features.shape[0] == batch
    if name in FEATURE_DIM:
        assert features.shape[1] == FEATURE_DIM[name]
    assert logits.shape == (batch, info.num_classes)
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.arange(batch) % info.num_classes).backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname
    assert model.head.weight.grad.abs().sum() > 0
    assert isinstance(model.head, torch.nn.Linear) and model.head.out_features == info.num_classes


@pytest.mark.parametrize("name, dataset", sorted((n, d) for n in MODELS for d in SUPPORTED[n]))
def test_every_supported_dataset_builds_with_its_class_count(name: str, dataset: str) -> None:
    info = DATASETS[dataset]
    with torch.device("meta"):  # structure only: no weights allocated
        model = build_model(name, info)
    assert model.head.out_features == info.num_classes
    if (name, dataset) in SLOW:  # not run above: at least its shapes, on the meta device
        x = torch.empty(2, *info.input_shape, device="meta")
        assert model.body(x).shape == (2, model.head.in_features)
        assert model(x).shape == (2, info.num_classes)


@pytest.mark.parametrize("name", sorted(SPLIT_POINTS))
def test_split_points_and_default(name: str) -> None:
    with torch.device("meta"):
        model = build_model(name, example_info(name))
    assert list(model.split_points) == SPLIT_POINTS[name]
    assert model.default_split == SPLIT_POINTS[name][0]


@pytest.mark.parametrize("name, info", [
    ("resnet18", DatasetInfo((1, 16, 16), 10, True, False)),
    ("mobilenetv2", DatasetInfo((3, 16, 16), 10, True, False)),
    ("resnet32", DatasetInfo((1, 8, 8), 10, True, False)),
])
def test_batch_of_one_trains_at_the_smallest_side(name: str, info: DatasetInfo) -> None:
    torch.manual_seed(0)
    model = build_model(name, info).train()
    logits = model(torch.randn(1, *info.input_shape))
    F.cross_entropy(logits, torch.tensor([3])).backward()
    assert torch.isfinite(logits).all()


# FedLC Appendix A.1, written out as printed: (c_in, c_out, k, k) and (c_in, c_out).
FEDLC_TABLE_8 = {
    "conv1.weight": [1, 10, 5, 5], "conv1.bias": [10],
    "conv2.weight": [10, 20, 5, 5], "conv2.bias": [20],
    "fc1.weight": [320, 50], "fc1.bias": [50],
    "fc2.weight": [50, 10], "fc2.bias": [10],
}
FEDLC_TABLE_9 = {
    "conv1.weight": [3, 128, 3, 3], "conv1.bias": [128],
    "conv2.weight": [128, 128, 3, 3], "conv2.bias": [128],
    "conv3.weight": [128, 128, 3, 3], "conv3.bias": [128],
    "fc1.weight": [2048, 10], "fc1.bias": [10],
}
# The table's names → ours (the last fc is the head).
OUR_NAMES_8 = {"conv1": "body.conv1", "conv2": "body.conv2", "fc1": "body.fc1", "fc2": "head"}
OUR_NAMES_9 = {"conv1": "body.conv1", "conv2": "body.conv2", "conv3": "body.conv3", "fc1": "head"}


@pytest.mark.parametrize("name, dataset, table, names", [
    ("fedlc_cnn_mnist", "mnist", FEDLC_TABLE_8, OUR_NAMES_8),
    ("fedlc_cnn_mnist", "fashionmnist", FEDLC_TABLE_8, OUR_NAMES_8),
    ("fedlc_cnn_cifar", "cifar10", FEDLC_TABLE_9, OUR_NAMES_9),
])
def test_fedlc_cnns_match_their_tables(name: str, dataset: str, table: dict, names: dict) -> None:
    torch.manual_seed(0)
    model = build_model(name, DATASETS[dataset])
    ours = {key: list(param.shape) for key, param in model.named_parameters()}
    expected = {}
    for key, shape in table.items():
        layer, _, kind = key.partition(".")
        # PyTorch stores (c_out, c_in, ...): the table's first two dimensions swapped
        expected[f"{names[layer]}.{kind}"] = [shape[1], shape[0], *shape[2:]] if kind == "weight" else shape
    assert ours == expected  # every parameter, and no other
    # the pools: 2×2, stride 2, no padding; the convolutions: padding 0 (Table 8), 1 (Table 9)
    pools = [m for m in model.body if isinstance(m, torch.nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride, p.padding) for p in pools] == [(2, 2, 0)] * len(pools)
    convs = [m for m in model.body if isinstance(m, torch.nn.Conv2d)]
    assert {c.padding for c in convs} == ({(0, 0)} if name == "fedlc_cnn_mnist" else {(1, 1)})
    assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.BatchNorm2d)) for m in model.modules())


def test_fedlc_cnn_on_femnist_has_62_outputs() -> None:
    with torch.device("meta"):
        model = build_model("fedlc_cnn_mnist", DATASETS["femnist"])
    assert model.head.weight.shape == (62, 50)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet32_has_the_published_parameter_count() -> None:
    model = build_model("resnet32", DATASETS["cifar10"])
    # By hand: stem 3·16·9 + BN 32; stage 1: 10 convs 16·16·9 + BN 32 each; stage 2:
    # 16·32·9 + 9·32·32·9 + 10 BN of 64; stage 3: 32·64·9 + 9·64·64·9 + 10 BN of 128; fc 64·10 + 10.
    # Option A shortcuts have no parameters.
    by_hand = (432 + 32) + 10 * (2304 + 32) + (4608 + 9 * 9216 + 640) + (18432 + 9 * 36864 + 1280) + 650
    assert _params(model) == by_hand == 464_154
    # He et al. (2016), Table 6: "0.46M"; a figure rounded to 0.01M means [0.455M, 0.465M).
    assert 455_000 <= _params(model) < 465_000
    assert not any(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1) for m in model.modules())


def test_resnet18_cifar_has_the_usual_parameter_count() -> None:
    model = build_model("resnet18", DATASETS["cifar10"])
    # The usual "11.17M" of CIFAR ResNet-18 (rounded to 0.01M: [11.165M, 11.175M)); and
    # exactly torchvision's ImageNet ResNet-18 with 10 classes less the stem difference
    # (7×7 vs 3×3 kernels on 3 → 64 channels): 11,181,642 − 3·64·(49 − 9).
    assert _params(model) == 11_173_962
    assert 11_165_000 <= _params(model) < 11_175_000
    reference = torchvision.models.resnet18(num_classes=10)
    assert _params(model) == _params(reference) - 3 * 64 * (49 - 9)
    stem = model.body.stem.conv
    assert (stem.kernel_size, stem.stride, stem.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())


def test_mobilenetv2_cifar_parameter_count() -> None:
    model = build_model("mobilenetv2", DATASETS["cifar10"])
    # Sandler et al. report 3.4M parameters for ImageNet (Table 4); torchvision's ImageNet
    # MobileNetV2 has 3,504,872, of which the 1280 → 1000 classifier is 1,281,000. The CIFAR
    # variant changes strides only, so with a 1280 → 10 head it has
    # 3,504,872 − 1,281,000 + 12,810 = 2,236,682 ≈ 2.24M: the "2.2–2.3M" of CIFAR
    # MobileNetV2 (re-implementations that add 1×1 conv shortcuts land near 2.3M).
    assert _params(model) == 2_236_682 == 3_504_872 - 1_281_000 + 12_810
    assert _params(model) == _params(torchvision.models.mobilenet_v2(num_classes=10))


@torch.no_grad()
def _map_sizes(model, info: DatasetInfo, stages: list[str]) -> dict[str, tuple[int, ...]]:
    """The map shape after each named stage."""
    sizes, x = {}, torch.zeros(2, *info.input_shape)
    for stage, module in model.body.named_children():
        x = module(x)
        if stage in stages:
            sizes[stage] = tuple(x.shape[1:])
    return sizes


def test_cifar_variants_downsample_as_described() -> None:
    cifar = DATASETS["cifar10"]
    r18, r32, mnv2 = (build_model(n, cifar) for n in ("resnet18", "resnet32", "mobilenetv2"))
    assert _map_sizes(r18, cifar, ["stem", "layer1", "layer2", "layer3", "layer4"]) == {
        "stem": (64, 32, 32), "layer1": (64, 32, 32), "layer2": (128, 16, 16),
        "layer3": (256, 8, 8), "layer4": (512, 4, 4)}
    assert _map_sizes(r32, cifar, ["stem", "layer1", "layer2", "layer3"]) == {
        "stem": (16, 32, 32), "layer1": (16, 32, 32), "layer2": (32, 16, 16), "layer3": (64, 8, 8)}
    assert [len(r32.body.get_submodule(f"layer{i}")) for i in (1, 2, 3)] == [5, 5, 5]
    # MobileNetV2: stem and the c = 24 stage keep 32×32; then 16, 8, 8, 4, 4
    assert _map_sizes(mnv2, cifar, ["stem", "stage1", "stage2", "stage3", "stage4", "stage5", "stage6",
                                    "stage7", "last"]) == {
        "stem": (32, 32, 32), "stage1": (16, 32, 32), "stage2": (24, 32, 32), "stage3": (32, 16, 16),
        "stage4": (64, 8, 8), "stage5": (96, 8, 8), "stage6": (160, 4, 4), "stage7": (320, 4, 4),
        "last": (1280, 4, 4)}


def test_option_a_shortcut_subsamples_and_zero_pads() -> None:
    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    out = ZeroPadShortcut(2, 4, stride=2)(x)
    assert out.shape == (1, 4, 2, 2)
    assert torch.equal(out[:, 1:3], x[:, :, ::2, ::2])
    assert out[:, 0].abs().sum() == 0 and out[:, 3].abs().sum() == 0


def test_flfcr_models_by_hand() -> None:
    adult = DATASETS["adult"]
    mlp = build_model("flfcr_mlp", adult)
    widths = [(m.in_features, m.out_features) for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [(105, 512), (512, 256), (256, 128), (128, 64), (64, 2)]  # Table I, Adult's 2 classes
    mnist_mlp = build_model("flfcr_mlp", DATASETS["mnist"])
    assert mnist_mlp.body.fc1.in_features == 784
    # Table I's CNN on CIFAR-10: convs 3→128→256→512→512→256 (3×3), three pools 32 → 4,
    # FC 4096 → 512 → 256 → 128 → 10
    convs = [(3, 128), (128, 256), (256, 512), (512, 512), (512, 256)]
    fcs = [(256 * 4 * 4, 512), (512, 256), (256, 128), (128, 10)]
    by_hand = sum(i * o * 9 + o for i, o in convs) + sum(i * o + o for i, o in fcs)
    with torch.device("meta"):
        cnn = build_model("flfcr_cnn", DATASETS["cifar10"])
    assert _params(cnn) == by_hand == 7_281_802
    assert cnn.body.fc1.in_features == 4096


def test_fed_dnn_is_three_fully_connected_layers() -> None:
    model = build_model("fed_dnn", DATASETS["mnist"])
    widths = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert widths == [(784, 200), (200, 200), (200, 10)]
