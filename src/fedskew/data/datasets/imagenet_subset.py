"""FedLC's ImageNet-subset: 12 ImageNet classes at 64x64x3, built from a local ImageNet copy.

FedLC (Zhang et al. 2022) says only that, following Li et al. 2021 (Anti-Backdoor
Learning), it generates "the Imagenet-subset with size 64*64*3, which consists of 12
labels"; neither paper lists the classes. fedskew therefore fixes WNIDS below: the first
12 synsets of ILSVRC-2012 in sorted-wnid order, i.e. class ids 0-11 of the standard
1000-class index (tench ... goldfinch). This is fedskew's choice, not FedLC's.

Source: ImageNet's licence forbids redistribution, so nothing is downloaded. Spec option
`imagenet_dir` names a local ILSVRC-2012 copy (a relative path is relative to the
project root) in the standard class-folder layout:

    <imagenet_dir>/train/<wnid>/*.JPEG    (about 1,300 per class)
    <imagenet_dir>/val/<wnid>/*.JPEG      (50 per class; the flat official val folder must
                                           first be sorted into class folders, e.g. with the
                                           widely used valprep.sh or torchvision.datasets.ImageNet)

Only the 12 class folders of WNIDS are read. Files ending in .JPEG/.jpeg/.jpg/.png count.

On disk (data/raw/imagenet_subset/): VERIFIED.json (sha256, size and mtime of every image
used; nothing can be pinned, so the images are hashed at every load, their digests key the
cache and the decode checks the bytes it reads against them) and the decoded cache
tensors.pt + tensors.json.

Preprocessing (deterministic for a given Pillow/libjpeg):
* train = the 12 classes' train/ images, test = their val/ images; label = position of
  the wnid in WNIDS; images ordered by (label, file name);
* each image is converted to RGB (grayscale and CMYK JPEGs exist in ImageNet), its
  shorter side is resized to 64 with PIL's bilinear filter (antialiased when shrinking),
  the longer side to round(64 * long / short), then the central 64x64 is cropped
  (offsets floor((W-64)/2), floor((H-64)/2)); stored uint8 [N, 3, 64, 64].
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from fedskew.data.datasets.base import FileSource
from fedskew.declarations import Hyperparameter
from fedskew.data.fetch import MARKER, DatasetCorruptError, DatasetUnavailableError, Reach
from fedskew.data.fetch.reading import read_verified
from fedskew.data.files import digest_of, remove_stale_temporaries, tree_digests
from fedskew.data.tensors import CACHE, cached_tensors, split_problems, stack_images

NAME = "imagenet_subset"
WNIDS = (  # the first 12 ILSVRC-2012 synsets in sorted order (class ids 0-11 of the 1000-class index)
    "n01440764",  # tench
    "n01443537",  # goldfish
    "n01484850",  # great white shark
    "n01491361",  # tiger shark
    "n01494475",  # hammerhead
    "n01496331",  # electric ray
    "n01498041",  # stingray
    "n01514668",  # cock
    "n01514859",  # hen
    "n01518878",  # ostrich
    "n01530575",  # brambling
    "n01531178",  # goldfinch
)
SIZE = 64
IMAGE_SHAPE = (3, SIZE, SIZE)
SPLITS = {"train": "train", "test": "val"}  # fedskew split -> ImageNet folder
EXTENSIONS = (".jpeg", ".jpg", ".png")
PREPROCESSING = "imagenet_subset-v1: RGB, shorter side 64 bilinear, centre crop 64"


def raw_dir(raw_root: Path) -> Path:
    return Path(raw_root) / NAME


def expected_layout(imagenet_dir: object) -> str:
    root = imagenet_dir if imagenet_dir else "<imagenet_dir>"
    return (f"fedskew builds imagenet_subset from a local ILSVRC-2012 copy (ImageNet's licence forbids automatic "
            f"download). Set `imagenet_dir` in this dataset's entry of params.yaml to a folder laid out as\n"
            f"  {root}/train/<wnid>/*.JPEG   and   {root}/val/<wnid>/*.JPEG\n"
            f"for each of these 12 wnids: {', '.join(WNIDS)}.\nThe official flat val/ folder must first be sorted "
            f"into class folders (e.g. with the usual valprep.sh, or torchvision.datasets.ImageNet).")


def list_images(imagenet_dir: Path) -> dict[str, Path]:
    """'<folder>/<wnid>/<file>' -> path for every image of the 12 classes; DatasetUnavailableError if absent."""
    missing, files = [], {}
    for folder in SPLITS.values():
        for wnid in WNIDS:
            directory = imagenet_dir / folder / wnid
            found = sorted(p for p in directory.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file()) \
                if directory.is_dir() else []
            if not found:
                missing.append(f"{folder}/{wnid}")
            files.update({f"{folder}/{wnid}/{p.name}": p for p in found})
    if missing:
        raise DatasetUnavailableError(
            f"dataset 'imagenet_subset' is not available: {imagenet_dir.resolve()} has no images in "
            f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} ({len(missing)} of "
            f"{len(WNIDS) * len(SPLITS)} class folders missing).\n{expected_layout(imagenet_dir)}")
    return files


def resize_crop(path: Path, sha256: str) -> np.ndarray:
    """RGB, shorter side to SIZE (bilinear), centre SIZE x SIZE crop -> uint8 [3, SIZE, SIZE]; the image's bytes
    must still have `sha256` (the digest just recorded)."""
    from PIL import Image, UnidentifiedImageError

    data = read_verified(path, sha256)
    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise DatasetCorruptError(f"{path} is not a readable image: {error}") from error
    width, height = rgb.size
    scale = SIZE / min(width, height)
    new = (max(SIZE, round(width * scale)), max(SIZE, round(height * scale)))
    resized = rgb.resize(new, Image.Resampling.BILINEAR)
    left, top = (new[0] - SIZE) // 2, (new[1] - SIZE) // 2
    cropped = resized.crop((left, top, left + SIZE, top + SIZE))
    return np.asarray(cropped, dtype=np.uint8).transpose(2, 0, 1)


def _decode(files: dict[str, Path], digests: dict[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for split, folder in SPLITS.items():
        rows = sorted((WNIDS.index(key.split("/")[1]), key.split("/")[2], key)
                      for key in files if key.startswith(f"{folder}/"))
        out[f"x_{split}"] = stack_images([resize_crop(files[key], digests[key]) for _, _, key in rows], IMAGE_SHAPE)
        out[f"y_{split}"] = torch.tensor([label for label, _, _ in rows], dtype=torch.int64)
    return out


def problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    return split_problems(tensors, torch.uint8, IMAGE_SHAPE, len(WNIDS))


def load_tensors(spec: dict, raw_root: Path,
                 reach: Reach = Reach.NETWORK) -> tuple[Path, dict[str, torch.Tensor]]:
    """Decode the 12 classes of the local ImageNet once; return the cache path and the tensors.

    spec["imagenet_dir"] must already be absolute or relative to the working directory
    (ImageNetSubset.materialise resolves it against the project root). Nothing is downloaded, whatever the
    `reach` (accepted for a uniform interface, FileSource.load_tensors).
    """
    if not spec.get("imagenet_dir"):
        raise DatasetUnavailableError(f"dataset 'imagenet_subset' is not available: `imagenet_dir` is not set.\n"
                                      f"{expected_layout(None)}")
    imagenet_dir = Path(spec["imagenet_dir"])
    if not imagenet_dir.is_dir():
        raise DatasetUnavailableError(f"dataset 'imagenet_subset' is not available: imagenet_dir "
                                      f"{imagenet_dir.resolve()} is not a folder.\n{expected_layout(imagenet_dir)}")
    folder = raw_dir(raw_root)
    if folder.is_dir():
        remove_stale_temporaries(folder, ".*.tmp-*")
    files = list_images(imagenet_dir)
    digests = tree_digests(files, folder / MARKER)  # of the bytes on disk now: they key the cache
    key = {"preprocessing": PREPROCESSING, "wnids": list(WNIDS), "inputs": digest_of(digests)}
    return folder / CACHE, cached_tensors(NAME, folder, key, problems, lambda: _decode(files, digests))


class ImageNetSubset(FileSource):
    name = NAME
    input_shape = IMAGE_SHAPE
    num_classes = len(WNIDS)
    arrives = "by hand"
    # a local ILSVRC-2012 copy with train/<wnid>/ and val/<wnid>/
    options = {"imagenet_dir": Hyperparameter(None, schema={"type": ["string", "null"]})}
    estimated_sizes = (15600, 600)  # 12 classes × 1300 training and × 50 validation images
    load_tensors = staticmethod(load_tensors)

    def materialise(self, spec: dict, root: Path, dataset_dir: Path,
                    reach: Reach) -> tuple[Path, dict[str, torch.Tensor]]:
        imagenet_dir = spec.get("imagenet_dir")
        if imagenet_dir:  # a relative path is relative to the project root
            spec = {**spec, "imagenet_dir": str(root / Path(imagenet_dir).expanduser())}
        return super().materialise(spec, root, dataset_dir, reach)
