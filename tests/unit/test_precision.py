"""training.precision: fp32 (default), tf32 (GPUs), bf16 autocast with float32 master weights."""

from __future__ import annotations

import pytest
import torch

from fedskew.config import ConfigError, load_params
from fedskew.engine.precision import check_precision, precision_scope
from fedskew.engine.simulation import run_training


def test_tf32_is_refused_off_a_gpu_and_unknown_values_are_named() -> None:
    with pytest.raises(ConfigError, match="tf32 needs an NVIDIA GPU"):
        check_precision("tf32", torch.device("cpu"))
    with pytest.raises(ConfigError, match="fp32, tf32, bf16"):
        check_precision("fp16", torch.device("cpu"))
    check_precision("bf16", torch.device("cpu"))


def test_validation_refuses_tf32_on_a_cpu_device_and_unknown_precisions(tiny_params) -> None:
    tiny_params["training"]["tiny"].update(precision="tf32", device="cpu")
    with pytest.raises(ConfigError, match=r"training\.tiny: precision 'tf32' needs an NVIDIA GPU"):
        load_params(tiny_params)
    tiny_params["training"]["tiny"]["precision"] = "half"
    with pytest.raises(ConfigError, match=r"training\.tiny\.precision: 'half' is not allowed"):
        load_params(tiny_params)


def test_precision_enters_the_run_id_only_when_it_is_not_fp32(tiny_params) -> None:
    def run_id(**training) -> str:
        tiny_params["training"]["tiny"].update(training)
        return load_params(tiny_params).run("tiny", "digits", "dir0.5", "fedavg", 0).run_id

    published = run_id()
    assert run_id(precision="fp32") == published  # the runs made before the setting keep their ids
    assert run_id(precision="bf16") != published


def test_bf16_scope_runs_matrix_products_in_bfloat16_and_losses_in_float32() -> None:
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    with precision_scope("bf16", torch.device("cpu")):
        logits = layer(x)
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 0, 1]))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    with precision_scope("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32


def test_a_bf16_run_trains_with_float32_weights_close_to_fp32(project, tiny_params) -> None:
    from tests.helpers import method_config

    fp32 = run_training(method_config(tiny_params, "fedavg", training={"model": "cnn"}), root=project)
    bf16_cfg = method_config(tiny_params, "fedavg", training={"model": "cnn", "precision": "bf16"})
    bf16 = run_training(bf16_cfg, root=project)
    assert bf16.history[-1]["test_acc"] != fp32.history[-1]["test_acc"] or \
        bf16.history[-1]["train_loss"] != fp32.history[-1]["train_loss"]  # it did compute in bfloat16
    assert abs(bf16.final["final_acc"] - fp32.final["final_acc"]) < 0.15
    from fedskew import paths
    from fedskew.engine.checkpoint import load_checkpoint

    state = load_checkpoint(project / bf16_cfg.path(paths.CHECKPOINT_DIR),
                            bf16_cfg.run_id)["global_state"]
    assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())  # master weights
