"""The pieces every run shares compute the bits of their committed fingerprints: the engine, each model, each
dataset source's generated and scaled tensors, each partition scheme's draw.

A failing method fingerprint (test_methods.py) names the ones of these that moved too, so that a change in a
shared piece points at that piece, not at thirty methods. A source's decoding of its files is held to the
exact tensors computed independently of fedskew (tests/unit/test_datasets.py, test_download.py,
tests/fixtures/fake_datasets.py); what is fingerprinted here is what every source adds at load, its scaling.
"""

from __future__ import annotations

import pytest

from fedskew import engine, models
from fedskew.data.datasets import built_in_sources
from fedskew.data.partitions.registry import BUILT_IN as SCHEME_CLASSES
from fedskew.models import BUILT_IN as MODELS
from tests.fingerprints import record
from tests.fingerprints.digests import (
    SCHEME_PARAMS,
    engine_digest,
    model_digest,
    scheme_digest,
    source_digest,
)

pytestmark = [pytest.mark.fingerprint, record.requires_portable_kernels]
# fedskew's own pieces (a plugin's fingerprints are its package's business)


# --- the engine ------------------------------------------------------------------------------

def test_the_engine_computes_its_fingerprint(project, monkeypatch) -> None:
    monkeypatch.chdir(project)
    record.check("engine", engine.VERSION, engine_digest(), "VERSION in src/fedskew/engine/__init__.py")


# --- models ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_computes_its_fingerprint(name) -> None:
    record.check(f"model/{name}", models.VERSIONS[name], model_digest(name),
                 f"VERSIONS[{name!r}] in src/fedskew/models/__init__.py")


# --- dataset sources -------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(built_in_sources()))
def test_a_dataset_source_computes_its_fingerprint(name) -> None:
    cls = built_in_sources()[name]
    record.check(f"source/{name}", cls.version, source_digest(name),
                 f"`version` of {cls.__name__} in src/{cls.__module__.replace('.', '/')}.py")


# --- partition schemes -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SCHEME_CLASSES))
def test_a_partition_scheme_computes_its_fingerprint(name) -> None:
    assert name in SCHEME_PARAMS, f"scheme {name!r} has no parameters to draw with: add them to SCHEME_PARAMS here"
    cls = SCHEME_CLASSES[name]
    record.check(f"scheme/{name}", cls.version, scheme_digest(name),
                 f"`version` of {cls.__name__} in src/{cls.__module__.replace('.', '/')}.py")


