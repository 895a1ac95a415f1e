"""Tiny ImageNet (Le & Yang 2015, CS231n), as FedED uses it: 200 classes of 64x64 colour images.

Source: http://cs231n.stanford.edu/tiny-imagenet-200.zip (about 248 MB).

On disk: data/raw/tinyimagenet/tiny-imagenet-200.zip (downloaded, or placed there by
hand), its VERIFIED.json marker and the decoded cache tensors.pt + tensors.json. Inside
the zip (never extracted: read from a private copy made while its bytes are hashed against the
sha256 just verified, fedskew.data.fetch.reading; a member with an absolute name or a `..`, a
link or a device makes it no Tiny ImageNet zip):

    tiny-imagenet-200/wnids.txt                       the 200 WordNet ids, one per line
    tiny-imagenet-200/words.txt                       wnid <tab> words (all of WordNet; unused)
    tiny-imagenet-200/train/<wnid>/images/*.JPEG      500 images per class
    tiny-imagenet-200/train/<wnid>/<wnid>_boxes.txt   bounding boxes (unused)
    tiny-imagenet-200/val/images/val_<i>.JPEG         10,000 images
    tiny-imagenet-200/val/val_annotations.txt         file <tab> wnid <tab> x0 y0 x1 y1
    tiny-imagenet-200/test/images/*.JPEG              unlabelled (unused)

Checksum: md5 90528d7ca1a48142e341f4ef8d21d0de is pinned; it is the digest published
with this zip by many public loaders (avalanche, torchvision-style TinyImageNet classes).

Decoding decisions:
* train = the 100,000 `train` images; test = the 10,000 labelled `val` images (the
  `test` images have no public labels);
* label = index of the wnid in sorted(wnids.txt) (torchvision ImageFolder order);
* images are decoded with PIL and converted to RGB (some Tiny ImageNet JPEGs are
  grayscale; their channel is replicated), stored uint8 [N, 3, 64, 64];
* train images are ordered by (class, file name), test images by file name.
"""

from __future__ import annotations

import zipfile
from pathlib import Path, PurePosixPath

import torch

from fedskew.data.datasets.base import FileSource
from fedskew.data.fetch import DatasetCorruptError, Reach, SourceFile, ensure_files
from fedskew.data.fetch.reading import check_zip_member, copy_verified
from fedskew.data.files import scratch_dir
from fedskew.data.tensors import (
    CACHE,
    cached_tensors,
    decode_rgb,
    split_problems,
    stack_images,
)

NAME = "tinyimagenet"
ARCHIVE = "tiny-imagenet-200.zip"
TINYIMAGENET_URLS = ("http://cs231n.stanford.edu/tiny-imagenet-200.zip",)
TINYIMAGENET_MD5: str | None = "90528d7ca1a48142e341f4ef8d21d0de"
NUM_CLASSES = 200
IMAGE_SHAPE = (3, 64, 64)
PREPROCESSING = "tinyimagenet-v1"


def source_files() -> list[SourceFile]:
    return [SourceFile(ARCHIVE, TINYIMAGENET_URLS, TINYIMAGENET_MD5, check=check_structure)]


def raw_dir(raw_root: Path) -> Path:
    return Path(raw_root) / NAME


def _index(zf: zipfile.ZipFile, archive: Path) -> tuple[list[str], dict[str, list[str]], list[tuple[str, str]], str]:
    """(sorted wnids, wnid -> train member names, [(val member, wnid)], top folder) of the zip `archive`; a
    member with an absolute name or a '..', a link or a device makes it no Tiny ImageNet zip."""
    names = [check_zip_member(archive, info).filename for info in zf.infolist()]
    tops = sorted((n for n in names if PurePosixPath(n).name == "wnids.txt"), key=len)
    if not tops:
        raise DatasetCorruptError(f"{ARCHIVE} has no wnids.txt")
    top = tops[0][: -len("wnids.txt")]  # "tiny-imagenet-200/"
    wnids = sorted(zf.read(tops[0]).decode("utf-8").split())
    if len(wnids) != NUM_CLASSES or len(set(wnids)) != NUM_CLASSES:
        raise DatasetCorruptError(f"{ARCHIVE}:{tops[0]} lists {len(set(wnids))} distinct wnids, expected {NUM_CLASSES}")
    train: dict[str, list[str]] = {w: [] for w in wnids}
    for name in names:
        parts = PurePosixPath(name[len(top):]).parts if name.startswith(top) else ()
        if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and parts[3].upper().endswith(".JPEG"):
            if parts[1] not in train:
                raise DatasetCorruptError(f"{ARCHIVE}: {name} belongs to a wnid missing from wnids.txt")
            train[parts[1]].append(name)
    if empty := [w for w in wnids if not train[w]]:
        raise DatasetCorruptError(f"{ARCHIVE} has no train images for {', '.join(empty[:5])}")
    annotations = f"{top}val/val_annotations.txt"
    if annotations not in names:
        raise DatasetCorruptError(f"{ARCHIVE} has no {annotations}")
    val, known = [], set(names)
    for line in zf.read(annotations).decode("utf-8").splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        member = f"{top}val/images/{fields[0]}"
        if len(fields) < 2 or fields[1] not in train or member not in known:
            raise DatasetCorruptError(f"{ARCHIVE}: bad line in val_annotations.txt: {line!r}")
        val.append((member, fields[1]))
    if not val:
        raise DatasetCorruptError(f"{ARCHIVE}: val_annotations.txt lists no images")
    return wnids, train, val, top


def check_structure(archive: Path) -> None:
    """Check every member's CRC and the train/val layout (used only when no md5 is pinned)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            if (bad := zf.testzip()) is not None:
                raise DatasetCorruptError(f"{ARCHIVE}: member {bad} fails its CRC check")
            _index(zf, archive)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise DatasetCorruptError(f"cannot read {archive.name} as a zip: {error}") from error


def _decode(archive: Path, sha256: str) -> dict[str, torch.Tensor]:
    """Decode the verified zip's train and val images. A zip needs random access, so it is read from a private
    copy in a scratch folder, made while hashing against `sha256` (the digest just verified): the bytes decoded
    are those that verified, whatever happens to the file in data/raw meanwhile; on disk rather than in memory,
    beside the 1.2 GB of decoded images."""
    size = (IMAGE_SHAPE[2], IMAGE_SHAPE[1])
    try:
        with scratch_dir(archive.parent.parent, f".{NAME}.decode-") as scratch, \
                zipfile.ZipFile(copy_verified(archive, scratch / ARCHIVE, sha256)) as zf:
            wnids, train, val, _ = _index(zf, archive)
            rows = [(label, name) for label, w in enumerate(wnids) for name in sorted(train[w])]
            label_of = {w: label for label, w in enumerate(wnids)}
            val_rows = sorted((name, label_of[w]) for name, w in val)
            x_train = [decode_rgb(zf.read(name), f"{ARCHIVE}:{name}", size) for _, name in rows]
            x_test = [decode_rgb(zf.read(name), f"{ARCHIVE}:{name}", size) for name, _ in val_rows]
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as error:
        raise DatasetCorruptError(f"cannot read {archive}: {error}. Delete it to download it again.") from error
    return {
        "x_train": stack_images(x_train, IMAGE_SHAPE),
        "y_train": torch.tensor([label for label, _ in rows], dtype=torch.int64),
        "x_test": stack_images(x_test, IMAGE_SHAPE),
        "y_test": torch.tensor([label for _, label in val_rows], dtype=torch.int64),
    }


def problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    return split_problems(tensors, torch.uint8, IMAGE_SHAPE, NUM_CLASSES)


def load_tensors(spec: dict, raw_root: Path,
                 reach: Reach = Reach.NETWORK) -> tuple[Path, dict[str, torch.Tensor]]:
    """Download/verify tiny-imagenet-200.zip, decode it once; return the cache path and the tensors."""
    folder = raw_dir(raw_root)
    entries = ensure_files(NAME, folder, source_files(), reach)
    sha256 = entries[ARCHIVE]["sha256"]  # of the bytes on disk now: keys the cache, checked again by the decode
    key = {"preprocessing": PREPROCESSING, "archive_sha256": sha256}
    return folder / CACHE, cached_tensors(NAME, folder, key, problems, lambda: _decode(folder / ARCHIVE, sha256))


class TinyImageNet(FileSource):
    name = NAME
    input_shape = IMAGE_SHAPE
    num_classes = NUM_CLASSES
    train_class_counts = (500,) * 200  # the `train` split
    test_size = 10000
    load_tensors = staticmethod(load_tensors)
