"""The layers' products through numpy's OpenBLAS (fedskew.numerics.gemm, the portable recipe 2)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import torch
from torch import nn

from fedskew.config import load_params
from fedskew.data.registry import DatasetInfo
from fedskew.models import MODELS, build_model
from fedskew.numerics import cpu_pin, gemm
from tests.helpers import REPO, TINY_PARAMS

pytestmark = pytest.mark.skipif(not cpu_pin.active(), reason="the portable kernels apply to x86-64 CPUs")
PIN_VARIABLES = tuple(cpu_pin.PIN_VARIABLES)


def _portable(layer: nn.Module) -> nn.Module:
    twin = gemm.portable_layers(nn.Sequential(copy.deepcopy(layer)))[0]
    assert type(twin) is not type(layer)
    return twin


def _gradients(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = layer(x)
    return [out, *torch.autograd.grad(out, [x, *layer.parameters()], grad)]


@pytest.mark.parametrize("shape", [(5, 30), (4, 3, 30)])
def test_linear_agrees_with_torch_forward_and_backward(shape):
    torch.manual_seed(0)
    layer = nn.Linear(30, 7).double()
    x = torch.randn(*shape, dtype=torch.float64)
    grad = torch.randn(*shape[:-1], 7, dtype=torch.float64)
    for ours, theirs in zip(_gradients(_portable(layer), x, grad), _gradients(layer, x, grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", [dict(kernel_size=3, padding=1), dict(kernel_size=3, stride=2, padding=2, dilation=2),
                                     dict(kernel_size=(5, 3), bias=False), dict(kernel_size=1),
                                     dict(kernel_size=3, padding=(0, 1), stride=(1, 2))])
def test_conv2d_agrees_with_torch_forward_and_backward(options):
    torch.manual_seed(0)
    layer = nn.Conv2d(3, 6, **options).double()
    x = torch.randn(4, 3, 11, 9, dtype=torch.float64)
    grad = torch.randn_like(layer(x))
    for ours, theirs in zip(_gradients(_portable(layer), x, grad), _gradients(layer, x, grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_a_channels_last_input_gives_the_same_bits_as_a_contiguous_one():
    """An input's layout does not change a conv's bits (the layer lays it out channels-last itself)."""
    torch.manual_seed(0)
    layer = _portable(nn.Conv2d(4, 5, 3, padding=1))
    x = torch.randn(2, 4, 6, 6)
    assert torch.equal(layer(x), layer(x.contiguous(memory_format=torch.channels_last)))


def test_the_products_are_openblas_products():
    """PortableLinear's output is numpy's x·Wᵀ plus the bias, bit for bit, and OpenBLAS runs one thread at the
    recipe's kernels."""
    torch.manual_seed(0)
    layer = _portable(nn.Linear(64, 32))
    x = torch.randn(16, 64)
    expected = np.matmul(x.numpy(), layer.weight.detach().numpy().T) + layer.bias.detach().numpy()
    assert np.array_equal(layer(x).detach().numpy(), expected)
    record = gemm.describe()
    assert record["gemm_blas"].startswith("OpenBLAS") and record["gemm_threads"] == "1"
    assert record["gemm_kernels"].lower() == cpu_pin.PIN_VARIABLES["OPENBLAS_CORETYPE"].lower()


def test_what_the_gemm_does_not_reach_computes_as_torch_does():
    """Under vmap, for bfloat16, under CPU autocast and for grouped convolutions the layer is torch's own layer."""
    torch.manual_seed(0)
    linear = nn.Linear(6, 3)
    ours = _portable(linear)
    batch = torch.randn(4, 5, 6)
    assert torch.equal(torch.vmap(ours)(batch), torch.vmap(linear)(batch))
    half = nn.Linear(6, 3).bfloat16()
    assert torch.equal(_portable(half)(batch.bfloat16()), half(batch.bfloat16()))
    grouped = nn.Conv2d(4, 4, 3, groups=2)
    images = torch.randn(2, 4, 5, 5)
    assert torch.equal(_portable(grouped)(images), grouped(images))
    conv = nn.Conv2d(4, 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # training.precision bf16 on a CPU
        out, expected = _portable(linear)(batch), linear(batch)
        assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
        assert torch.equal(_portable(conv)(images), conv(images))


def test_models_take_their_recipe_and_keep_their_state_layout():
    info = DatasetInfo((784,), 10, False, False)
    portable = build_model("flfcr_mlp", info)
    assert all(type(m) is gemm.PortableLinear for m in portable.modules() if isinstance(m, nn.Linear))
    assert list(portable.state_dict()) == list(MODELS["flfcr_mlp"](info).state_dict())
    image = DatasetInfo((1, 8, 8), 10, True, False)
    for name in cpu_pin.RECIPE_1_MODELS:
        assert not gemm.uses_portable_layers(build_model(name, image))
    assert gemm.uses_portable_layers(build_model("cnn", image))  # the digits CNN of the committed suites


def _legacy_run_id(cfg) -> str:
    content = {k: v for k, v in cfg.to_dict().items() if k != "suite"}
    content["training"] = {k: v for k, v in cfg.training.items() if k not in ("threads", "on_divergence")}
    return content


def test_a_run_id_covers_the_kernel_recipe_of_its_model():
    """Runs of a recipe-1 model keep the ids they had before recipes were versioned; any other recipe is in the
    id, so a run computed under an older recipe is retrained, never reused."""
    params = load_params(copy.deepcopy(TINY_PARAMS))
    for model, recipe in (("logreg", 1), ("cnn", cpu_pin.RECIPE), ("mlp", cpu_pin.RECIPE)):
        raw = copy.deepcopy(TINY_PARAMS)
        raw["training"]["tiny"]["model"] = model
        cfg = load_params(raw).run("tiny", "digits", "q2", "fedavg", 0)
        content = _legacy_run_id(cfg)
        if recipe != 1:
            content["cpu_kernel_recipe"] = recipe
        assert cfg.run_id == hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16], model
    assert params.run("tiny", "digits", "q2", "fedavg", 0).run_id  # the tiny suite itself loads


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PIN_VARIABLES and k != cpu_pin.ENV_VAR}
    return {**env, "PYTHONPATH": str(REPO / "src"), **extra}


def test_an_openblas_loaded_at_other_kernels_is_refused_with_the_way_out():
    code = ("import numpy; from fedskew.numerics import cpu_pin; cpu_pin.apply(); from fedskew.numerics import gemm; gemm.enabled()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_clean_env(OPENBLAS_CORETYPE="Prescott"))
    assert done.returncode != 0 and "GemmSetupError" in done.stderr
    assert "OPENBLAS_CORETYPE is set to 'Prescott'; unset it" in done.stderr
    assert "FEDSKEW_CPU_KERNELS=native" in done.stderr


def test_the_installed_script_pins_the_kernels_as_python_m_does():
    """pyproject's `fedskew` script applies the pin before torch and numpy load, as `python -m fedskew` does."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["fedskew"]
    module, function = target.split(":")
    code = (f"import sys, os, json, importlib; sys.argv = ['fedskew', 'validate']; "
            f"code = getattr(importlib.import_module('{module}'), '{function}')(); "
            f"from fedskew.numerics import gemm; gemm.enabled(); "
            f"print(json.dumps({{'code': code, 'core': os.environ.get('OPENBLAS_CORETYPE'), **gemm.describe()}}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=_clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["code"] == 0 and record["core"] == "Haswell" and record["gemm_kernels"] == "Haswell"
