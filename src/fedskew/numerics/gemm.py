"""The models' matrix products through one GEMM whose arithmetic the instruction set fixes.

Under the portable CPU kernels (fedskew.numerics.cpu_pin, recipe 2) every Linear and Conv2d layer of a model
computes its products, forward and backward, with numpy's OpenBLAS: the library is forced to its
Haswell kernels (AVX2 and FMA, one blocking) and to one thread. That gives the same bits on every
x86-64 CPU with AVX2 (benchmarks/cpu_portability.py) at AVX2 speed: about three times MKL's
`COMPATIBLE` branch, which the recipe used before (benchmarks/cpu_kernels.py). Tensors and numpy
arrays share their memory, so a product costs no copy.

- Linear: y = x Wᵀ + b; backward ∂x = g W, ∂W = gᵀ x, ∂b = Σ g.
- Conv2d (one group, zero padding): every output pixel's receptive field as a row (a strided view
  of the padded input, copied once), one product rows·Wᵀ for the whole batch; backward ∂W = gᵀ rows
  and ∂rows = g W, added back onto the input pixels one kernel position at a time, ∂b = Σ g.
- The closed-form dense step of vectorised rounds (fedskew.engine.closed_form) takes `bmm`.

The sums (the bias gradient, the kernel positions' adds) are ATen's, at AVX2. OpenBLAS's thread count changes the
bits of a product (measured: 1, 2, 4 and 8 threads give four answers), so the recipe fixes one
thread; `training.threads` sets ATen's threads, as before.

Where this does not reach, a layer computes as torch does (MKL `COMPATIBLE` under the pin): on a
GPU, under `torch.func` transforms (vmap, functional gradients), for dtypes numpy lacks (bfloat16,
float16) and under CPU autocast (`training.precision: bf16`, whose products autocast runs in bfloat16),
for grouped convolutions and other padding modes, and with `FEDSKEW_CPU_KERNELS=native`.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from numpy.lib.stride_tricks import as_strided
from torch import nn

from fedskew.numerics import cpu_pin

_NUMPY_DTYPES = (torch.float32, torch.float64)


class GemmSetupError(cpu_pin.PinTooLateError):
    """The portable kernels are asked for, but numpy's OpenBLAS is not at the kernels they need."""


@cache
def _openblas():
    """numpy's own OpenBLAS, as threadpoolctl sees it (None when numpy uses another BLAS).

    A process can hold several OpenBLAS libraries (scipy ships its own): the one that computes
    np.matmul is the one inside numpy's package folder."""
    from threadpoolctl import ThreadpoolController

    numpy_folder = Path(np.__file__).resolve().parent
    for library in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        folder = Path(library.filepath).resolve().parent
        if folder == numpy_folder.parent / "numpy.libs" or folder == numpy_folder or numpy_folder in folder.parents:
            return library
    return None


def describe() -> dict[str, str]:
    """numpy's BLAS for a run's provenance: name, version, kernels and threads."""
    library = _openblas()
    if library is None:
        return {"gemm_blas": "none (numpy has no OpenBLAS)"}
    return {"gemm_blas": f"OpenBLAS {library.version}", "gemm_kernels": str(library.architecture),
            "gemm_threads": str(library.num_threads)}


@cache
def enabled() -> bool:
    """Whether the layers' CPU products go through OpenBLAS: the portable kernels are in force.

    Checked once per process. Sets OpenBLAS to one thread. Raises GemmSetupError when OpenBLAS was
    loaded before fedskew could pin it (numpy imported first), rather than computing other bits."""
    if not cpu_pin.active():
        return False
    library = _openblas()
    wanted = cpu_pin.PIN_VARIABLES["OPENBLAS_CORETYPE"]
    if library is None or str(library.architecture).lower() != wanted.lower():
        found = "no OpenBLAS" if library is None else f"OpenBLAS at its {library.architecture} kernels"
        setting = os.environ.get("OPENBLAS_CORETYPE")
        if library is None:
            cause = ("this numpy is built on another BLAS; install numpy's wheel from requirements.lock (it ships "
                     "OpenBLAS), or set FEDSKEW_CPU_KERNELS=native (results that depend on the CPU model)")
        elif setting and setting.lower() != wanted.lower():
            cause = (f"OPENBLAS_CORETYPE is set to {setting!r}; unset it, or set FEDSKEW_CPU_KERNELS=native (results "
                     "that depend on the CPU model)")
        else:
            cause = f"numpy was loaded before fedskew set OPENBLAS_CORETYPE: {cpu_pin.how_to_pin()}"
        raise GemmSetupError(f"the portable CPU kernels need numpy's OpenBLAS at its {wanted} kernels, but numpy has "
                             f"{found}: {cause}")
    library.set_num_threads(1)
    return True


def _reaches(*tensors: torch.Tensor | None) -> bool:
    """Whether these tensors' product can go through OpenBLAS (see the module's docstring)."""
    if torch.is_autocast_enabled("cpu"):
        return False  # training.precision bf16: autocast casts the layer's product to bfloat16, as torch does
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cpu" or t.dtype not in _NUMPY_DTYPES or torch._C._functorch.is_functorch_wrapped_tensor(t):
            return False
    dtypes = {t.dtype for t in tensors if t is not None}
    return len(dtypes) == 1 and enabled()


def _blasable(t: torch.Tensor) -> np.ndarray:
    """A numpy view BLAS takes as it is: contiguous, or (2-D) a transposed contiguous matrix."""
    t = t.detach()
    if not (t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())):
        t = t.contiguous()
    return t.numpy()


def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b with numpy's OpenBLAS: every product of this module goes through here. NaN and infinity pass
    through silently, as in torch: the engine reports a diverged run itself."""
    with np.errstate(all="ignore"):
        return np.matmul(a, b)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b through OpenBLAS: 2-D, or stacked (numpy's matmul: one GEMM per matrix of the stack)."""
    return torch.from_numpy(product(_blasable(a), _blasable(b)))


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm's product, through OpenBLAS where it reaches (no autograd: the closed-form step)."""
    return mm(a, b) if _reaches(a, b) else torch.bmm(a, b)


class _LinearProduct(torch.autograd.Function):
    @staticmethod
    @np.errstate(all="ignore")  # NaN and infinity pass through (see `product`)
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.shape[-1])
        out = product(_blasable(x2), _blasable(weight).T)
        if bias is not None:
            out += bias.detach().numpy()
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        ctx.input_shape = x.shape
        return torch.from_numpy(out).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @np.errstate(all="ignore")
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g = _blasable(grad.reshape(-1, weight.shape[0]))
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.from_numpy(product(g, _blasable(weight))).reshape(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.from_numpy(product(g.T, _blasable(x2)))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = torch.from_numpy(g).sum(0)
        return grad_x, grad_weight, grad_bias


class _ConvProduct(torch.autograd.Function):
    """A convolution as one product, in numpy (its copies cost a third of torch's at these small shapes).

    The input, zero-padded, is laid out channels-last [N, H, W, C]; every output pixel's receptive field
    is a row [kh·kw·C] of a strided view of it (copied once), and the output is rows [N·H'·W', kh·kw·C]
    times the kernels [O, kh·kw·C] transposed: [N, H', W', O], returned as a contiguous [N, O, H', W'].
    The backward keeps the rows and the kernels (copies, so a later in-place change of the weight
    cannot reach them)."""

    @staticmethod
    @np.errstate(all="ignore")
    def forward(ctx, x, weight, bias, stride, padding, dilation):
        n, channels, height, width = x.shape
        out_channels, _, kh, kw = weight.shape
        out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        pixels = x.detach().numpy()
        padded = np.zeros((n, height + 2 * padding[0], width + 2 * padding[1], channels), pixels.dtype)
        padded[:, padding[0]:padding[0] + height, padding[1]:padding[1] + width] = pixels.transpose(0, 2, 3, 1)
        s_n, s_h, s_w, s_c = padded.strides
        fields = as_strided(padded, (n, out_h, out_w, kh, kw, channels),
                            (s_n, s_h * stride[0], s_w * stride[1], s_h * dilation[0], s_w * dilation[1], s_c))
        rows = fields.reshape(n * out_h * out_w, kh * kw * channels)
        kernels = np.ascontiguousarray(weight.detach().numpy().transpose(0, 2, 3, 1)).reshape(out_channels, -1)
        out = product(rows, kernels.T)  # [N·H'·W', O]
        if bias is not None:
            out += bias.detach().numpy()
        ctx.rows, ctx.kernels, ctx.has_bias = rows, kernels, bias is not None
        ctx.geometry = (x.shape, padded.shape, (kh, kw), stride, padding, dilation, (out_h, out_w))
        # Contiguous [N, O, H', W'], as torch's convolution gives: downstream kernels (batch norm's
        # sums) take their order from the layout, and a split model must compute what the whole one does.
        return torch.from_numpy(np.ascontiguousarray(out.reshape(n, out_h, out_w, out_channels).transpose(0, 3, 1, 2)))

    @staticmethod
    @np.errstate(all="ignore")
    def backward(ctx, grad):
        rows, kernels = ctx.rows, ctx.kernels
        input_shape, padded_shape, kernel, stride, padding, dilation, out_size = ctx.geometry
        out_channels = kernels.shape[0]
        g = np.ascontiguousarray(grad.detach().numpy().transpose(0, 2, 3, 1)).reshape(-1, out_channels)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_rows = product(g, kernels)  # [N·H'·W', kh·kw·C]
            # By kernel position [kh, kw, N, H', W', C], so that each position's add reads contiguous memory.
            parts = np.ascontiguousarray(grad_rows.reshape(input_shape[0], *out_size, *kernel, input_shape[1])
                                         .transpose(3, 4, 0, 1, 2, 5))
            grad_padded = np.zeros(padded_shape, g.dtype)
            # Each kernel position's gradients added onto the input pixels it read, in a fixed order.
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    rows_i = slice(i * dilation[0], i * dilation[0] + stride[0] * (out_size[0] - 1) + 1, stride[0])
                    cols_j = slice(j * dilation[1], j * dilation[1] + stride[1] * (out_size[1] - 1) + 1, stride[1])
                    grad_padded[:, rows_i, cols_j] += parts[i, j]
            grad_x = torch.from_numpy(np.ascontiguousarray(
                grad_padded[:, padding[0]:padding[0] + input_shape[2], padding[1]:padding[1] + input_shape[3]]
                .transpose(0, 3, 1, 2)))
        if ctx.needs_input_grad[1]:
            grad_kernels = product(g.T, rows)  # one product over every output pixel: [O, kh·kw·C]
            grad_weight = torch.from_numpy(np.ascontiguousarray(
                grad_kernels.reshape(out_channels, *kernel, input_shape[1]).transpose(0, 3, 1, 2)))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = torch.from_numpy(g).sum(0)
        return grad_x, grad_weight, grad_bias, None, None, None


class PortableLinear(nn.Linear):
    """nn.Linear whose CPU products go through OpenBLAS under the portable kernels (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _reaches(x, self.weight, self.bias):
            return _LinearProduct.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class PortableConv2d(nn.Conv2d):
    """nn.Conv2d whose CPU products go through OpenBLAS under the portable kernels (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = self.groups == 1 and self.padding_mode == "zeros" and isinstance(self.padding, tuple)
        if plain and x.dim() == 4 and _reaches(x, self.weight, self.bias):
            return _ConvProduct.apply(x, self.weight, self.bias, self.stride, self.padding, self.dilation)
        return super().forward(x)


_PORTABLE = {nn.Linear: PortableLinear, nn.Conv2d: PortableConv2d}


def portable_layers(model: nn.Module) -> nn.Module:
    """Give `model`'s Linear and Conv2d layers the portable forward, in place: the same modules,
    parameters and state-dict keys, only their class changes. Returns the model."""
    for layer in model.modules():
        portable = _PORTABLE.get(type(layer))
        if portable is not None:
            layer.__class__ = portable
    return model


def plain_layers(model: nn.Module) -> nn.Module:
    """The inverse of `portable_layers`, in place: torch's own forward again, for tools that trace torch's
    operations (a FLOP count sees no product computed in numpy). Returns the model."""
    plain = {portable: torch_layer for torch_layer, portable in _PORTABLE.items()}
    for layer in model.modules():
        if type(layer) in plain:
            layer.__class__ = plain[type(layer)]
    return model


def uses_portable_layers(model: nn.Module) -> bool:
    return any(isinstance(layer, (PortableLinear, PortableConv2d)) for layer in model.modules())
