"""A partition on disk: its content hash, the deterministic ``.npz`` and its ``.json`` summary, atomic writes.

The same partition gives byte-identical files: fixed key order, fixed zip timestamps, no clock.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fedskew.data.partitions.base import Partition, PartitionError

_FORMAT_VERSION = "fedskew-partition-v1"
# Fixed zip entry timestamp so that saved .npz files are byte-identical across runs.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def compute_hash(client_indices: list[np.ndarray], label_counts: np.ndarray, meta: dict[str, Any]) -> str:
    """sha256 over format version, canonical meta, per-client indices and label counts."""
    h = hashlib.sha256()
    h.update(_FORMAT_VERSION.encode())
    h.update(_canonical_json(meta).encode())
    h.update(np.int64(len(client_indices)).astype("<i8").tobytes())
    for ix in client_indices:
        h.update(np.int64(len(ix)).astype("<i8").tobytes())
        h.update(np.ascontiguousarray(ix, dtype="<i8").tobytes())
    lc = np.ascontiguousarray(label_counts, dtype="<i8")
    h.update(np.array(lc.shape, dtype="<i8").tobytes())
    h.update(lc.tobytes())
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _npz_bytes(arrays: list[tuple[str, np.ndarray]]) -> bytes:
    """A deterministic .npz (zip, stored, fixed timestamps) readable by ``np.load``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays:
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.create_system = 3
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def _summary_json(p: Partition) -> str:
    """Human-readable summary: meta, hash, per-client sizes and label counts (one row per line)."""
    doc = {
        "format": _FORMAT_VERSION,
        "meta": p.meta,
        "content_hash": p.content_hash,
        "client_sizes": p.client_sizes.tolist(),
        "label_counts": p.label_counts.tolist(),
    }
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False)
    # Collapse lists of integers onto one line so that label_counts reads as a table.
    text = re.sub(
        r"\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]",
        lambda mt: "[" + ", ".join(s.strip() for s in mt.group(1).split(",")) + "]",
        text,
    )
    return text + "\n"


def save_partition(p: Partition, npz_path: Path) -> None:
    """Write ``npz_path`` (arrays + meta + hash) and its ``.json`` summary, each atomically.

    Same partition -> byte-identical files (fixed key order, no timestamps).
    """
    npz_path = Path(npz_path)
    sizes = p.client_sizes
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = (np.concatenate(p.client_indices) if p.client_indices else np.zeros(0)).astype(np.int64)
    arrays = [
        ("indices", flat),
        ("offsets", offsets),
        ("label_counts", np.asarray(p.label_counts, dtype=np.int64)),
        ("meta_json", np.frombuffer(_canonical_json(p.meta).encode(), dtype=np.uint8)),
        ("content_hash", np.frombuffer(p.content_hash.encode(), dtype=np.uint8)),
        ("format", np.frombuffer(_FORMAT_VERSION.encode(), dtype=np.uint8)),
    ]
    atomic_write_bytes(npz_path, _npz_bytes(arrays))
    atomic_write_bytes(npz_path.with_suffix(".json"), _summary_json(p).encode())


def load_partition(npz_path: Path) -> Partition:
    """Read a partition written by :func:`save_partition` and verify its content hash.

    A missing key, a hash mismatch (tampered indices, counts or meta) or a ``.json``
    sidecar whose hash disagrees raises :class:`PartitionError`.
    """
    npz_path = Path(npz_path)
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            flat = z["indices"].astype(np.int64)
            offsets = z["offsets"].astype(np.int64)
            label_counts = z["label_counts"].astype(np.int64)
            meta = json.loads(z["meta_json"].tobytes().decode())
            stored = z["content_hash"].tobytes().decode()
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise PartitionError(f"cannot read partition file {npz_path}: {exc}") from exc
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != flat.size \
            or np.any(np.diff(offsets) < 0):
        raise PartitionError(f"corrupted partition file {npz_path}: inconsistent offsets")
    client_indices = [flat[offsets[k] : offsets[k + 1]].copy() for k in range(offsets.size - 1)]
    actual = compute_hash(client_indices, label_counts, meta)
    if actual != stored:
        raise PartitionError(
            f"content hash mismatch for {npz_path}: stored {stored[:16]}..., recomputed "
            f"{actual[:16]}...; the file was modified or corrupted, regenerate the partition"
        )
    side = npz_path.with_suffix(".json")
    if side.exists():
        try:
            side_hash = json.loads(side.read_text()).get("content_hash")
        except (ValueError, OSError) as exc:
            raise PartitionError(f"cannot read partition summary {side}: {exc}") from exc
        if side_hash != stored:
            raise PartitionError(
                f"{side} records content hash {str(side_hash)[:16]}... but {npz_path} holds "
                f"{stored[:16]}...; the two files do not belong together, regenerate them"
            )
    return Partition(client_indices, label_counts, meta, stored)
