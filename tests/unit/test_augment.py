"""Augmentation on normalised tensors (fedskew.data.augment): determinism, purity, hand-checked crops."""

from __future__ import annotations

import pytest
import torch

from fedskew.data.augment import AUGMENTATIONS, Augmenter, make_augmenter

MEAN = torch.tensor([0.49, 0.48, 0.45])
STD = torch.tensor([0.25, 0.24, 0.26])
NAMES = [name for name in AUGMENTATIONS if name != "none"]


def normalised_batch(b: int = 6, c: int = 3, h: int = 32, w: int = 32, seed: int = 0,
                     mean: torch.Tensor = MEAN, std: torch.Tensor = STD) -> torch.Tensor:
    """Random uint8 images, normalised as registry._normalise does."""
    pixels = torch.randint(0, 256, (b, c, h, w), generator=torch.Generator().manual_seed(seed))
    return (pixels.float() / 255.0 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_output_different_seed_different_output(name):
    augment = make_augmenter(name, MEAN, STD)
    x = normalised_batch()
    first, again, other = augment(x, gen(7)), augment(x, gen(7)), augment(x, gen(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("name", NAMES)
def test_clients_are_order_independent(name):
    """Each client's augmentation depends only on its own generator, not on who ran before."""
    augment = make_augmenter(name, MEAN, STD)
    xa, xb = normalised_batch(seed=1), normalised_batch(seed=2)
    torch.manual_seed(123)
    a_first = augment(xa, gen(11))
    b_second = augment(xb, gen(22))
    torch.manual_seed(456)  # a different global RNG state must not matter either
    b_first = augment(xb, gen(22))
    a_second = augment(xa, gen(11))
    assert torch.equal(a_first, a_second)
    assert torch.equal(b_first, b_second)


def test_autoaugment_leaves_the_global_rng_alone():
    augment = make_augmenter("autoaugment_cifar10", MEAN, STD)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    augment(normalised_batch(), gen(0))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", NAMES)
def test_input_is_not_modified_and_shape_dtype_device_kept(name):
    augment = make_augmenter(name, MEAN, STD)
    x = normalised_batch()
    before = x.clone()
    out = augment(x, gen(3))
    assert torch.equal(x, before)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert out.data_ptr() != x.data_ptr()


def test_crop_flip_by_hand_on_a_ramp():
    """A 1×4×4 ramp, padding 2: recompute the generator's draws and build each crop by plain indexing."""
    mean, std = torch.tensor([0.3]), torch.tensor([0.5])
    ramp = torch.arange(16, dtype=torch.float32).view(1, 1, 4, 4) / 15.0   # pixels in [0, 1]
    x = ((ramp - 0.3) / 0.5).repeat(8, 1, 1, 1)                            # 8 copies, normalised
    augment = Augmenter("crop_flip", mean, std, padding=2)
    out = augment(x, gen(2024))

    draws = gen(2024)
    offsets = torch.randint(0, 5, (8, 2), generator=draws)
    flips = torch.rand(8, generator=draws) < 0.5
    pad_value = (0.0 - 0.3) / 0.5                                          # pixel 0, normalised
    assert len(set(map(tuple, offsets.tolist()))) > 1 and 0 < int(flips.sum()) < 8  # the seed exercises both
    for i in range(8):
        top, left = int(offsets[i, 0]), int(offsets[i, 1])
        expected = torch.full((4, 4), pad_value)
        for r in range(4):
            for c in range(4):
                src_r, src_c = top + r - 2, left + c - 2                   # position in the unpadded image
                if 0 <= src_r < 4 and 0 <= src_c < 4:
                    expected[r, c] = x[i, 0, src_r, src_c]
        if flips[i]:
            expected = expected.flip(-1)
        assert torch.allclose(out[i, 0], expected), f"sample {i}: offsets {(top, left)}, flip {bool(flips[i])}"


def test_flip_only_without_padding():
    """padding 0: the crop is the image itself, so each sample is x or x.flip(-1) as the draw says."""
    x = normalised_batch(b=16)
    out = Augmenter("crop_flip", MEAN, STD, padding=0)(x, gen(9))
    draws = gen(9)
    torch.randint(0, 1, (16, 2), generator=draws)                          # the (all-zero) offsets
    flips = torch.rand(16, generator=draws) < 0.5
    assert 0 < int(flips.sum()) < 16
    for i in range(16):
        assert torch.equal(out[i], x[i].flip(-1) if flips[i] else x[i])


def test_reflect_padding_stays_inside_the_image_values():
    x = normalised_batch(b=4, h=8, w=8)
    out = Augmenter("crop_flip", MEAN, STD, padding=3, padding_mode="reflect")(x, gen(1))
    for i in range(4):
        assert set(out[i].flatten().tolist()) <= set(x[i].flatten().tolist())


def test_crop_flip_works_for_non_square_images():
    x = normalised_batch(b=3, c=1, h=6, w=10, mean=MEAN[:1], std=STD[:1])
    out = make_augmenter("crop_flip", MEAN[:1], STD[:1])(x, gen(0))
    assert out.shape == x.shape


@pytest.mark.parametrize("name", ["autoaugment_cifar10", "autoaugment_imagenet"])
def test_autoaugment_stays_in_the_normalised_pixel_range(name):
    x = normalised_batch(b=32)
    out = make_augmenter(name, MEAN, STD)(x, gen(4))
    low = (0.0 - MEAN.view(1, -1, 1, 1)) / STD.view(1, -1, 1, 1)
    high = (1.0 - MEAN.view(1, -1, 1, 1)) / STD.view(1, -1, 1, 1)
    eps = 1e-5
    assert (out >= low - eps).all() and (out <= high + eps).all()
    # the values are still normalised uint8 pixels: un-normalising gives integers
    pixels = (out * STD.view(1, -1, 1, 1) + MEAN.view(1, -1, 1, 1)) * 255.0
    assert torch.allclose(pixels, pixels.round(), atol=1e-3)
    assert not torch.equal(out, x)


def test_none_is_no_augmenter_and_unknown_names_list_the_valid_ones():
    assert make_augmenter("none") is None
    with pytest.raises(ValueError) as error:
        make_augmenter("randaugment", MEAN, STD)
    for name in AUGMENTATIONS:
        assert name in str(error.value)
    with pytest.raises(ValueError, match="mean and std"):
        make_augmenter("crop_flip")
