"""Square roots with the same bits on every x86-64 CPU (fedskew.numerics.exact_math)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedskew.numerics import cpu_pin, exact_math

pytestmark = pytest.mark.skipif(not cpu_pin.active(), reason="the exact square root is for the portable kernels")


def _correctly_rounded(values: torch.Tensor) -> torch.Tensor:
    """float32 square roots rounded once from float64 ones: float64 carries more than twice float32's
    precision, so the double rounding is exact (a known property of IEEE square roots)."""
    return torch.from_numpy(np.sqrt(values.numpy().astype(np.float64)).astype(np.float32))


def test_float32_square_roots_are_correctly_rounded():
    values = torch.rand(5000, generator=torch.Generator().manual_seed(0)) * 10
    ours = exact_math.sqrt(values)
    assert ours.dtype == torch.float32 and torch.equal(ours, _correctly_rounded(values))


def test_float64_and_zero_dimensional_tensors():
    values = torch.rand(300, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(exact_math.sqrt(values), torch.from_numpy(np.sqrt(values.numpy())))
    scalar = exact_math.sqrt(torch.tensor(2.0))
    assert scalar.shape == () and scalar.item() == pytest.approx(2 ** 0.5)


def test_negative_numbers_give_nan_as_in_torch():
    out = exact_math.sqrt(torch.tensor([-1.0, 4.0]))
    assert torch.isnan(out[0]) and out[1].item() == 2.0


def test_gradient_is_torch_sqrt_backward_bit_for_bit():
    """d√x = grad / (2√x), the same operations as torch's own backward, on the correctly rounded root."""
    values = (torch.rand(64, generator=torch.Generator().manual_seed(2)) + 0.1).requires_grad_(True)
    upstream = torch.randn(64, generator=torch.Generator().manual_seed(3))
    ours = exact_math.sqrt(values)
    (ours * upstream).sum().backward()
    assert torch.equal(values.grad, upstream / (2 * _correctly_rounded(values.detach())))
    reference = values.detach().clone().requires_grad_(True)
    (torch.sqrt(reference) * upstream).sum().backward()
    torch.testing.assert_close(values.grad, reference.grad)  # the same derivative, up to the root's last bit


def test_native_kernels_other_dtypes_and_transforms_use_torch(monkeypatch):
    values = torch.rand(40)
    assert exact_math.reaches(values)
    assert not exact_math.reaches(values.to(torch.float16))
    seen = []
    torch.func.vmap(lambda row: seen.append(exact_math.reaches(row)) or row)(values.reshape(4, 10))
    assert seen == [False]  # a tensor under a torch.func transform has no numpy view
    monkeypatch.setenv(cpu_pin.ENV_VAR, "native")
    assert not exact_math.reaches(values)
    assert torch.equal(exact_math.sqrt(values), torch.sqrt(values))
