"""training.local_diagnostics: per-class accuracy of local models before/after local training, and its figure."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedskew.config import ConfigError, load_params
from fedskew.engine.diagnostics import LocalDiagnostics, class_groups
from fedskew.engine.simulation import run_training
from fedskew.report.local_drift import local_drift_figures, local_drift_frame
from fedskew.runfiles import write_run_files
from tests.helpers import method_config


def test_classes_split_by_the_clients_counts() -> None:
    # share under an even split: 100 / 4 = 25
    assert class_groups(torch.tensor([50, 5, 0, 45])) == {"majority": [0, 3], "minority": [1], "missing": [2]}
    assert class_groups(torch.tensor([10, 10, 10])) == {"majority": [0, 1, 2], "minority": [], "missing": []}


class Fixed(torch.nn.Module):
    """Predicts a fixed class per input index, so per-class accuracy is known by construction."""

    def __init__(self, predictions: list[int], num_classes: int) -> None:
        super().__init__()
        self.predictions = torch.tensor(predictions)
        self.num_classes = num_classes
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(self.predictions[x.long().flatten()], self.num_classes).float()


def test_row_averages_over_classes_then_clients_and_leaves_out_empty_groups() -> None:
    x = torch.arange(4).float().unsqueeze(1)
    y = torch.tensor([0, 1, 2, 3])
    diagnostics = LocalDiagnostics(x, y, 4)
    global_model = Fixed([0, 1, 2, 3], 4)  # everything right
    diagnostics.begin_round(global_model, global_model.state_dict())
    client = type("Client", (), {})()
    client.label_counts = torch.tensor([30, 5, 0, 0])  # share 8.75: majority 0, minority 1, missing 2, 3
    diagnostics.after_local(client, Fixed([0, 0, 0, 0], 4))  # only class 0 right after local training
    row = diagnostics.row()
    assert row == {"local_before_majority": 1.0, "local_after_majority": 1.0,
                   "local_before_minority": 1.0, "local_after_minority": 0.0,
                   "local_before_missing": 1.0, "local_after_missing": 0.0}


def _q2(tiny_params, **training):
    base = load_params(tiny_params).run("tiny", "digits", "q2", "fedavg", 0)
    return dataclasses.replace(base, training={**base.training, **training})


def test_diagnostics_add_columns_at_evaluated_rounds_and_change_nothing_else(project, tiny_params) -> None:
    plain = run_training(_q2(tiny_params))
    diagnosed = run_training(_q2(tiny_params, local_diagnostics=True))
    assert len(plain.history) == len(diagnosed.history)
    for before, after in zip(plain.history, diagnosed.history):
        assert {k: v for k, v in after.items() if not k.startswith("local_")} == before  # training untouched
        evaluated = "test_acc" in after
        assert any(k.startswith("local_") for k in after) == evaluated
    last = diagnosed.history[-1]
    assert {"local_before_missing", "local_after_missing", "local_before_majority"} <= set(last)  # q2: 2 classes each
    assert all(0.0 <= v <= 1.0 and not math.isnan(v) for k, v in last.items() if k.startswith("local_"))


def test_a_split_method_cannot_ask_for_diagnostics(project, tiny_params) -> None:
    cfg = method_config(tiny_params, "scala", training={"local_diagnostics": True})
    with pytest.raises(ConfigError, match="local_diagnostics needs a federated method"):
        run_training(cfg)


def test_the_figure_is_drawn_from_the_run_files(project, tiny_params) -> None:
    tiny_params["training"]["tiny"]["local_diagnostics"] = True
    params = load_params(tiny_params)
    for cfg in params.suite_runs("tiny"):
        result = run_training(cfg)
        write_run_files(cfg, result.history, result.final)
    frame = local_drift_frame(params, "tiny")
    assert set(frame["group"]) <= {"majority", "minority", "missing"} and len(frame) > 0
    assert frame[["before", "after"]].le(100).all().all() and frame[["before", "after"]].ge(0).all().all()
    written = local_drift_figures(params, "tiny")
    assert written and all(p.stat().st_size > 10_000 for p in written)


def test_validation_refuses_diagnostics_for_a_suite_with_split_methods(tiny_params) -> None:
    tiny_params["suites"]["tiny"]["methods"] = ["fedavg", "scala"]
    tiny_params["training"]["tiny"]["local_diagnostics"] = True
    with pytest.raises(ConfigError, match=r"training.tiny.local_diagnostics: suite 'tiny' runs split "
                                          r"method\(s\) scala"):
        load_params(tiny_params)
