"""CINIC-10 (Darlow et al. 2018, "CINIC-10 is not ImageNet or CIFAR-10"), as SCALA uses it.

Source: the official tarball CINIC-10.tar.gz (about 688 MB, CC BY 4.0) from the Edinburgh
DataShare, https://datashare.ed.ac.uk/handle/10283/3192 (DOI 10.7488/ds/2448).

On disk: data/raw/cinic10/CINIC-10.tar.gz (downloaded, or placed there by hand), its
VERIFIED.json marker and the decoded cache tensors.pt + tensors.json. The archive holds
`train/`, `valid/` and `test/` (possibly under one top folder), each with one folder per
class (airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck) of 32x32 PNGs,
9000 per class and split (270,000 images in all).

Checksum: md5 6ee4d0c996905fe93221de577967a372 is pinned. It is not printed on the
DataShare page; it is the digest that several independent public CINIC-10 loaders pin
for this tarball (which some of them also record as 687,544,992 bytes). It could not be
checked against the real file here (no network); if DataShare ever serves a different
tarball, verification fails loudly. Set CINIC10_MD5 = None to accept any copy whose
structure is right (its md5/sha256 are then recorded in VERIFIED.json).

Decoding decisions:
* train = the `train` split (90,000 images), test = the `test` split (90,000), as in
  SCALA's 90000/90000. The `valid` split is not decoded and not used.
* labels are the class index in the alphabetical (= CIFAR-10) order of CLASSES;
* images are read with PIL and converted to RGB (CINIC-10 contains some grayscale PNGs,
  whose single channel is replicated), stored uint8 [N, 3, 32, 32];
* within a split, images are ordered by (class, file name), so the tensors do not depend
  on the order of members in the tarball.

Reading: the tarball is decoded in place, streamed (never extracted, never held in memory whole), its
bytes hashed as they are read against the sha256 just verified; a member with an absolute name or a
`..`, a link, a device or a fifo makes it no CINIC-10 tarball (fedskew.data.fetch.reading).
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import torch

from fedskew.data.datasets.base import FileSource
from fedskew.data.fetch import DatasetCorruptError, Reach, SourceFile, ensure_files
from fedskew.data.fetch.reading import check_tar_member, verified_reader
from fedskew.data.tensors import (
    CACHE,
    cached_tensors,
    decode_rgb,
    split_problems,
    stack_images,
)

NAME = "cinic10"
ARCHIVE = "CINIC-10.tar.gz"
CINIC10_URLS = (
    "https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz",
    "https://datashare.ed.ac.uk/bitstreams/e8e186cc-2688-48f1-aa5a-3fda1a43f8b6/download",  # DSpace 7 address
)
CINIC10_MD5: str | None = "6ee4d0c996905fe93221de577967a372"  # see the module docstring
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLITS = {"train": "train", "test": "test"}  # fedskew split -> folder in the tarball; `valid` is unused
IMAGE_SHAPE = (3, 32, 32)
PREPROCESSING = "cinic10-v1"  # bump when decoding changes, so old caches are rebuilt
HOW_TO_GET = ("CINIC-10 (CC BY 4.0) is listed at https://datashare.ed.ac.uk/handle/10283/3192 "
              "(DOI 10.7488/ds/2448).")


def source_files() -> list[SourceFile]:
    return [SourceFile(ARCHIVE, CINIC10_URLS, CINIC10_MD5, check=check_structure)]


def raw_dir(raw_root: Path) -> Path:
    return Path(raw_root) / NAME


def _member_place(name: str) -> tuple[str, str] | None:
    """(split folder, class) of a tar member `.../<split>/<class>/<file>.png`, else None."""
    parts = PurePosixPath(name).parts
    if len(parts) < 3 or not parts[-1].lower().endswith(".png"):
        return None
    if parts[-3] in ("train", "valid", "test") and parts[-2] in CLASSES:
        return parts[-3], parts[-2]
    return None


def _missing_folders(found: set[tuple[str, str]]) -> list[str]:
    return [f"{split}/{cls}" for split in SPLITS.values() for cls in CLASSES if (split, cls) not in found]


def check_structure(archive: Path) -> None:
    """Read the whole gzip stream (its CRC included) and check the tar has train/ and test/ PNGs of every class,
    and no member a dataset archive does not have (fedskew.data.fetch.reading.check_tar_member)."""
    found = set()
    try:
        with gzip.open(archive, "rb") as stream:  # tarfile stops at the tar end marker, before gzip's CRC
            while stream.read(1 << 20):
                pass
        with tarfile.open(archive, "r:gz") as tar:
            found = {place for member in tar
                     if check_tar_member(archive, member).isfile() and (place := _member_place(member.name))}
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DatasetCorruptError(f"cannot read {archive.name} as a tar.gz: {error}") from error
    if missing := _missing_folders(found):
        raise DatasetCorruptError(f"{archive.name} lacks PNGs in {', '.join(missing[:5])}"
                                  f"{' ...' if len(missing) > 5 else ''}")


def _decode(archive: Path, sha256: str) -> dict[str, torch.Tensor]:
    """Decode train/ and test/ PNGs of the verified tarball into uint8 NCHW tensors + int64 labels.

    The tarball is read in place, as one stream whose bytes are hashed against `sha256` (the digest just
    verified; fedskew.data.fetch.reading): nothing is written, and a tarball that changed since it verified is
    refused before its tensors are cached."""
    items: dict[str, list[tuple[int, str, object]]] = {split: [] for split in SPLITS.values()}
    try:
        with verified_reader(archive, sha256) as reader, tarfile.open(fileobj=reader, mode="r|gz") as tar:
            for member in tar:
                place = _member_place(member.name) if check_tar_member(archive, member).isfile() else None
                if place is None or place[0] not in items:
                    continue
                data = tar.extractfile(member).read()
                image = decode_rgb(data, f"{ARCHIVE}:{member.name}", size=(IMAGE_SHAPE[2], IMAGE_SHAPE[1]))
                items[place[0]].append((CLASSES.index(place[1]), PurePosixPath(member.name).name, image))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DatasetCorruptError(f"cannot read {archive}: {error}. Delete it to download it again.") from error
    if missing := _missing_folders({(s, CLASSES[label]) for s, rows in items.items() for label, _, _ in rows}):
        raise DatasetCorruptError(f"{archive} lacks PNGs in {', '.join(missing[:5])}. Delete it to download it "
                                  f"again.")
    out = {}
    for split, folder in SPLITS.items():
        rows = sorted(items[folder], key=lambda row: (row[0], row[1]))
        out[f"x_{split}"] = stack_images([image for _, _, image in rows], IMAGE_SHAPE)
        out[f"y_{split}"] = torch.tensor([label for label, _, _ in rows], dtype=torch.int64)
    return out


def problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    return split_problems(tensors, torch.uint8, IMAGE_SHAPE, len(CLASSES))


def load_tensors(spec: dict, raw_root: Path,
                 reach: Reach = Reach.NETWORK) -> tuple[Path, dict[str, torch.Tensor]]:
    """Download/verify CINIC-10.tar.gz, decode it once; return the cache path and the tensors."""
    folder = raw_dir(raw_root)
    entries = ensure_files(NAME, folder, source_files(), reach, HOW_TO_GET)
    sha256 = entries[ARCHIVE]["sha256"]  # of the bytes on disk now: keys the cache, checked again by the decode
    key = {"preprocessing": PREPROCESSING, "archive_sha256": sha256}
    return folder / CACHE, cached_tensors(NAME, folder, key, problems, lambda: _decode(folder / ARCHIVE, sha256))


class CINIC10(FileSource):
    name = NAME
    input_shape = IMAGE_SHAPE
    num_classes = len(CLASSES)
    train_class_counts = (9000,) * 10  # the `train` split only
    test_size = 90000
    load_tensors = staticmethod(load_tensors)
