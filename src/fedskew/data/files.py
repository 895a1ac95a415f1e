"""File utilities every dataset module uses, whatever the source: digests, JSON files, atomic writes,
temporaries and scratch folders.

* Writes go through a temporary sibling `.<name>.tmp-<pid>` that is fsynced and renamed, so a reader sees the
  old file or the whole new one.
* Temporaries are named `...-<pid>`; those of processes that are gone are removed.
* Hand-placed file trees (FEMNIST JSON, a local ImageNet) are not checked against known digests: their sha256
  are computed at every load, recorded (`tree_digests`) and key the tensor cache (fedskew.data.tensors).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)


# --- hand-placed file trees (FEMNIST JSON, a local ImageNet) ----------------------------------

def tree_digests(files: dict[str, Path], marker: Path) -> dict[str, str]:
    """sha256 of each file (key -> path), hashed now, and recorded in `marker` with its size and mtime.

    Nothing is known in advance about such files (they are produced locally), so their digests are recorded,
    not checked; they key the tensor cache, so changed inputs rebuild it. They are hashed every time, never
    taken from the marker: a file rewritten with the same size and mtime is a changed input too.
    """
    recorded = (read_json(marker) or {}).get("files") or {}
    out, entries = {}, {}
    for key, path in sorted(files.items()):
        stat = path.stat()
        out[key] = file_sha256(path)
        entries[key] = {"sha256": out[key], "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if entries != recorded:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(marker, {"files": entries})
    return out


def digest_of(obj: object) -> str:
    """sha256 of an object's canonical JSON (a short key for a set of inputs)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- digests, JSON files, temporaries ---------------------------------------------------------

def file_digests(path: Path) -> dict:
    """md5, sha256 and size of a file, in one pass."""
    md5, sha256, size = hashlib.md5(usedforsecurity=False), hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            md5.update(block)
            sha256.update(block)
            size += len(block)
    return {"md5": md5.hexdigest(), "sha256": sha256.hexdigest(), "size": size}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict | None:
    """A JSON object from `path`; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: dict) -> None:
    """Write `path` through a temporary sibling, so a reader sees the old file or the whole new one."""
    text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"   # strict JSON: no bare NaN
    _write_atomic(path, lambda handle: handle.write(text.encode()))


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """torch.save `tensors` to `path` atomically."""
    _write_atomic(path, lambda handle: torch.save(tensors, handle))


def _write_atomic(path: Path, write: Callable[[io.BufferedWriter], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:  # a file handle keeps the bytes independent of the temp name
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())  # on disk before the rename makes it the file readers trust
    os.replace(tmp, path)


def remove_stale_temporaries(folder: Path, pattern: str) -> None:
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
def scratch_dir(root: Path, prefix: str) -> Iterator[Path]:
    """A fresh folder `root/<prefix><random>-<pid>`, removed on exit whatever happens."""
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=f"-{os.getpid()}", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
