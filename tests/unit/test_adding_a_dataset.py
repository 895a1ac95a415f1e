"""docs/datasets.md's "Adding a dataset", done as it says: one module, the catalog derived from it, then a run
trains on it.

The module is the doc's own code block, written into a folder that joins fedskew.data.datasets' search path (the
package's own folder is left as it is); the catalog is what `python -m fedskew catalog --write` would derive with
it (fedskew.derived), served in place of the committed file, which is left as it is.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from fedskew import catalog, cli, config, config_schema, derived
from fedskew.data import datasets
from tests.helpers import REPO

DOC = (REPO / "docs" / "datasets.md").read_text()
SECTION = DOC[DOC.index("## Adding a dataset"):]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.DOTALL)

PARAMS = {
    "run": {"suites": ["toy"]},
    "datasets": {"blobs": {"source": "blobs", "samples": 2000}},
    "partitions": {"dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 4, "min_size": 5}},
    "methods": {"fedavg": {"algorithm": "fedavg"}},
    "suites": {"toy": {"settings": [{"dataset": "blobs", "partitions": ["dir0.5"]}], "methods": ["fedavg"],
                       "seeds": [0]}},
    "training": {"toy": {"model": "mlp", "rounds": 3, "participation": 1.0, "local_epochs": 1, "batch_size": 32,
                         "lr": 0.05, "eval_every": 1, "checkpoint_every": 3, "threads": 1}},
}


CACHES = (datasets.built_in_sources, datasets.dataset_sources, catalog.sources, config_schema.params_schema,
          config_schema._schema_validator)


@pytest.fixture
def blobs_added(tmp_path, monkeypatch):
    """The doc's module in a folder on fedskew.data.datasets' path and the catalog derived with it; undone
    afterwards."""
    folder = tmp_path / "added"
    folder.mkdir()
    (folder / "blobs.py").write_text(BLOCKS[0])
    monkeypatch.setattr(datasets, "__path__", [*datasets.__path__, str(folder)])
    for cached in CACHES:
        cached.cache_clear()
    written = json.loads(derived.catalog_text())  # what `catalog --write` would write now
    monkeypatch.setattr(catalog, "_written", lambda: written)
    try:
        yield tmp_path
    finally:
        monkeypatch.undo()
        for cached in CACHES:
            cached.cache_clear()


def test_the_doc_shows_one_module_that_declares_its_facts():
    assert len(BLOCKS) == 1
    assert 'name = "blobs"' in BLOCKS[0] and BLOCKS[0].startswith('"""')
    assert "input_shape = (16,)" in BLOCKS[0] and "num_classes = 4" in BLOCKS[0] and "options = {" in BLOCKS[0]
    assert "python -m fedskew catalog --write" in SECTION


def test_the_committed_catalog_does_not_know_the_doc_s_source():
    assert "blobs" not in catalog.sources()  # the fixture derives it; the repository's file is untouched


def test_a_dataset_added_as_one_file_and_its_catalog_entry_trains_a_run(blobs_added, monkeypatch, capsys):
    project = blobs_added
    assert "blobs" in datasets.dataset_sources()
    (project / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    monkeypatch.chdir(project)
    monkeypatch.setenv("FEDSKEW_TRACKING", "0")

    assert cli.main(["datasets"]) in (0, None)
    assert re.search(r"blobs\s.*embedded", capsys.readouterr().out)
    for command in (["download", "blobs"],
                    ["partition", "--dataset", "blobs", "--partition", "dir0.5", "--seed", "0"],
                    ["train", "--suite", "toy", "--dataset", "blobs", "--partition", "dir0.5", "--method", "fedavg",
                     "--seed", "0"]):
        assert cli.main(command) in (0, None), command

    ready = json.loads((project / "data" / "raw" / "blobs" / "READY.json").read_text())
    assert ready["spec"] == {"source": "blobs", "samples": 2000, "seed": 0}  # the class's default filled in
    assert ready["shapes"]["x_train"] == [2000, 16] and ready["shapes"]["x_test"] == [400, 16]
    metrics = json.loads(next(project.glob("results/runs/toy/blobs/dir0.5/fedavg/seed0/metrics.json")).read_text())
    assert metrics["status"] == "finished" and metrics["final_round"] == 3
    assert metrics["final_acc"] > 0.5  # four well-separated blobs: far above chance (0.25)


def test_an_option_the_class_does_not_declare_is_refused(blobs_added):
    bad = {**PARAMS, "datasets": {"blobs": {"source": "blobs", "sample": 2000}}}
    with pytest.raises(config.ConfigError, match=r"datasets\.blobs: unknown key\(s\) sample; allowed: samples, seed"):
        config.load_params(bad)


def test_a_source_without_a_module_or_entry_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown dataset source 'blobs'; known: adult, .*docs/datasets.md"):
        datasets.dataset_source("blobs")
    with pytest.raises(config.ConfigError, match=r"datasets\.blobs\.source: 'blobs' is not allowed; allowed: adult, "):
        config.load_params({**PARAMS})
