"""Every registered method resumes bit-identically from a mid-run checkpoint.

State a method keeps across rounds (control variates, FedDyn's gradients, MOON's
previous models, server optimiser moments, FedEXP's schedule, ...) must be in its
state_dict, or the resumed run diverges from the uninterrupted one.
"""

from __future__ import annotations

import shutil

import pytest

from fedskew import paths
from fedskew.algorithms import ALGORITHMS
from fedskew.engine.simulation import RunStopped, run_training
from tests.helpers import method_config, single_setting


@pytest.fixture
def tiny_params(tiny_params):
    tiny_params["training"]["tiny"].update(rounds=4, checkpoint_every=2, eval_every=1, participation=0.75)
    return single_setting(tiny_params)


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_resume_gives_the_uninterrupted_history(project, tiny_params, method):
    cfg = method_config(tiny_params, method)
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
