"""fedskew.catalog, the torch-free facts validation reads, agrees with the registries that build things.

When a test fails, its message is the entry to write in src/fedskew/catalog.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fedskew import catalog
from fedskew.algorithms import ALGORITHMS
from fedskew.data import registry
from fedskew.models import MODELS, NEEDS, build_model, example_info, incompatibility

# One spec per source (defaults filled in), plus a synthetic one of another size.
SPECS = [{"source": name, **source.defaults} for name, source in catalog.sources().items()] + [
    {"source": "synthetic", **catalog.dataset_defaults("synthetic"), "dim": 7, "classes": 3}]
# Inputs the models are checked on: every source's, and images too small, odd or one-channel.
INFOS = sorted({registry.dataset_info(spec) for spec in SPECS} | {
    registry.DatasetInfo(shape, 10, True, False) for shape in [(1, 4, 4), (3, 8, 8), (3, 16, 16), (3, 28, 28),
                                                               (1, 32, 32), (3, 7, 9), (1, 1, 1)]}, key=repr)


def test_every_source_has_defaults_and_facts():
    # registry re-exports the catalog's dataset_info: one definition
    assert registry.dataset_info is catalog.dataset_info
    assert all(source.defaults.keys() == source.schemas.keys() for source in catalog.sources().values())


def test_adult_feature_count_is_the_decoder_s():
    from fedskew.data.datasets.adult import NUM_FEATURES

    assert catalog.sources()["adult"].input_shape == (NUM_FEATURES,)


def test_every_source_module_has_its_catalog_entry_and_arrives_as_it_says():
    from fedskew.data.datasets import dataset_sources
    from fedskew.data.datasets.base import GeneratedSource

    found = dataset_sources()
    assert list(found) == list(catalog.sources())
    for name, source in catalog.sources().items():
        assert source.arrives in ("embedded", "download", "by hand"), name
        assert (source.arrives == "embedded") == issubclass(found[name], GeneratedSource), name
        # tabular sources are the vectors: load takes them as they are, and scales images
        assert found[name].tabular == (len(source.input_shape) == 1), name


def test_the_catalog_s_models_are_the_declared_ones():
    """What validation reads of the models without torch (catalog.json, derived from fedskew.models.BUILT_IN) names
    them in their order, and their needs survive the JSON record."""
    from fedskew.models import BUILT_IN

    assert list(catalog.models()) == list(MODELS) == list(BUILT_IN)
    assert catalog.MODEL_NEEDS == NEEDS


@pytest.mark.parametrize("name", [*MODELS, "resnet1000"])
def test_incompatibility_messages_are_the_models(name):
    for info in INFOS:
        assert catalog.incompatibility(name, catalog.DatasetInfo(*dataclasses.astuple(info))) == \
            incompatibility(name, info), info


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_s_record_holds_on_every_input_it_takes(name):
    """describe_model builds a model on a few inputs; what it records (split points, the stages they cut after, the
    feature width) must hold on every input the model takes: each source's, and images small, odd or one-channel."""
    infos = [example_info(name), *(info for info in INFOS if incompatibility(name, info) is None)]
    for info in infos:
        with torch.device("meta"):  # the structure only: no weights
            net = build_model(name, info)
        aliased = {point: stage for point, stage in net.split_points.items() if point != stage}
        assert (catalog.SPLIT_POINTS[name], catalog.SPLIT_STAGES.get(name, {})) == (tuple(net.split_points), aliased), \
            info
        assert catalog.feature_dim(name, info) == net.head.in_features, info


def test_the_derived_files_are_what_the_classes_declare():
    from fedskew import derived

    assert derived.stale() == [], "run `python -m fedskew catalog --write` and commit what it writes"


def test_the_catalog_s_defaults_are_the_classes_in_their_order():
    # JSON, not ==: 1 == True == 1.0 in Python, but not in a run's config and id.
    real = {name: dict(algorithm.defaults) for name, algorithm in ALGORITHMS.items()}
    assert json.dumps({name: catalog.defaults(name) for name in catalog.methods()}) == json.dumps(real)
    assert {name: catalog.family(name) for name in ALGORITHMS} == {n: c.family for n, c in ALGORITHMS.items()}


def _source_files(source: str):
    import sys

    from fedskew.data.datasets import dataset_sources, torchvision_family

    if source in torchvision_family.TORCHVISION_DATASETS:
        return torchvision_family.source_files(source)
    return sys.modules[dataset_sources()[source].__module__].source_files()  # a downloaded source's module


def test_raw_files_and_download_hosts_are_the_fetching_modules():
    from urllib.parse import urlsplit

    fetched = [name for name, source in catalog.sources().items() if source.arrives == "download"]
    assert fetched and all(catalog.sources()[name].raw_files for name in fetched)
    for source in fetched:
        files = _source_files(source)
        names, host = tuple(f.filename for f in files), urlsplit(files[0].urls[0]).hostname
        assert catalog.sources()[source].raw_files == names and catalog.sources()[source].host == host, source


def test_a_summary_is_the_whole_first_paragraph():
    doc = """First line of a sentence
    that goes on.

    Details."""
    assert catalog.model_summary(doc) == "First line of a sentence that goes on."



def test_the_versions_run_ids_read_from_the_source_are_the_pieces():
    """Run ids read the numerics versions from the pieces' files without importing them (fedskew.discovery): that
    reading must be what each registered piece says once imported, its own `version` or 1."""
    from fedskew import discovery, engine, models
    from fedskew.data.datasets import dataset_sources
    from fedskew.data.partitions.registry import SCHEME_CLASSES

    pieces = {"method": ALGORITHMS, "source": dataset_sources(), "scheme": SCHEME_CLASSES}
    for kind, classes in pieces.items():
        imported = {name: cls.version for name, cls in classes.items()}
        assert discovery.declared_versions(kind) == imported, kind
        assert all(type(v) is int and v >= 1 for v in imported.values()), (kind, imported)
        # a version is a class's own: one its parent sets does not reach it
        assert all(cls.version == vars(cls).get("version", 1) for cls in classes.values()), kind
    assert discovery.module_constant("fedskew.models", "VERSIONS") == models.VERSIONS
    assert set(models.VERSIONS) == set(models.BUILT_IN)
    assert discovery.module_constant("fedskew.engine", "VERSION") == engine.VERSION


def test_a_version_is_not_inherited():
    from fedskew.fl.fedprox import FedProx

    class Raised(FedProx):
        name = "raised"
        version = 3

    class Child(Raised):
        name = "child"

    assert (Raised.version, Child.version, FedProx.version) == (3, 1, 1)


def test_a_raised_version_changes_exactly_its_runs_ids(monkeypatch):
    """Versions at 1 leave every id as it was; a method raised to 2 moves the ids of that method's runs only, and
    its config.yaml (to_dict) records the version."""
    from fedskew import discovery
    from fedskew.config import load_params
    from tests.helpers import REPO

    runs = load_params(REPO / "params.yaml").runs(["default", "methods"])
    before = [cfg.run_id for cfg in runs]
    assert all("numerics_versions" not in cfg.to_dict() for cfg in runs)  # nothing recorded for pieces at 1
    declared = {**discovery.declared_versions("method"), "fedprox": 2}
    monkeypatch.setattr(discovery, "declared_versions", lambda kind: declared if kind == "method" else {})
    raised = load_params(REPO / "params.yaml").runs(["default", "methods"])
    moved = {cfg.method_spec["algorithm"] for cfg, old in zip(raised, before, strict=True) if cfg.run_id != old}
    unmoved = {cfg.method_spec["algorithm"] for cfg, old in zip(raised, before, strict=True) if cfg.run_id == old}
    assert moved == {"fedprox"} and "fedprox" not in unmoved
    assert {str(cfg.to_dict().get("numerics_versions")) for cfg in raised
            if cfg.method_spec["algorithm"] == "fedprox"} == {"{'method': 2}"}
