"""The arithmetic a run trains and evaluates in: `training.precision`.

- ``fp32`` (the default): float32 throughout. On a GPU, TF32 tensor-core arithmetic is
  switched off for matrix products *and* convolutions (PyTorch leaves it on for cuDNN
  convolutions by default), so that fp32 means fp32 on every device.
- ``tf32``: float32 storage, with matrix products and convolutions on TF32 tensor cores
  (10-bit mantissa products, float32 accumulation). NVIDIA GPUs only (Ampere and later);
  refused on a CPU, where it would silently be fp32 under another name and run id.
- ``bf16``: autocast to bfloat16 for the operations autocast lists (matrix products,
  convolutions) in forward and backward; parameters, gradients, optimiser state, losses
  (autocast runs softmax and cross entropy in float32) and aggregation stay float32: the
  master weights. bfloat16 has float32's exponent range, so no loss scaling is needed.
  Runs on a GPU and, more slowly, on a CPU (what the CPU tests exercise).

A run's numbers depend on its precision, so a setting other than fp32 enters its run id
(fedskew.training_config.LATER_TRAINING_OPTIONS keeps fp32 out of it, so the runs published before
the setting existed keep their ids). Before a table uses a lower precision, its final
accuracy must be shown to match fp32 within seed noise on a real-data setting (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterator

import torch

from fedskew.config import ConfigError
from fedskew.training_config import TrainingConfig

# The values training.precision takes, as its field declares them (fp32, tf32, bf16)
PRECISIONS: tuple[str, ...] = typing.get_args(typing.get_type_hints(TrainingConfig)["precision"])


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision the device cannot compute in, with what to use instead."""
    if precision not in PRECISIONS:
        raise ConfigError(f"training.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(f"training.precision tf32 needs an NVIDIA GPU (TF32 is a tensor-core format), but this run "
                          f"trains on {device.type}; use fp32 (or bf16) here, or training.device cuda")


def configure_precision(precision: str, device: torch.device) -> None:
    """Set the process-wide TF32 switches for `precision` (they matter on CUDA devices only)."""
    check_precision(precision, device)
    if device.type == "cuda":
        allow = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow


@contextlib.contextmanager
def precision_scope(precision: str, device: torch.device) -> Iterator[None]:
    """Where the round and the evaluation run: bfloat16 autocast for bf16, nothing otherwise."""
    if precision != "bf16":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        yield
