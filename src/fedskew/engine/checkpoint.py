"""Checkpoints: everything needed to continue a run bit-identically, written atomically, verified on load.

A checkpoint file is one header line, ``fedskew-checkpoint v1 sha256=<hex>``, followed by
the bytes of ``torch.save(payload)``; the hash covers those bytes. A file whose hash does
not match (flipped bits, a truncated copy) or that cannot be read is never resumed from:
it is reported with its path, moved aside to ``last.pt.corrupt-<UTC time>`` for
inspection, and the run starts again from round 0, which gives the same result bit for
bit, only later.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "last.pt"
_MAGIC = b"fedskew-checkpoint v1 sha256="


class CorruptCheckpoint(Exception):
    """Why a checkpoint file cannot be trusted."""


def save_checkpoint(directory: Path, payload: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getbuffer()
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n")
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left if writing failed; the old checkpoint stays valid
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The payload of a checkpoint file; CorruptCheckpoint when its hash or its content is wrong."""
    data = path.read_bytes()
    header, newline, body = data.partition(b"\n")
    if not header.startswith(_MAGIC) or not newline:
        raise CorruptCheckpoint("no fedskew checkpoint header (truncated, or written by an older fedskew)")
    expected = header[len(_MAGIC):].decode("ascii", "replace")
    actual = hashlib.sha256(body).hexdigest()
    if actual != expected:
        raise CorruptCheckpoint(f"content sha256 {actual[:12]}… does not match the recorded {expected[:12]}…")
    try:
        payload = torch.load(io.BytesIO(body), weights_only=False)
    except Exception as error:  # noqa: BLE001 - intact bytes that torch cannot read are still unusable
        raise CorruptCheckpoint(f"torch cannot read it: {error}") from error
    if not isinstance(payload, dict):
        raise CorruptCheckpoint(f"its payload is a {type(payload).__name__}, not a dict")
    return payload


def load_checkpoint(directory: Path, run_id: str) -> dict[str, Any] | None:
    """The last checkpoint of this exact run, or None (absent, written by another config, or corrupt).

    A corrupt checkpoint is moved aside, with a warning naming both paths, so that the run
    restarts from round 0 instead of resuming from wrong weights or failing forever.
    """
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        payload = read_checkpoint(path)
    except CorruptCheckpoint as error:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        os.replace(path, aside)
        log.warning("checkpoint %s cannot be trusted (%s); moved it to %s and restarting the run from round 0",
                    path, error, aside)
        return None
    if payload.get("run_id") != run_id:
        return None
    return payload
