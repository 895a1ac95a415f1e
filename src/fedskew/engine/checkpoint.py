"""Checkpoints: everything needed to continue a run bit-identically, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "last.pt"


def save_checkpoint(directory: Path, payload: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left if writing failed; the old checkpoint stays valid
    return path


def load_checkpoint(directory: Path, run_id: str) -> dict[str, Any] | None:
    """The last checkpoint of this exact run, or None (absent, or written by another config)."""
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    payload = torch.load(path, weights_only=False)
    if payload.get("run_id") != run_id:
        return None
    return payload
