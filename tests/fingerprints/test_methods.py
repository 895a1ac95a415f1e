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

from fedskew.algorithms import BUILT_IN as ALGORITHMS  # fedskew's own methods (a plugin fingerprints its own)
from fedskew.families import Family
from fedskew.data.registry import dataset_info
from fedskew.engine.vectorised import vectorisation_blocker
from fedskew.fl.base import TrainingSettings
from fedskew.models import build_model
from fedskew.models.split import split_model
from fedskew.sfl.parts import stacked_blocker
from tests.fingerprints import record
from tests.fingerprints.digests import run_digest, shared_fingerprints

pytestmark = [pytest.mark.fingerprint, record.requires_portable_kernels]


def _paths(method: str) -> list[str]:
    """The execution paths `method` has on the tiny problem: sequential, and vectorised where it can be."""
    cls = ALGORITHMS[method]
    algorithm = cls(TrainingSettings(1, 16, 0.05, 0.0, 0.0), 4, 10)
    model = build_model("mlp", dataset_info({"source": "digits"}))
    if cls.family is Family.SPLIT:
        vectorisable = algorithm.vectorised_clients and stacked_blocker(split_model(model, model.default_split).client) is None
    else:
        vectorisable = vectorisation_blocker(algorithm, algorithm.adapt_model(model), augmented=False) is None
    return ["sequential", "vectorised"] if vectorisable else ["sequential"]


CASES = [(method, path) for method in sorted(ALGORITHMS) for path in _paths(method)]


@functools.cache
def _moved_pieces() -> tuple[str, ...]:
    """The pieces every method shares whose own fingerprints moved too."""
    return tuple(piece for piece, (version, digest) in shared_fingerprints().items()
                 if record.recorded().get(piece, {}).get(str(version)) not in (None, digest))


@pytest.mark.parametrize("method, path", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_a_method_computes_its_fingerprint(project, monkeypatch, method, path) -> None:
    monkeypatch.chdir(project)
    torch.manual_seed(0)  # nothing in a run may depend on it: the engine seeds what it draws
    cls = ALGORITHMS[method]
    record.check(f"method/{method}/{path}", cls.version, run_digest(method, path),
                 f"`version` of {cls.__name__} in src/{cls.__module__.replace('.', '/')}.py",
                 shared=lambda: list(_moved_pieces()))
