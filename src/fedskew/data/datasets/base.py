"""What every dataset source provides: its tensors, written once to a file, and how loading scales them.

A source is a subclass of `DatasetSource` that sets `name` (the `source` a dataset of params.yaml names)
in a module of fedskew.data.datasets; it is found there by fedskew.discovery, as methods and partition
schemes are. The class is the one source of its facts: input shape, classes, whether it has natural
clients, how it arrives, its spec options with their defaults and allowed values, and the sizes of its
fixed splits. Validation reads them without importing torch from src/fedskew/catalog.json, which
`python -m fedskew catalog --write` derives from the classes (with each downloaded source's files and host,
from its module's `source_files`); a test fails while it is stale.

The mechanics every source shares stay in fedskew.data: fetching and verifying files
(fedskew.data.fetch), the tensor cache (fedskew.data.tensors), atomic files (fedskew.data.files),
the manifest and normalisation (fedskew.data.registry).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch

from fedskew.data.files import save_tensors
from fedskew.declarations import Hyperparameter, declared_hyperparameters
from fedskew.data.sources import Reach
from fedskew.data.tensors import CACHE

# The tensors a source provides; `natural_groups` (int64, one client id a training sample) is added by
# sources with a natural partition.
TENSOR_KEYS = ("x_train", "y_train", "x_test", "y_test")


class DatasetSource:
    """One dataset source. Subclasses set `name` and implement `materialise` (or `generate`, below)."""

    name: ClassVar[str]
    # What the source gives: inputs ([C, H, W] images or [D] vectors) and classes (a spec's options may change
    # them: Synthetic's `dim` and `classes`), whether its training samples come with their clients.
    input_shape: ClassVar[tuple[int, ...]]
    num_classes: ClassVar[int]
    natural_partition: ClassVar[bool] = False
    # How its bytes arrive: "embedded" (generated here, no network), "download" (fetched and checked against
    # pinned md5s, or placed by hand when offline) or "by hand" (no download exists: files placed by hand).
    arrives: ClassVar[str] = "download"
    # The options a dataset of params.yaml may give it, with their defaults and allowed values.
    options: ClassVar[dict[str, Hyperparameter]] = {}
    # Sizes fixed by the published splits, as fedskew decodes them, for validation's feasibility checks and
    # `fedskew datasets`: per-class training counts (index = label) where known, else the training size, and
    # the test size. None where a spec or a local copy decides them.
    train_class_counts: ClassVar[tuple[int, ...] | None] = None
    train_size: ClassVar[int | None] = None
    test_size: ClassVar[int | None] = None
    # (train, test) sizes `fedskew cost` assumes where they are not fixed (a writer draw, a local copy).
    estimated_sizes: ClassVar[tuple[int, int] | None] = None
    # The numerics version of what the source gives (its decoding, its scaling at load): raised when a change
    # moves those bits (tests/fingerprints/), which gives the runs on it new ids. The `version` a class sets in
    # its own body, 1 if it sets none (read without importing: fedskew.discovery.declared_versions).
    version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.version = vars(cls).get("version", 1)
        cls.options = declared_hyperparameters(cls, "options")
        if cls.train_class_counts is not None:
            cls.train_size = sum(cls.train_class_counts)

    @classmethod
    def source_files(cls) -> list:
        """The raw files the source fetches (fedskew.data.fetch.SourceFile: name, URLs, digests); none for a
        source generated here or placed by hand. A downloaded source's module defines `source_files()`."""
        return []

    @classmethod
    def defaults(cls) -> dict:
        """The options with their defaults, in the class's order (what a dataset's spec fills in)."""
        return {key: option.default for key, option in cls.options.items()}
    # Float feature vectors, taken as they are at load (Adult's numeric columns are standardised by its
    # decoder, its one-hots stay 0/1). Images are scaled to [0, 1] by `pixel_max`, then standardised per
    # channel with training statistics.
    tabular: ClassVar[bool] = False
    pixel_max: ClassVar[float] = 255.0

    def materialise(self, spec: dict, root: Path, dataset_dir: Path,
                    reach: Reach) -> tuple[Path, dict[str, torch.Tensor]]:
        """Make the tensors of `spec` (its defaults filled in) exist in one file and return (that file, the
        tensors): uint8 images [N, C, H, W] or float32 vectors [N, D], int64 labels.

        `root` is the project root (raw files live in root/data/raw/<source>/); `dataset_dir` is
        data/raw/<dataset>/, where the dataset's manifest goes, for tensors that belong to one dataset
        of params.yaml rather than to the source. `reach` LOCAL: never touch the network. Errors are
        fedskew.data.fetch's DatasetUnavailableError (what is missing and how to provide it) and
        DatasetCorruptError (what does not verify)."""
        raise NotImplementedError


class GeneratedSource(DatasetSource):
    """A source made here from its spec, with no files to fetch: `generate` returns the tensors, which are
    written to data/raw/<dataset>/tensors.pt (each dataset of params.yaml has its own spec)."""

    arrives: ClassVar[str] = "embedded"

    def generate(self, spec: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def materialise(self, spec: dict, root: Path, dataset_dir: Path,
                    reach: Reach) -> tuple[Path, dict[str, torch.Tensor]]:
        tensors = self.generate(spec)
        path = dataset_dir / CACHE
        save_tensors(path, tensors)
        return path, tensors


class FileSource(DatasetSource):
    """A source decoded from its files under data/raw/<source>/ by its module's
    `load_tensors(spec, raw_root, reach) -> (tensor file, tensors)`, which the subclass names."""

    load_tensors: ClassVar[Callable[[dict, Path, Reach], tuple[Path, dict[str, torch.Tensor]]]]

    @classmethod
    def source_files(cls) -> list:
        if cls.arrives != "download":
            return []
        return sys.modules[cls.__module__].source_files()  # the source's module lists what it fetches

    def materialise(self, spec: dict, root: Path, dataset_dir: Path,
                    reach: Reach) -> tuple[Path, dict[str, torch.Tensor]]:
        return self.load_tensors(spec, root / "data" / "raw", reach)

