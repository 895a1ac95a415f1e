"""Dropout whose masks come from the generator of the client being trained.

`nn.Dropout` draws from torch's global generator, which every client of a round shares:
a client's masks then depend on the clients trained before it, and clients trained at
once (fedskew.engine.vectorised) could not agree with clients trained one after another.
fedskew's models use `Dropout` instead. While the engine trains a client it hands the
model that client's own dropout generator (`masks_from`), and every forward pass draws
each layer's mask from it. The vectorised path draws the same masks in advance, from
the same generator, in the same order and shapes (`draw_mask`, `dropout_plan`), and
hands them over for the batched forward (`given_masks`). Outside those scopes (evaluation,
a split method's server part) `Dropout` is `nn.Dropout`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

MaskSource = Callable[["Dropout", torch.Tensor], torch.Tensor]


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, no state) with an optional source of masks; see the module docstring."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)
        self.mask_source: MaskSource | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.mask_source is None or self.p == 0:
            return super().forward(x)
        if self.p == 1:
            return torch.zeros_like(x)
        keep = self.mask_source(self, x)
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))


def draw_mask(p: float, shape: tuple[int, ...] | torch.Size, generator: torch.Generator,
              device: torch.device) -> torch.Tensor:
    """A float32 keep-mask (1 with probability 1 − p) drawn from `generator`.

    Always float32, whatever the activations' dtype (bf16 autocast included), so the draws
    do not depend on the precision; the generator must live on `device`.
    """
    return torch.empty(tuple(shape), dtype=torch.float32, device=device).bernoulli_(1.0 - p, generator=generator)


def dropout_layers(model: nn.Module) -> list[Dropout]:
    return [m for m in model.modules() if isinstance(m, Dropout)]


def has_foreign_dropout(model: nn.Module) -> bool:
    """Whether `model` has a dropout layer that draws from torch's global generator (not a fedskew `Dropout`)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and not isinstance(m, Dropout) for m in model.modules())


@contextlib.contextmanager
def _sources(layers: list[Dropout], source: Callable[[Dropout], MaskSource]) -> Iterator[None]:
    for layer in layers:
        layer.mask_source = source(layer)
    try:
        yield
    finally:
        for layer in layers:
            layer.mask_source = None


def masks_from(model: nn.Module, generator: torch.Generator) -> contextlib.AbstractContextManager:
    """Within the scope, every training forward of `model` draws its dropout masks from `generator`."""
    def source(_: Dropout) -> MaskSource:
        return lambda layer, x: draw_mask(layer.p, x.shape, generator, x.device)
    return _sources(dropout_layers(model), source)


def given_masks(layers: list[Dropout], masks: list[torch.Tensor]) -> contextlib.AbstractContextManager:
    """Within the scope, layer i of `layers` applies `masks[i]` (shaped like its input; e.g. a per-client
    slice under vmap) instead of drawing one."""
    by_layer = dict(zip(layers, masks, strict=True))
    return _sources(layers, lambda layer: lambda _layer, x: by_layer[layer])


@torch.no_grad()
def dropout_plan(model: nn.Module, example: torch.Tensor) -> list[tuple[Dropout, tuple[int, ...]]]:
    """The active `Dropout` layers in the order a forward pass reaches them, each with the shape of its input
    without the batch dimension: what to draw, per sample, in the order the sequential path draws it.
    `example` is one input batch (its first row is used)."""
    reached: list[tuple[Dropout, tuple[int, ...]]] = []
    hooks = [layer.register_forward_pre_hook(lambda layer, args: reached.append((layer, tuple(args[0].shape[1:]))))
             for layer in dropout_layers(model) if layer.p > 0]
    was_training = model.training
    try:
        model.eval()  # the probe itself draws nothing
        model(example[:1])
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return reached
