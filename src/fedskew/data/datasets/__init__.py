"""The dataset sources, one module each: what the dataset is, where its bytes come from, how they are verified.

Every module here but `base` holds one source (the torchvision family, five sources decoded the same
way, shares `torchvision_family`); each `DatasetSource` subclass that sets its own `name` is found by
fedskew.discovery, as methods and partition schemes are. Adding a dataset is therefore one new module
here plus its catalog entry in fedskew.catalog (docs/datasets.md, "Adding a dataset").
"""

from __future__ import annotations

from functools import cache

from fedskew.data.datasets.base import DatasetSource
from fedskew.discovery import discover

_SHARED = {"base"}


@cache
def dataset_sources() -> dict[str, type[DatasetSource]]:
    """Every source by name, found in this package's modules (imported on first call, then kept)."""
    return dict(sorted(discover(__name__, __path__, DatasetSource, _SHARED).items()))


def dataset_source(name: str) -> DatasetSource:
    """The source `name`, ready to materialise; a ValueError naming the known ones if there is none."""
    sources = dataset_sources()
    if name not in sources:
        raise ValueError(f"unknown dataset source {name!r}; known: {', '.join(sources)}. A new source is a module "
                         f"of fedskew.data.datasets plus its entry in fedskew.catalog (docs/datasets.md)")
    return sources[name]()
