"""Download, verify and load the torchvision image datasets as in-memory uint8 tensors.

`raw_dir(name, root)` holds the original archives exactly as torchvision names them, a
VERIFIED.json marker written only after every archive's md5 matched, and a decoded cache
(tensors.pt plus tensors.json with its sha256). Downloads land in a sibling temporary
folder first, so an interrupted or corrupt download never leaves a file a later run trusts.
URLs, md5s and decoding come from torchvision's dataset classes, read at call time.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60.0  # per blocking socket operation (connect, each read), not per file
MARKER = "VERIFIED.json"
CACHE = "tensors.pt"
CACHE_META = "tensors.json"
CACHE_FORMAT = 1
SVHN_SPLITS = ("train", "test")  # "extra" (531k images, 1.3 GB) is not used
_SPLITS = ("x_train", "y_train", "x_test", "y_test")


class DatasetUnavailableError(RuntimeError):
    """The raw files are neither on disk nor downloadable (offline, download=False, server error)."""


class DatasetCorruptError(RuntimeError):
    """A raw file's md5 differs from the one torchvision expects, or verified files fail to decode."""


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


@dataclass(frozen=True)
class RemoteFile:
    """One archive torchvision downloads: its file name, md5 and the URLs to try in order."""

    filename: str
    md5: str
    urls: tuple[str, ...]


def _spec(name: str) -> TorchvisionSpec:
    if name not in TORCHVISION_DATASETS:
        raise ValueError(f"unknown torchvision dataset {name!r}; known: {sorted(TORCHVISION_DATASETS)}")
    return TORCHVISION_DATASETS[name]


def remote_files(name: str) -> list[RemoteFile]:
    """The archives torchvision would download for `name`, read from its class attributes."""
    spec = _spec(name)
    cls = spec.cls
    if spec.layout == "idx":
        return [RemoteFile(fn, md5, tuple(mirror + fn for mirror in cls.mirrors)) for fn, md5 in cls.resources]
    if spec.layout == "cifar":
        return [RemoteFile(cls.filename, cls.tgz_md5, (cls.url,))]
    return [RemoteFile(cls.split_list[s][1], cls.split_list[s][2], (cls.split_list[s][0],)) for s in SVHN_SPLITS]


def raw_dir(name: str, root: Path) -> Path:
    """Folder holding `name`'s archives, marker and tensor cache (root is data/raw)."""
    _spec(name)
    return Path(root) / name


def prepare(name: str, root: Path, download: bool = True) -> Path:
    """Make sure md5-verified archives for `name` are in raw_dir; download missing ones if allowed.

    Archives placed by hand (named as torchvision names them) are verified and used with no
    network. A corrupt file on disk is reported, never deleted: it may be the user's only copy.
    """
    root = Path(root)
    target = raw_dir(name, root)
    files = remote_files(name)
    _remove_stale_temporaries(root, f".{name}.*-*")  # download/decode folders of killed runs
    _remove_stale_temporaries(target, ".*.tmp-*")  # half-written marker or cache files
    if _marker_is_valid(target, files):
        return target
    missing = []
    for remote in files:
        path = target / remote.filename
        if not path.is_file():
            missing.append(remote)
        elif (actual := _file_digest(path, "md5")) != remote.md5:
            raise DatasetCorruptError(
                f"{path.resolve()} has md5 {actual}, but torchvision.datasets.{_spec(name).class_name} expects "
                f"{remote.md5}. Delete it so that fedskew downloads it again, or replace it with an intact copy."
            )
    if missing and not download:
        raise _unavailable(name, target, files, f"download=False and {', '.join(f.filename for f in missing)} "
                                                f"{'is' if len(missing) == 1 else 'are'} missing")
    if missing:
        _download_verified(name, root, target, missing, files)
    _write_json_atomic(target / MARKER, {
        "dataset": name,
        "torchvision_class": _spec(name).class_name,
        "files": {f.filename: {"md5": f.md5, "size": (target / f.filename).stat().st_size} for f in files},
    })
    log.info("%s: verified %d archive(s) in %s", name, len(files), target)
    return target


def load_tensors(name: str, root: Path, download: bool = True) -> RawTensors:
    """prepare(), then return the decoded tensors, from raw_dir/tensors.pt when that cache verifies."""
    directory = prepare(name, root, download)
    sources = {f.filename: f.md5 for f in remote_files(name)}
    cached = _load_cache(name, directory, sources)
    if cached is not None:
        return cached
    tensors = _decode(name, directory)
    _save_cache(directory, tensors, sources)
    log.info("%s: decoded %d train / %d test images into %s", name, len(tensors.y_train), len(tensors.y_test),
             directory / CACHE)
    return tensors


# --- downloading ------------------------------------------------------------------------------

def _download_verified(name: str, root: Path, target: Path, missing: list[RemoteFile],
                       files: list[RemoteFile]) -> None:
    """Fetch `missing` into a temporary sibling folder, check md5s, then move them into place."""
    with _scratch_dir(root, f".{name}.partial-") as partial:
        for remote in missing:
            url, actual = _fetch(name, target, files, remote, partial / remote.filename)
            if actual != remote.md5:
                raise DatasetCorruptError(
                    f"{remote.filename} downloaded from {url} has md5 {actual}, but "
                    f"torchvision.datasets.{_spec(name).class_name} expects {remote.md5}. The download was "
                    f"discarded and nothing was written to {target.resolve()}. Run again to retry; if it "
                    f"persists, fetch the file elsewhere and place it in that folder by hand."
                )
        target.mkdir(parents=True, exist_ok=True)
        for remote in missing:
            os.replace(partial / remote.filename, target / remote.filename)


def _fetch(name: str, target: Path, files: list[RemoteFile], remote: RemoteFile, dest: Path) -> tuple[str, str]:
    """Try each URL of `remote` in turn; return the URL that worked and the md5 of what it served."""
    errors = []
    for url in remote.urls:
        try:
            return url, _stream(url, dest)
        except (OSError, http.client.HTTPException, ValueError) as error:  # URLError, HTTPError, timeouts
            reason = _reason(error)
            log.warning("%s: downloading %s failed: %s", name, url, reason)
            errors.append(f"{url}: {reason}")
    raise _unavailable(name, target, files, f"downloading {remote.filename} failed (no network?): "
                                            + "; ".join(errors))


def _reason(error: Exception) -> str:
    """A one-line cause for a failed download: 'HTTP 404 Not Found', 'timed out', 'Connection refused'."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return f"{type(error).__name__}: {error}"


def _stream(url: str, dest: Path) -> str:
    """Download `url` to `dest` with bounded socket waits, returning the md5 of the bytes received."""
    from torch.hub import tqdm  # real tqdm when installed; shown only on a terminal

    digest, received = hashlib.md5(usedforsecurity=False), 0
    request = urllib.request.Request(url, headers={"User-Agent": "fedskew (torchvision datasets)"})
    log.info("downloading %s", url)
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response, open(dest, "wb") as out, \
            tqdm(total=response.length, unit="B", unit_scale=True, desc=dest.name,
                 disable=not sys.stderr.isatty()) as bar:
        expected = response.length
        while chunk := response.read(1 << 20):
            out.write(chunk)
            digest.update(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    if expected is not None and received < expected:
        raise http.client.IncompleteRead(b"", expected - received)
    return digest.hexdigest()


def _unavailable(name: str, target: Path, files: list[RemoteFile], reason: str) -> DatasetUnavailableError:
    listing = "\n".join(f"  {f.filename}  (md5 {f.md5}; from {f.urls[0] if f.urls else '?'})" for f in files)
    return DatasetUnavailableError(
        f"dataset {name!r} is not available: {reason}.\nTo work offline, place these files, named exactly "
        f"as torchvision.datasets.{_spec(name).class_name} downloads them, in {target.resolve()}:\n{listing}"
    )


# --- verification, markers, temporaries -------------------------------------------------------

def _file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _marker_is_valid(target: Path, files: list[RemoteFile]) -> bool:
    """True when VERIFIED.json records today's expected md5s and every file still has its size."""
    recorded = (_read_json(target / MARKER) or {}).get("files")
    if not isinstance(recorded, dict) or set(recorded) != {f.filename for f in files}:
        return False
    for f in files:
        entry, path = recorded[f.filename], target / f.filename
        if not isinstance(entry, dict) or entry.get("md5") != f.md5 or not path.is_file() \
                or path.stat().st_size != entry.get("size"):
            return False
    return True


def _remove_stale_temporaries(folder: Path, pattern: str) -> None:
    """Delete temporaries named `...-<pid>` whose process is gone (a killed run's leftovers)."""
    for path in folder.glob(pattern):
        pid = path.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or _pid_alive(int(pid)):
            continue
        log.info("removing %s left by dead process %s", path, pid)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process there: assume alive
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # exists, owned by another user
        pass
    return True


@contextmanager
def _scratch_dir(root: Path, prefix: str) -> Iterator[Path]:
    """A fresh folder `root/<prefix><random>-<pid>`, removed on exit whatever happens."""
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=f"-{os.getpid()}", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- decoding and the tensor cache ------------------------------------------------------------

def _decode(name: str, directory: Path) -> RawTensors:
    """Decode verified archives with torchvision's own dataset class; uint8 NCHW + int64 labels."""
    from torchvision.datasets.utils import extract_archive

    spec = _spec(name)
    cls = spec.cls
    try:
        if spec.layout == "svhn":  # the .mat files are read in place
            train, test = (cls(str(directory), split=s, download=False) for s in SVHN_SPLITS)
            tensors = [torch.from_numpy(np.ascontiguousarray(d.data)) for d in (train, test)]
            labels = [torch.as_tensor(d.labels, dtype=torch.int64) for d in (train, test)]
            return _checked(name, RawTensors(tensors[0], labels[0], tensors[1], labels[1], spec.num_classes))
        with _scratch_dir(directory.parent, f".{name}.decode-") as scratch:
            unpack_to = scratch / cls.__name__ / "raw" if spec.layout == "idx" else scratch
            unpack_to.mkdir(parents=True, exist_ok=True)
            for remote in remote_files(name):
                extract_archive(directory / remote.filename, unpack_to)
            train, test = (cls(str(scratch), train=flag, download=False) for flag in (True, False))
            if spec.layout == "idx":  # data: uint8 [N, H, W] tensor
                x = [d.data.unsqueeze(1).contiguous() for d in (train, test)]
            else:  # data: uint8 [N, H, W, C] numpy array
                x = [torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous() for d in (train, test)]
            y = [torch.as_tensor(d.targets, dtype=torch.int64) for d in (train, test)]
            return _checked(name, RawTensors(x[0], y[0], x[1], y[1], spec.num_classes))
    except DatasetCorruptError:
        raise
    except (RuntimeError, OSError, ValueError, KeyError, EOFError) as error:  # torchvision's, pickle's, scipy's
        raise DatasetCorruptError(
            f"verified archives in {directory.resolve()} could not be decoded by torchvision.datasets."
            f"{spec.class_name}: {error}. Delete that folder to download the dataset again."
        ) from error


def _problems(name: str, tensors: RawTensors) -> list[str]:
    """What is wrong with `tensors` for dataset `name` (empty when they are as expected)."""
    spec, issues = _spec(name), []
    for split in ("train", "test"):
        x, y = getattr(tensors, f"x_{split}"), getattr(tensors, f"y_{split}")
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != spec.image_shape:
            issues.append(f"x_{split} is {x.dtype} {tuple(x.shape)}, expected uint8 [N, {spec.image_shape}]")
        if y.dtype != torch.int64 or y.shape != (x.shape[0],):
            issues.append(f"y_{split} is {y.dtype} {tuple(y.shape)}, expected int64 [{x.shape[0]}]")
        elif len(y) and not (0 <= int(y.min()) and int(y.max()) < spec.num_classes):
            issues.append(f"y_{split} has labels outside [0, {spec.num_classes})")
    if tensors.num_classes != spec.num_classes:
        issues.append(f"num_classes is {tensors.num_classes}, expected {spec.num_classes}")
    return issues


def _checked(name: str, tensors: RawTensors) -> RawTensors:
    if issues := _problems(name, tensors):
        raise DatasetCorruptError(f"{name}: decoded tensors are malformed: {'; '.join(issues)}")
    return tensors


def _save_cache(directory: Path, tensors: RawTensors, sources: dict[str, str]) -> None:
    """Write tensors.pt atomically, then the sidecar that vouches for it (so a crash leaves no trust)."""
    tmp = directory / f".{CACHE}.tmp-{os.getpid()}"
    with open(tmp, "wb") as handle:  # a file handle keeps the bytes independent of the temp name
        torch.save({split: getattr(tensors, split) for split in _SPLITS}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, directory / CACHE)
    _write_json_atomic(directory / CACHE_META, {
        "format": CACHE_FORMAT,
        "sha256": _file_digest(directory / CACHE, "sha256"),
        "sources": sources,
        "shapes": {split: list(getattr(tensors, split).shape) for split in _SPLITS},
        "num_classes": tensors.num_classes,
    })


def _load_cache(name: str, directory: Path, sources: dict[str, str]) -> RawTensors | None:
    """The cached tensors if tensors.json vouches for tensors.pt and they are well-formed, else None."""
    meta, path = _read_json(directory / CACHE_META), directory / CACHE
    if meta is None or not path.is_file():
        return None
    if meta.get("format") != CACHE_FORMAT or meta.get("sources") != sources:
        log.info("%s: tensor cache was built from other archives or by another version; rebuilding", name)
        return None
    if _file_digest(path, "sha256") != meta.get("sha256"):
        log.warning("%s: %s does not match the sha256 in %s; rebuilding it", name, path, CACHE_META)
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        tensors = RawTensors(*(data[split] for split in _SPLITS), num_classes=meta["num_classes"])
    except Exception as error:  # noqa: BLE001 - any unreadable cache is rebuilt, never trusted
        log.warning("%s: cannot read %s (%s); rebuilding it", name, path, error)
        return None
    shapes = {split: list(getattr(tensors, split).shape) for split in _SPLITS}
    if shapes != meta.get("shapes") or _problems(name, tensors):
        log.warning("%s: %s is malformed; rebuilding it", name, path)
        return None
    return tensors
