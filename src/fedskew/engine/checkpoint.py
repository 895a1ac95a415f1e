"""Checkpoints: everything needed to continue a run bit-identically, written atomically, verified on load.

A checkpoint file is one header line, ``fedskew-checkpoint v1 sha256=<hex>``, followed by
the bytes of ``torch.save(payload)``; the hash covers those bytes. The payload is
``{"run_id", "round", "global_state", "algorithm_state", "history"}``.

A checkpoint is data, never code: checkpoints travel between machines (a DVC remote, a shared
folder), and the hash in the header is written by whoever wrote the file, so it catches damage,
not tampering. So the body is read with ``torch.load(weights_only=True)``, whose unpickler
builds tensors and plain containers and refuses any other class or callable, and the payload
must then hold only the types on ``PAYLOAD_TYPES`` (tensors, dicts, lists, tuples, strings,
numbers, booleans, None) in the shape above. A file that fails any of this (flipped bits, a
truncated copy, a pickle that names a callable, a body without one of the keys, a state that
the run's model or method cannot take) is never resumed from: it is reported in one warning
line with its path, moved aside to ``last.pt.corrupt-<UTC time>`` for inspection, and the run
starts again from round 0, which gives the same result bit for bit, only later.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "last.pt"
_MAGIC = b"fedskew-checkpoint v1 sha256="


# The only types a checkpoint payload may hold, anywhere in it: what the engine and every method's
# state_dict write (tests/unit/test_resume_all_methods.py round-trips each method).
PAYLOAD_TYPES = (torch.Tensor, dict, list, tuple, str, int, float, bool, type(None))
PAYLOAD_KEYS = ("run_id", "round", "global_state", "algorithm_state", "history")


class CorruptCheckpoint(Exception):
    """Why a checkpoint file cannot be trusted."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a read-only folder); the previous one is intact."""


def save_checkpoint(directory: Path, payload: dict[str, Any]) -> Path:
    path = directory / CHECKPOINT_NAME
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getbuffer()
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n")
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        raise CheckpointWriteError(error.errno, error.strerror or str(error), str(path)) from error
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
        payload = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - bytes torch's safe unpickler refuses or cannot read are unusable
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CorruptCheckpoint(f"torch's weights-only loader refuses it: {reason}") from error
    _check_payload(payload)
    return payload


def _check_payload(payload: object) -> None:
    """CorruptCheckpoint unless `payload` has the shape the engine writes, of PAYLOAD_TYPES only."""
    if not isinstance(payload, dict) or set(payload) != set(PAYLOAD_KEYS):
        found = sorted(map(str, payload)) if isinstance(payload, dict) else type(payload).__name__
        raise CorruptCheckpoint(f"its payload is not a fedskew checkpoint (expected the keys {', '.join(PAYLOAD_KEYS)}; "
                                f"found {found})")
    stack = [payload]
    while stack:
        item = stack.pop()
        if not isinstance(item, PAYLOAD_TYPES):
            raise CorruptCheckpoint(f"its payload holds a {type(item).__name__}, which no fedskew checkpoint holds")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    run_round, history, state = payload["round"], payload["history"], payload["global_state"]
    if not isinstance(payload["run_id"], str) or type(run_round) is not int or run_round < 1:
        raise CorruptCheckpoint(f"its run id {payload['run_id']!r} or round {run_round!r} is malformed")
    if not isinstance(history, list) or [row.get("round") if isinstance(row, dict) else None
                                         for row in history] != list(range(1, run_round + 1)):
        raise CorruptCheckpoint(f"its history is not one row for each of rounds 1 to {run_round}")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CorruptCheckpoint("its global_state is not a mapping of parameter names to tensors")
    if not isinstance(payload["algorithm_state"], dict):
        raise CorruptCheckpoint("its algorithm_state is not a mapping")


def load_checkpoint(directory: Path, run_id: str,
                    restore: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any] | None:
    """The last checkpoint of this exact run, or None (absent, written by another config, or corrupt).

    `restore(payload)` (the engine's) checks that the run's model and method can take the payload's
    state, raising CorruptCheckpoint when they cannot. A checkpoint that cannot be trusted is moved
    aside with one warning line naming both paths, so that the run restarts from round 0 instead of
    resuming from wrong weights or failing the same way on every retry.
    """
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        payload = read_checkpoint(path)
        if payload["run_id"] != run_id:
            return None  # another configuration's: this run starts afresh and replaces it at its first checkpoint
        if restore is not None:
            restore(payload)
    except CorruptCheckpoint as error:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        os.replace(path, aside)
        log.warning("checkpoint %s cannot be trusted (%s); moved it to %s and retraining the run from round 0",
                    path, error, aside)
        return None
    return payload
