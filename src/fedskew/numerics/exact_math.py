"""Square roots with the same bits on every x86-64 CPU.

IEEE 754 fixes a square root to the correctly rounded result, and every x86-64 CPU's sqrt
instructions give it. torch's CPU `sqrt` does not always use them: on vectors of more than about 16
elements under the portable kernels (`fedskew.numerics.cpu_pin`: ATen at AVX2), about one float32 result in
seven (one float64 result in eighty) sits a unit in the last place from the correctly rounded value,
and which ones differs between an AMD Zen 4 with AVX-512 and other x86-64 CPUs (`benchmarks/cpu_portability.py
--checks ops`, docs/reliability.md). A method whose update takes a square root (Adam's and the FedOpt
servers' denominators, FedDecorr's normalisation, FL-FCR's sampling factor) then trains to other
numbers on another CPU.

`sqrt` here is numpy's correctly rounded square root wherever the portable kernels are in force and
the tensor is a plain CPU float32 or float64 tensor, with autograd (d√x = 1 / (2√x), as torch's own
backward computes it). Elsewhere (a GPU, `FEDSKEW_CPU_KERNELS=native`, a tensor under a `torch.func`
transform, another dtype) it is torch.sqrt: there results are not promised to carry across machines.
"""

from __future__ import annotations

import numpy as np
import torch

from fedskew.numerics import cpu_pin

_EXACT_DTYPES = (torch.float32, torch.float64)


def _exact(t: torch.Tensor) -> torch.Tensor:
    with np.errstate(all="ignore"):  # sqrt of a negative number is NaN, silently, as in torch
        values = t.detach().contiguous().numpy()
        return torch.from_numpy(np.sqrt(values, out=np.empty_like(values)))  # `out`: an array even for 0-d


class _ExactSqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        result = _exact(x)
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (result,) = ctx.saved_tensors
        return grad / (2 * result)  # torch.sqrt's backward: grad / (2 * result)


def reaches(t: torch.Tensor) -> bool:
    """Whether `sqrt(t)` is numpy's correctly rounded one (see the module's docstring)."""
    return (t.device.type == "cpu" and t.dtype in _EXACT_DTYPES and cpu_pin.active()
            and not torch._C._functorch.is_functorch_wrapped_tensor(t))


def sqrt(t: torch.Tensor) -> torch.Tensor:
    """√t, correctly rounded on CPU under the portable kernels; torch.sqrt elsewhere."""
    if not reaches(t):
        return torch.sqrt(t)
    if t.requires_grad and torch.is_grad_enabled():
        return _ExactSqrt.apply(t)
    return _exact(t)
