"""The committed fingerprints (fingerprints.json) and how a test checks one.

A fingerprint is the sha256 of what a piece computes on a tiny fixed problem under the portable CPU kernels
(fedskew.numerics.cpu_pin): a method's final weights and history after two rounds, a model's initial weights,
outputs and gradients, a scheme's partition, a source's generated and scaled tensors. It is recorded once per
version of the piece (`piece -> {version: digest}`), and never rewritten: a change that moves the bits of a
piece fails until its version is raised, and a change that keeps them passes.

`FEDSKEW_RECORD_FINGERPRINTS=1 .venv/bin/python -m pytest -m fingerprint` records the fingerprints that are
missing (a new piece, a raised version); an existing one is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock

from fedskew.numerics import cpu_pin

FINGERPRINTS = Path(__file__).with_name("fingerprints.json")
RECORD = os.environ.get("FEDSKEW_RECORD_FINGERPRINTS") == "1"
RECORD_COMMAND = "FEDSKEW_RECORD_FINGERPRINTS=1 .venv/bin/python -m pytest -m fingerprint"

# Fingerprints are bits: they hold where the portable kernels give the same bits on every machine.
requires_portable_kernels = pytest.mark.skipif(
    not cpu_pin.active(), reason="fingerprints are recorded under the portable CPU kernels of x86-64 "
                                 "(FEDSKEW_CPU_KERNELS=portable on an x86-64 CPU)")


class Digest:
    """A sha256 fed with tensors, arrays and JSON-able values, each with its name, dtype and shape."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, name: str, value: object) -> Digest:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            head = f"{name}:tensor:{value.dtype}:{tuple(value.shape)}"
            data = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        elif isinstance(value, np.ndarray):
            head, data = f"{name}:array:{value.dtype}:{value.shape}", np.ascontiguousarray(value).tobytes()
        else:  # floats by repr, so that a last bit counts
            head, data = f"{name}:json", json.dumps(value, sort_keys=True, default=repr).encode()
        self._hash.update(head.encode() + b"\0" + data + b"\0")
        return self

    def add_state(self, name: str, state: dict[str, torch.Tensor]) -> Digest:
        for key in sorted(state):
            self.add(f"{name}.{key}", state[key])
        return self

    def hex(self) -> str:
        return self._hash.hexdigest()


def recorded() -> dict[str, dict[str, str]]:
    return json.loads(FINGERPRINTS.read_text()) if FINGERPRINTS.exists() else {}


def check(piece: str, version: int, digest: str, where: str, shared: Callable[[], list[str]] = lambda: []) -> None:
    """Fail unless `digest` is the fingerprint recorded for `piece` at `version`; under RECORD, record it where
    it is missing. `shared()` names the shared pieces whose own fingerprints moved too (asked only on failure)."""
    known = recorded().get(piece, {})
    if str(version) not in known:
        if RECORD:
            _record(piece, version, digest)
            return
        pytest.fail(f"{piece} has no fingerprint for version {version} (recorded: {sorted(known) or 'none'}): "
                    f"if its numbers were meant to change, record the new version's with `{RECORD_COMMAND}` and "
                    f"commit tests/fingerprints/fingerprints.json", pytrace=False)
    if known[str(version)] == digest:
        return
    causes = shared()
    cause = (f" Shared pieces moved too ({', '.join(causes)}): look there first; this piece may only follow them."
             if causes else "")
    pytest.fail(f"{piece} (version {version}) no longer computes the bits of its fingerprint.{cause} If the change "
                f"is meant to move its numbers, raise its version ({where}), which gives its runs new ids and so "
                f"retrains them, and record the new fingerprint with `{RECORD_COMMAND}`; if it is meant to keep "
                "them (a refactor), find why it moves them.", pytrace=False)


def _record(piece: str, version: int, digest: str) -> None:
    with FileLock(str(FINGERPRINTS) + ".lock"):  # several pytest-xdist workers may record at once
        data = recorded()
        data.setdefault(piece, {}).setdefault(str(version), digest)
        FINGERPRINTS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
