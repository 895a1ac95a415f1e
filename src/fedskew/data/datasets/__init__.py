"""The dataset sources, one module each: what the dataset is, where its bytes come from, how they are verified.

Every module here but `base` holds one source (the torchvision family, five sources decoded the same
way, shares `torchvision_family`); each `DatasetSource` subclass that sets its own `name` is found by
fedskew.discovery, as methods and partition schemes are. Adding a dataset is therefore one new module
here (then `python -m fedskew catalog --write`, which derives what validation reads from its class;
docs/datasets.md, "Adding a dataset"), or a source of your own package declared as an entry point of group
`fedskew.datasets` (fedskew.plugins).
"""

from __future__ import annotations

from functools import cache

from fedskew import catalog
from fedskew.data.datasets.base import DatasetSource
from fedskew.discovery import discover
from fedskew.plugins import loaded

_SHARED = {"base"}


@cache
def built_in_sources() -> dict[str, type[DatasetSource]]:
    """The sources of this package's modules, by name (imported on first call, then kept)."""
    return dict(sorted(discover(__name__, __path__, DatasetSource, _SHARED).items()))


@cache
def dataset_sources() -> dict[str, type[DatasetSource]]:
    """Every source by name: the built-in ones, then the plugins' (each a subclass of DatasetSource;
    fedskew.catalog.sources checks the rest)."""
    found = dict(built_in_sources())
    for name in catalog.sources():
        plugin = loaded("dataset").get(name)
        if plugin is not None and name not in found:
            if not issubclass(plugin.obj, DatasetSource):
                raise plugin.error("a dataset source must subclass fedskew.data.datasets.base.DatasetSource")
            found[name] = plugin.obj
    return found


def dataset_source(name: str) -> DatasetSource:
    """The source `name`, ready to materialise; a ValueError naming the known ones if there is none."""
    sources = dataset_sources()
    if name not in sources:
        raise ValueError(f"unknown dataset source {name!r}; known: {', '.join(sources)}. A new source is a module "
                         "of fedskew.data.datasets, or a plugin's entry point of group fedskew.datasets "
                         "(docs/datasets.md)")
    return sources[name]()
