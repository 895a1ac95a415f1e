"""Every method, on every execution path it has, computes the bits of its committed fingerprint.

The tiny fixed problem: the offline digits, a Dirichlet(0.5) split over 4 clients, the MLP, two rounds with
two clients each (fedskew.engine.simulation.run_training, the engine every job runs). A method that moves its
bits without raising its `version` fails here, naming itself, and the pieces it shares with every method (the
engine, the model, the source, the scheme: tests/fingerprints/test_pieces.py) are named too when they moved.
"""

from __future__ import annotations

import functools

import pytest
import torch

from fedskew import paths
from fedskew.algorithms import ALGORITHMS
from fedskew.data.registry import dataset_info
from fedskew.engine.checkpoint import CHECKPOINT_NAME, read_checkpoint
from fedskew.engine.simulation import run_training
from fedskew.engine.vectorised import vectorisation_blocker
from fedskew.fl.base import TrainingSettings
from fedskew.models import build_model
from fedskew.models.split import split_model
from fedskew.sfl.base import stacked_blocker
from tests.conftest import method_config
from tests.fingerprints import record
from tests.fingerprints.conftest import PARAMS

pytestmark = [pytest.mark.fingerprint, record.requires_portable_kernels]

TRAINING = {"rounds": 2, "checkpoint_every": 2, "eval_every": 1, "participation": 0.5, "batch_size": 16}


def _paths(method: str) -> list[str]:
    """The execution paths `method` has on the tiny problem: sequential, and vectorised where it can be."""
    cls = ALGORITHMS[method]
    algorithm = cls(TrainingSettings(1, 16, 0.05, 0.0, 0.0), 4, 10)
    model = build_model("mlp", dataset_info({"source": "digits"}))
    if cls.family == "split":
        vectorisable = algorithm.vectorised_clients and stacked_blocker(split_model(model, model.default_split).client) is None
    else:
        vectorisable = vectorisation_blocker(algorithm, algorithm.adapt_model(model), augmented=False) is None
    return ["sequential", "vectorised"] if vectorisable else ["sequential"]


CASES = [(method, path) for method in sorted(ALGORITHMS) for path in _paths(method)]


def run_digest(method: str, path: str, label: str = "") -> str:
    """The sha256 of a method's history and final weights on the tiny problem (the working folder is the project,
    tests/fingerprints/conftest.py); `label` names the run's folder."""
    cfg = method_config(PARAMS, method, training={**TRAINING, "execution": path}, label=label or f"{method}-{path}")
    result = run_training(cfg)
    assert result.execution == path, f"{method} trained {result.execution}, not {path}"
    state = read_checkpoint(cfg.path(paths.CHECKPOINT_DIR) / CHECKPOINT_NAME)["global_state"]
    return record.Digest().add("history", result.history).add_state("weights", state).hex()


@functools.cache
def _moved_pieces() -> tuple[str, ...]:
    """The pieces every method shares whose own fingerprints moved too."""
    from tests.fingerprints import test_pieces

    return tuple(piece for piece, (version, digest) in test_pieces.shared_fingerprints().items()
                 if record.recorded().get(piece, {}).get(str(version)) not in (None, digest))


@pytest.mark.parametrize("method, path", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_a_method_computes_its_fingerprint(project, monkeypatch, method, path) -> None:
    monkeypatch.chdir(project)
    torch.manual_seed(0)  # nothing in a run may depend on it: the engine seeds what it draws
    cls = ALGORITHMS[method]
    record.check(f"method/{method}/{path}", cls.version, run_digest(method, path),
                 f"`version` of {cls.__name__} in src/{cls.__module__.replace('.', '/')}.py",
                 shared=lambda: list(_moved_pieces()))
