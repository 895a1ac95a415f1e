"""Checkpoints from elsewhere are data: a crafted `last.pt` never runs code, and one that is not a fedskew
checkpoint of this run's shape is moved aside with one warning line while the run retrains to the same result.

The header's sha256 is written by whoever wrote the file, so every file here carries a self-consistent
header: it is the loader, not the hash, that has to refuse them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import pathlib
import shutil

import pytest
import torch

from fedskew import paths
from fedskew.cli import cmd_train
from fedskew.config import load_params
from fedskew.engine.checkpoint import _MAGIC, CHECKPOINT_NAME, load_checkpoint, read_checkpoint
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.runfiles import read_history, read_metrics
from tests.helpers import method_config, single_setting


class _Payload:
    """Unpickling this touches a file: what a crafted checkpoint could run instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def _write_with_valid_header(path: pathlib.Path, obj: object) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    body = buffer.getvalue()
    path.write_bytes(_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def _stopped_run(cfg, rounds_done: int = 2) -> tuple[object, pathlib.Path, dict]:
    """The uninterrupted result of `cfg`, then a checkpoint of it after `rounds_done` rounds (path, payload)."""
    full = run_training(cfg)
    shutil.rmtree(cfg.path(paths.CHECKPOINT_DIR))
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=rounds_done)
    path = cfg.path(paths.CHECKPOINT_DIR) / CHECKPOINT_NAME
    return full, path, read_checkpoint(path)


def _retrain(cfg, path, caplog):
    """Run `cfg` again over the checkpoint at `path`: (its result, the warnings that distrust a checkpoint, the
    files moved aside, the round of the checkpoint left in place)."""
    with caplog.at_level(logging.WARNING):
        again = run_training(cfg)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "cannot be trusted" in r.getMessage()]
    aside = list(path.parent.glob(f"{CHECKPOINT_NAME}.corrupt-*"))
    return again, warnings, aside, load_checkpoint(path.parent, cfg.run_id)["round"]


def test_a_checkpoint_whose_pickle_runs_code_never_runs_it(project, tmp_path, caplog) -> None:
    params = load_params(project / "params.yaml")
    cfg = params.runs(["tiny"])[0]
    full, path, payload = _stopped_run(cfg)
    marker = tmp_path / "payload-ran"
    _write_with_valid_header(path, {**payload, "history": [*payload["history"][:-1], _Payload(marker)]})
    # The file is hostile for real: the loader fedskew used before runs the payload.
    torch.load(io.BytesIO(path.read_bytes().partition(b"\n")[2]), weights_only=False)
    assert marker.exists()
    marker.unlink()

    caplog.set_level(logging.INFO)
    cmd_train(params, argparse.Namespace(suite="tiny", dataset=cfg.dataset, partition=cfg.partition,
                                         method=cfg.method, seed=[cfg.seed], threads=1))
    assert not marker.exists()
    assert "weights-only" in caplog.text and "retraining the run from round 0" in caplog.text
    assert "resuming" not in caplog.text
    assert len(read_history(cfg)) == len(full.history)
    assert read_metrics(cfg)["final_acc"] == full.final["final_acc"]  # retrained from round 0 to the same result


def test_a_resume_says_what_it_resumed_from(project, caplog) -> None:
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    full, path, _ = _stopped_run(cfg)
    with caplog.at_level(logging.INFO):
        resumed = run_training(cfg)
    assert resumed.resumed_from == 2 and resumed.history == full.history
    assert f"resuming after round 2 from {path}" in caplog.text


def _drop_key(payload: dict) -> dict:
    return {k: v for k, v in payload.items() if k != "history"}


def _other_type(payload: dict) -> dict:
    return {**payload, "algorithm_state": {"dtype": torch.float32}}  # torch's safe loader allows dtypes; fedskew not


def _history_short(payload: dict) -> dict:
    return {**payload, "history": payload["history"][:1]}


def _wrong_shape(payload: dict) -> dict:
    name = next(iter(payload["global_state"]))
    return {**payload, "global_state": {**payload["global_state"], name: torch.zeros(3)}}


def _extra_tensor(payload: dict) -> dict:
    return {**payload, "global_state": {**payload["global_state"], "extra.weight": torch.zeros(1)}}


def _not_a_dict(payload: dict) -> list:
    return [payload]


@pytest.mark.parametrize("damage", [_drop_key, _other_type, _history_short, _wrong_shape, _extra_tensor, _not_a_dict],
                         ids=["a key missing", "a type no checkpoint holds", "history shorter than its round",
                              "a tensor of another shape", "a tensor the model lacks", "not a mapping"])
def test_a_body_that_is_not_this_runs_checkpoint_is_moved_aside(project, caplog, damage) -> None:
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    full, path, payload = _stopped_run(cfg)
    _write_with_valid_header(path, damage(payload))
    again, warnings, aside, last_round = _retrain(cfg, path, caplog)
    assert (again.resumed_from, again.history, again.final) == (0, full.history, full.final)
    assert len(warnings) == 1 and str(path) in warnings[0] and "retraining the run from round 0" in warnings[0]
    assert len(aside) == 1 and last_round == cfg.training["rounds"]


@pytest.fixture
def tiny_params(tiny_params):
    tiny_params["training"]["tiny"].update(rounds=4, checkpoint_every=2, eval_every=1)
    return single_setting(tiny_params)


@pytest.mark.parametrize("method", ["flfcr", "scaffold", "splitfed_v3"])
def test_a_method_state_the_method_cannot_take_is_moved_aside(project, tiny_params, caplog, method) -> None:
    """A valid header and payload whose algorithm_state lacks what the method keeps: once a KeyError on every retry."""
    cfg = method_config(tiny_params, method)
    full, path, payload = _stopped_run(cfg)
    assert payload["algorithm_state"], f"{method} keeps state across rounds"
    _write_with_valid_header(path, {**payload, "algorithm_state": {"unexpected": torch.zeros(1)}})
    again, warnings, aside, last_round = _retrain(cfg, path, caplog)
    assert (again.resumed_from, again.history, again.final) == (0, full.history, full.final)
    assert len(warnings) == 1 and str(path) in warnings[0] and "retraining the run from round 0" in warnings[0]
    assert len(aside) == 1 and last_round == cfg.training["rounds"]
