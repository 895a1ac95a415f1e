"""The datasets of params.yaml: each prepared once through its source (fedskew.data.datasets), then loaded.

`prepare` is the download stage: it writes data/raw/<dataset>/ (tensors plus a READY.json
manifest with their checksum). `load` is what training calls: it reads those tensors,
verifies the checksum and normalises once, so the training loop works on in-memory
float tensors and a client is only a set of indices into them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# The torch-free facts about each source (defaults, shapes, classes), which validation reads without importing
# torch, are fedskew.catalog's; dataset_info is re-exported here for the code that loads data.
from fedskew import paths
from fedskew.catalog import DatasetInfo, dataset_info  # noqa: F401
from fedskew.data.datasets import dataset_source, dataset_sources
from fedskew.data.fetch import DatasetCorruptError, DatasetUnavailableError, Reach
from fedskew.data.files import file_sha256, read_json, remove_stale_temporaries, write_json_atomic

log = logging.getLogger(__name__)


@dataclass
class Dataset:
    """A dataset in memory: normalised float inputs, int64 labels, optional natural client ids."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    natural_groups: np.ndarray | None = None
    # Per-channel statistics (pixel units in [0, 1]) the images were standardised with;
    # augmentation un-normalises with them. None for tabular data.
    pixel_mean: torch.Tensor | None = None
    pixel_std: torch.Tensor | None = None


def prepare(dataset: str, spec: dict, root: Path = Path("."), reach: Reach = Reach.NETWORK) -> Path:
    """Materialise `dataset` and write its data/raw/<dataset>/READY.json manifest.

    The dataset's source (a module of fedskew.data.datasets) writes its tensors once: a fetched
    source into data/raw/<source>/ (FEMNIST's writer subsets in a subfolder of it), a generated
    one into data/raw/<dataset>/tensors.pt. The manifest (written last, atomically) records which
    tensor file belongs to the dataset and its sha256, so `load` never trusts a half-written or
    altered file. This is also the repair: a cached tensors.pt that no longer matches its
    tensors.json sidecar is rebuilt from the verified raw files, a generated one is generated again.

    `reach` says where missing raw files may come from (fedskew.data.sources.Reach): LOCAL is
    `python -m fedskew download --no-download`.
    """
    reach = Reach.checked(reach)  # before any file is touched, whichever source reads it (most ignore it)
    ready = root / paths.RAW_READY.format(dataset=dataset)
    ready.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(ready.parent, ".*.tmp-*")  # a killed run's half-written manifest or tensors
    tensor_path, tensors = dataset_source(spec["source"]).materialise(spec, root, ready.parent, reach)
    manifest = {
        "dataset": dataset,
        "spec": spec,
        "tensors": tensor_path.relative_to(root).as_posix(),
        "sha256": file_sha256(tensor_path),
        "shapes": {key: list(value.shape) for key, value in tensors.items()},
    }
    write_json_atomic(ready, manifest)
    log.info("prepared %s: %s", dataset, manifest["shapes"])
    return ready


def load(dataset: str, spec: dict, root: Path = Path(".")) -> Dataset:
    """Load a prepared dataset, verify it against its manifest and normalise it once.

    Whatever is wrong on disk is a one-line DatasetCorruptError (or DatasetUnavailableError
    for a manifest of another spec) naming the file and the download command that repairs it.
    """
    ready = root / paths.RAW_READY.format(dataset=dataset)
    repair = f"run `python -m fedskew download --dataset {dataset}` to repair it"
    if not ready.exists():
        raise FileNotFoundError(
            f"dataset {dataset!r} is not prepared ({ready} is missing): run "
            f"`python -m fedskew download --dataset {dataset}` or the Snakemake workflow first"
        )
    manifest = read_json(ready)
    if manifest is None or not isinstance(manifest.get("tensors"), str):
        raise DatasetCorruptError(f"{ready} is unreadable or not a fedskew manifest; {repair}")
    if manifest.get("spec") != spec:
        raise DatasetUnavailableError(f"{ready} was prepared for another spec of dataset {dataset!r} than "
                                      f"params.yaml gives now; run `python -m fedskew download --dataset "
                                      f"{dataset}` to prepare it again")
    tensor_path = root / manifest["tensors"]
    if not tensor_path.is_file():
        raise DatasetCorruptError(f"{tensor_path} (listed in {ready}) is missing; {repair}")
    if file_sha256(tensor_path) != manifest.get("sha256"):
        raise DatasetCorruptError(f"{tensor_path} does not match the sha256 in {ready} (corrupt or altered); "
                                  f"{repair}")
    try:
        raw = torch.load(tensor_path, weights_only=True)
        x_train, y_train, x_test, y_test = (raw[key] for key in ("x_train", "y_train", "x_test", "y_test"))
    except Exception as error:  # noqa: BLE001 - torch.load raises many types for a bad file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DatasetCorruptError(f"{tensor_path} cannot be read as fedskew tensors ({reason}); {repair}") from error
    x_train, x_test, mean, std = _normalise(x_train, x_test, spec["source"])
    groups = raw.get("natural_groups")
    return Dataset(
        x_train=x_train,
        y_train=y_train.long(),
        x_test=x_test,
        y_test=y_test.long(),
        num_classes=dataset_info(spec).num_classes,
        natural_groups=None if groups is None else groups.numpy(),
        pixel_mean=mean,
        pixel_std=std,
    )


def _normalise(x_train: torch.Tensor, x_test: torch.Tensor, source: str):
    """Images: scale to [0, 1] by the source's `pixel_max`, then standardise per channel with training
    statistics.

    Returns (x_train, x_test, mean, std), the statistics per channel in [0, 1] pixel units.
    Tabular sources (synthetic, adult) are returned as float32 unchanged (statistics None):
    Adult's numeric columns are already standardised with training statistics and its
    one-hots stay 0/1.
    """
    kind = dataset_sources()[source]
    if kind.tabular:
        return x_train.float(), x_test.float(), None, None
    # In place after the one uint8 -> float copy: a CIFAR-sized set then needs one float
    # copy of the data at its peak, not three (benchmarks/memory.py).
    x_train = x_train.float().div_(kind.pixel_max)
    x_test = x_test.float().div_(kind.pixel_max)
    dims = [0, 2, 3]
    mean = x_train.mean(dim=dims, keepdim=True)
    std = x_train.std(dim=dims, keepdim=True).clamp_min(1e-6)
    return x_train.sub_(mean).div_(std), x_test.sub_(mean).div_(std), mean.flatten(), std.flatten()
