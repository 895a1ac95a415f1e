"""Every registered method resumes bit-identically from a mid-run checkpoint.

State a method keeps across rounds (control variates, FedDyn's gradients, MOON's
previous models, server optimiser moments, FedEXP's schedule, ...) must be in its
state_dict, or the resumed run diverges from the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl import ALGORITHMS


@pytest.fixture
def tiny_params(tiny_params):
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    tiny_params["suites"]["tiny"]["seeds"] = [0]
    tiny_params["training"]["tiny"].update(rounds=4, checkpoint_every=2, eval_every=1, participation=0.75)
    return tiny_params


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_resume_gives_the_uninterrupted_history(project, tiny_params, method):
    base = load_params(tiny_params).run("tiny", "digits", "dir0.5", "fedavg", 0)
    cfg = dataclasses.replace(base, method=method, method_spec={"algorithm": method,
                                                                **ALGORITHMS[method].hyperparameters})
    checkpoints = project / cfg.path(paths.CHECKPOINT_DIR)

    uninterrupted = run_training(cfg).history
    shutil.rmtree(checkpoints)
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    resumed = run_training(cfg)

    assert resumed.resumed_from == 2
    assert resumed.history == uninterrupted
    # Communication is logged for every method, both directions, every round.
    assert all(row["bytes_up"] > 0 and row["bytes_down"] > 0 for row in uninterrupted)
