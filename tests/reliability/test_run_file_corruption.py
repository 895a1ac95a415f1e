"""Damaged checkpoints and run files: never resumed from or aggregated, always named, always rebuildable."""

from __future__ import annotations

import argparse
import logging
import os
import shutil

import pytest

from fedskew import paths
from fedskew.cli import cmd_train, main
from fedskew.config import load_params
from fedskew.engine.checkpoint import CHECKPOINT_NAME, load_checkpoint, read_checkpoint
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.runfiles import RunFileError, read_history, read_metrics


def _config(project):
    params = load_params(project / "params.yaml")
    return params, params.runs(["tiny"])[0]


def _checkpoint(cfg):
    return cfg.path(paths.CHECKPOINT_DIR) / CHECKPOINT_NAME


def _flip_byte(path, offset_fraction: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * offset_fraction)] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped bit in the weights", "truncated", "empty",
                                    "written by an older fedskew"])
def test_a_damaged_checkpoint_is_moved_aside_and_the_run_restarts_to_the_same_result(project, caplog,
                                                                                     damage) -> None:
    _, cfg = _config(project)
    full = run_training(cfg)
    shutil.rmtree(cfg.path(paths.CHECKPOINT_DIR))
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    path = _checkpoint(cfg)
    if damage == "flipped bit in the weights":
        _flip_byte(path, 0.6)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a bare torch.save, as fedskew wrote before checkpoints carried a hash
        import torch

        torch.save(read_checkpoint(path), path)
    with caplog.at_level(logging.WARNING):
        again = run_training(cfg)
    assert again.resumed_from == 0
    assert again.history == full.history and again.final == full.final
    assert str(path) in caplog.text and "retraining the run from round 0" in caplog.text
    assert len(list(path.parent.glob(f"{CHECKPOINT_NAME}.corrupt-*"))) == 1
    assert load_checkpoint(path.parent, cfg.run_id)["round"] == cfg.training["rounds"]


def _train(project) -> object:
    params, cfg = _config(project)
    cmd_train(params, argparse.Namespace(suite="tiny", dataset=cfg.dataset, partition=cfg.partition,
                                         method=cfg.method, seed=cfg.seed, threads=1))
    return cfg


def _cut_lines(path, keep: int) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep]))


DAMAGES = {
    "history.csv cut short": (paths.RUN_HISTORY, lambda p: _cut_lines(p, 3), "does not match the sha256"),
    "history.csv value edited": (paths.RUN_HISTORY, lambda p: p.write_text(p.read_text().replace("0.", "0.9", 1)),
                                 "does not match the sha256"),
    "config.yaml edited": (paths.RUN_CONFIG, lambda p: p.write_text(p.read_text() + "# edited\n"),
                           "does not match the sha256"),
    "metrics.json value edited": (paths.RUN_METRICS, lambda p: p.write_text(
        p.read_text().replace('"final_round": 4', '"final_round": 3')), "does not match its recorded sha256"),
    "metrics.json truncated": (paths.RUN_METRICS, lambda p: _cut_lines(p, 3), "not readable JSON"),
    "metrics.json without hashes": (paths.RUN_METRICS, lambda p: p.write_text('{"final_acc": 0.5}\n'),
                                    "records no integrity hashes"),
    "history.csv deleted": (paths.RUN_HISTORY, lambda p: p.unlink(), "cannot be read"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_aggregation_refuses_damaged_run_files_naming_the_file_and_the_rebuild(project, capsys, damage) -> None:
    cfg = _train(project)
    template, change, reason = DAMAGES[damage]
    target = project / cfg.path(template)
    change(target)
    with pytest.raises(RunFileError, match=reason):
        read_metrics(cfg)
    assert main(["aggregate", "--suite", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    assert str(cfg.path(template)) in err and reason in err
    assert f"snakemake --cores 1 --force {cfg.path(paths.RUN_METRICS)}" in err
    assert not (project / "results/tables/tiny.md").exists()


def test_the_rebuild_resumes_from_the_final_checkpoint_and_restores_identical_files(project, caplog) -> None:
    cfg = _train(project)
    originals = {t: (project / cfg.path(t)).read_bytes() for t in (paths.RUN_CONFIG, paths.RUN_HISTORY,
                                                                    paths.RUN_METRICS)}
    _cut_lines(project / cfg.path(paths.RUN_HISTORY), 2)
    os.remove(project / cfg.path(paths.RUN_METRICS))  # what `snakemake --force` does before re-running the job
    with caplog.at_level(logging.INFO):
        _train(project)
    assert f"resuming after round {cfg.training['rounds']}" in caplog.text  # no training repeated
    assert {t: (project / cfg.path(t)).read_bytes() for t in originals} == originals
    assert len(read_history(cfg)) == cfg.training["rounds"]
