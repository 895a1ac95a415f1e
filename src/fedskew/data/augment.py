"""Data augmentation on normalised image tensors, applied per minibatch inside local training.

The engine keeps a dataset as one normalised float tensor (registry.load: pixels scaled
to [0, 1], then standardised per channel with the training mean/std) and a client is a
set of indices into it. Augmentation therefore works on a batch `x[batch]` of that
tensor, not on PIL images in a per-sample pipeline (docs/design.md: "augmentation runs
per batch on tensors").

Kinds (names for `make_augmenter`):

- ``"none"``: no augmentation (`make_augmenter` returns None).
- ``"crop_flip"``: the standard CIFAR augmentation that FedLC (Zhang et al., ICML 2022)
  and FedED (Guo et al., 2024) train with, i.e. torchvision's
  ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()``: pad every side by 4 pixels,
  take a random H×W crop (H×W = the input size, so it is generic: 32×32 for CIFAR, 64×64
  for TinyImageNet, ...), flip horizontally with probability 1/2. Padding is **zero in
  pixel space** by default, exactly what ``RandomCrop(..., padding=4)`` (fill=0) does
  before ``ToTensor``/``Normalize``: in the normalised tensor the padded value is
  therefore ``-mean/std`` per channel, not 0. ``padding_mode="reflect"`` is available too.
- ``"autoaugment_cifar10"`` / ``"autoaugment_imagenet"``: FedED's augmentation for
  CIFAR-10/100 and TinyImageNet: crop + flip as above, then torchvision's AutoAugment
  (Cubuk et al., CVPR 2019) with the CIFAR10 policy (CIFAR) or the IMAGENET policy
  (TinyImageNet). AutoAugment works on uint8 images, so each image is un-normalised
  (x·std + mean), scaled to [0, 255], clamped, rounded to uint8, augmented, and
  normalised again. Since the stored images were uint8 to begin with, the round trip is
  lossless up to float rounding.

Randomness. Every random choice comes from the `generator` passed in, the client's
per-round generator (ClientContext.generator, seeded by (seed, round, client)), so an
augmented run stays independent of the order in which clients train. Crop offsets and
flips are drawn per sample with ``torch.randint`` / ``torch.rand`` on that (CPU)
generator and then moved to the batch's device, so a CPU and a GPU run draw the same
offsets. torchvision's AutoAugment draws from the *global* RNG; one 62-bit seed per
sample is drawn from `generator`, and each sample is augmented under
``torch.random.fork_rng(devices=[])`` with the global CPU generator seeded to it (only
the CPU one: torchvision draws there, and CUDA generators, e.g. for dropout, stay
untouched). The global CPU RNG state is restored afterwards, and the sub-policy
(AutoAugment picks one per call) is chosen per sample, as in the papers' per-image
pipelines.

Cost: crop + flip is vectorised (about 3 ms for 64 CIFAR images on one CPU thread);
AutoAugment runs torchvision once per image (about 1 ms per 32×32 image on one thread).

The input batch is never modified; the result is a new tensor of the same shape, dtype
and device. ``make_augmenter("none")`` returns None, so a caller that skips the call in
that case leaves the client's random stream exactly as it was without augmentation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

AUGMENTATIONS = ("none", "crop_flip", "autoaugment_cifar10", "autoaugment_imagenet")
_KINDS = ("crop_flip", "autoaugment")
_POLICIES = ("cifar10", "imagenet")
_SEED_HIGH = 2 ** 62  # per-sample AutoAugment seeds are drawn from the client's generator in [0, 2^62)


def _channel_stats(value: torch.Tensor | Sequence[float] | float, name: str) -> torch.Tensor:
    """mean or std as a float tensor of shape [1, C, 1, 1] (accepts [C], [1, C, 1, 1], a scalar)."""
    t = torch.as_tensor(value, dtype=torch.float32).detach()
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    return t.reshape(1, -1, 1, 1).clone()


class Augmenter:
    """Random augmentation of a normalised image batch [B, C, H, W], driven by a generator.

    Args:
        kind: ``"crop_flip"`` or ``"autoaugment"`` (= crop_flip, then AutoAugment).
        mean, std: the per-channel statistics the data was normalised with (shape [C],
            [1, C, 1, 1] or a scalar), in [0, 1] pixel units, as in registry._normalise.
            They define the padding value (pixel 0 ↦ −mean/std) and the uint8 round trip
            of AutoAugment.
        policy: AutoAugment policy, ``"cifar10"`` or ``"imagenet"``; required for kind
            ``"autoaugment"``, not allowed for ``"crop_flip"``.
        padding: pixels padded on each side before the random crop (4 in the papers; 0
            turns the crop off and leaves only the flip).
        padding_mode: ``"zeros"`` (pixel value 0, as torchvision's RandomCrop) or
            ``"reflect"``.
        flip_p: probability of a horizontal flip.

    ``augmenter(x, generator)`` returns the augmented batch; `x` is left unchanged.
    """

    def __init__(self, kind: str, mean: torch.Tensor | Sequence[float] | float,
                 std: torch.Tensor | Sequence[float] | float, policy: str | None = None, *,
                 padding: int = 4, padding_mode: str = "zeros", flip_p: float = 0.5):
        if kind not in _KINDS:
            raise ValueError(f"unknown augmentation kind {kind!r}; choose one of {', '.join(_KINDS)}")
        if kind == "autoaugment" and policy not in _POLICIES:
            raise ValueError(f"autoaugment needs policy one of {', '.join(_POLICIES)}, got {policy!r}")
        if kind == "crop_flip" and policy is not None:
            raise ValueError(f"crop_flip takes no AutoAugment policy (got {policy!r})")
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        if padding_mode not in ("zeros", "reflect"):
            raise ValueError(f"padding_mode must be 'zeros' or 'reflect', got {padding_mode!r}")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {flip_p}")
        self.kind, self.policy = kind, policy
        self.padding, self.padding_mode, self.flip_p = int(padding), padding_mode, float(flip_p)
        self.mean = _channel_stats(mean, "mean")
        self.std = _channel_stats(std, "std")
        if self.mean.numel() != self.std.numel():
            raise ValueError(f"mean has {self.mean.numel()} channels, std {self.std.numel()}")
        if (self.std <= 0).any():
            raise ValueError("std must be positive")
        self._autoaugment = None
        if kind == "autoaugment":
            from torchvision.transforms import v2

            self._autoaugment = v2.AutoAugment(v2.AutoAugmentPolicy(policy))

    def __repr__(self) -> str:
        policy = f", policy={self.policy!r}" if self.policy else ""
        return f"Augmenter({self.kind!r}{policy}, padding={self.padding}, padding_mode={self.padding_mode!r})"

    # ------------------------------------------------------------------ helpers
    def _stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        channels = x.shape[1]
        if self.mean.numel() not in (1, channels):
            raise ValueError(f"the batch has {channels} channels, mean/std have {self.mean.numel()}")
        return self.mean.to(x.device, x.dtype), self.std.to(x.device, x.dtype)

    def _crop_flip(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Pad, crop back to H×W at a random offset, flip with probability flip_p; per sample.

        Draws, in this order, from `generator`: offsets = randint(0, 2·padding + 1, (B, 2))
        (column 0: top, column 1: left, in the padded image), then flips = rand(B) < flip_p.
        """
        b, _, h, w = x.shape
        p = self.padding
        draw_on = generator.device  # the client's generator (CPU in the engine); results move to x's device
        offsets = torch.randint(0, 2 * p + 1, (b, 2), generator=generator, device=draw_on).to(x.device)
        flips = (torch.rand(b, generator=generator, device=draw_on) < self.flip_p).to(x.device)
        if p == 0:
            padded = x
        elif self.padding_mode == "reflect":
            padded = F.pad(x, (p, p, p, p), mode="reflect")
        else:
            mean, std = self._stats(x)
            fill = (-mean / std).expand(b, -1, h + 2 * p, w + 2 * p)  # pixel value 0, normalised
            padded = fill.clone()
            padded[:, :, p:p + h, p:p + w] = x
        rows = offsets[:, :1] + torch.arange(h, device=x.device)          # [B, H]
        cols = offsets[:, 1:] + torch.arange(w, device=x.device)          # [B, W]
        cols = torch.where(flips[:, None], cols.flip(1), cols)            # flip = read columns backwards
        batch = torch.arange(b, device=x.device)[:, None, None, None]
        channel = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]

    def _auto_augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """AutoAugment per sample on the uint8 image, under a seed drawn from `generator`."""
        mean, std = self._stats(x)
        pixels = ((x * std + mean) * 255.0).clamp_(0.0, 255.0).round_().to(torch.uint8)
        seeds = torch.randint(0, _SEED_HIGH, (x.shape[0],), generator=generator, device=generator.device).tolist()
        out = torch.empty_like(pixels)
        # torchvision draws from the global CPU generator: seed it per sample, restore it after.
        # (torch.manual_seed would also reseed the CUDA generators, which fork_rng(devices=[])
        # does not restore; the CPU default generator alone is enough.)
        with torch.random.fork_rng(devices=[]):
            for i, seed in enumerate(seeds):
                torch.default_generator.manual_seed(seed)
                out[i] = self._autoaugment(pixels[i])
        return (out.to(x.dtype) / 255.0 - mean) / std

    # ------------------------------------------------------------------ the call
    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment a normalised batch [B, C, H, W]; returns a new tensor, `x` is not changed."""
        if x.dim() != 4:
            raise ValueError(f"expected a batch [B, C, H, W], got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"expected a normalised float batch, got dtype {x.dtype}")
        if x.shape[0] == 0:
            return x.clone()
        with torch.no_grad():
            out = self._crop_flip(x, generator)
            if self._autoaugment is not None:
                out = self._auto_augment(out, generator)
        return out


def make_augmenter(name: str, mean: torch.Tensor | Sequence[float] | float | None = None,
                   std: torch.Tensor | Sequence[float] | float | None = None, **options) -> Augmenter | None:
    """The augmenter for a configured name, or None for ``"none"``.

    Names: ``"none"``, ``"crop_flip"`` (FedLC, FedED), ``"autoaugment_cifar10"`` (FedED,
    CIFAR-10/100), ``"autoaugment_imagenet"`` (FedED, TinyImageNet). `mean`/`std` are
    the per-channel statistics the data was normalised with (pixel units in [0, 1]);
    every name but "none" needs them. `options` go to Augmenter (padding, padding_mode,
    flip_p).
    """
    if name not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {name!r}; valid names: {', '.join(AUGMENTATIONS)}")
    if name == "none":
        return None
    if mean is None or std is None:
        raise ValueError(f"augmentation {name!r} needs the mean and std the data was normalised with")
    if name == "crop_flip":
        return Augmenter("crop_flip", mean, std, **options)
    return Augmenter("autoaugment", mean, std, policy=name.removeprefix("autoaugment_"), **options)
