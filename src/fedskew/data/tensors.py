"""From decoded raw files to the tensors a dataset loader returns: image decoding, stacking, and the tensor
cache with its checks.

The decoded tensors are cached in tensors.pt with a tensors.json sidecar holding its
sha256 and the key it was built for (input digests, preprocessing version, options);
a cache whose key, checksum or shapes do not match is rebuilt, never trusted. The input
digests are the sha256 of the raw files' bytes as they are on disk now, hashed by the call that
verified them (fedskew.data.fetch.ensure_files, fedskew.data.files.tree_digests), never taken
from a marker: a raw file that changed never reuses the cache.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedskew.data.fetch import DatasetCorruptError
from fedskew.data.files import file_sha256, read_json, save_tensors, write_json_atomic

log = logging.getLogger(__name__)

CACHE = "tensors.pt"
CACHE_META = "tensors.json"
CACHE_FORMAT = 1


# --- images -----------------------------------------------------------------------------------

def decode_rgb(data: bytes, what: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode an image file's bytes to uint8 [C=3, H, W]; grayscale/palette/CMYK are converted to RGB.

    size (W, H) is checked when given; a file PIL cannot read is a DatasetCorruptError.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise DatasetCorruptError(f"{what} is not a readable image: {error}") from error
    if size is not None and rgb.size != size:
        raise DatasetCorruptError(f"{what} is {rgb.size[0]}x{rgb.size[1]}, expected {size[0]}x{size[1]}")
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def stack_images(images: list[np.ndarray], shape: tuple[int, ...]) -> torch.Tensor:
    """Stack [C, H, W] uint8 arrays into one contiguous uint8 tensor [N, C, H, W]."""
    out = np.empty((len(images), *shape), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = image
    return torch.from_numpy(out)


# --- the tensor cache -------------------------------------------------------------------------

Problems = Callable[[dict[str, torch.Tensor]], list[str]]


def cached_tensors(name: str, folder: Path, key: dict, problems: Problems,
                   build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """folder/tensors.pt when its sidecar vouches for it under `key`; else build(), check and cache the result."""
    tensors = load_cache(name, folder, key, problems)
    if tensors is None:
        tensors = build()
        if issues := problems(tensors):
            raise DatasetCorruptError(f"{name}: decoded tensors are malformed: {'; '.join(issues)}")
        save_cache(folder, tensors, key)
        log.info("%s: decoded %d train / %d test samples into %s", name, len(tensors["y_train"]),
                 len(tensors["y_test"]), folder / CACHE)
    return tensors


def save_cache(folder: Path, tensors: dict[str, torch.Tensor], key: dict) -> Path:
    """Write folder/tensors.pt atomically, then the sidecar that vouches for it (so a crash leaves no trust)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CACHE
    save_tensors(path, tensors)
    write_json_atomic(folder / CACHE_META, {
        "format": CACHE_FORMAT,
        "key": key,
        "sha256": file_sha256(path),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: str(v.dtype) for k, v in tensors.items()},
    })
    return path


def load_cache(name: str, folder: Path, key: dict, problems: Problems) -> dict[str, torch.Tensor] | None:
    """The cached tensors when tensors.json vouches for tensors.pt under `key` and they are well-formed."""
    meta, path = read_json(folder / CACHE_META), folder / CACHE
    if meta is None or not path.is_file():
        return None
    if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
        log.info("%s: tensor cache in %s was built from other inputs or options; rebuilding", name, folder)
        return None
    if file_sha256(path) != meta.get("sha256"):
        log.warning("%s: %s does not match the sha256 in %s; rebuilding it", name, path, CACHE_META)
        return None
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
        shapes = {k: list(v.shape) for k, v in tensors.items()}
    except Exception as error:  # noqa: BLE001 - any unreadable cache is rebuilt, never trusted
        log.warning("%s: cannot read %s (%s); rebuilding it", name, path, error)
        return None
    if shapes != meta.get("shapes") or problems(tensors):
        log.warning("%s: %s is malformed; rebuilding it", name, path)
        return None
    return tensors


def split_problems(tensors: dict[str, torch.Tensor], x_dtype: torch.dtype, x_shape: tuple[int, ...],
                   num_classes: int) -> list[str]:
    """What is wrong with x_train/y_train/x_test/y_test (empty when they are as expected)."""
    issues = []
    for split in ("train", "test"):
        x, y = tensors.get(f"x_{split}"), tensors.get(f"y_{split}")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            issues.append(f"x_{split} or y_{split} is missing")
            continue
        if x.dtype != x_dtype or tuple(x.shape[1:]) != x_shape or len(x) == 0:
            issues.append(f"x_{split} is {x.dtype} {tuple(x.shape)}, expected {x_dtype} [N>0, {x_shape}]")
        if y.dtype != torch.int64 or y.shape != (x.shape[0],):
            issues.append(f"y_{split} is {y.dtype} {tuple(y.shape)}, expected int64 [{x.shape[0]}]")
        elif len(y) and not (0 <= int(y.min()) and int(y.max()) < num_classes):
            issues.append(f"y_{split} has labels outside [0, {num_classes})")
    return issues
