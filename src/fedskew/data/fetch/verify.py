"""What a dataset's raw file is (`SourceFile`), how a copy proves to be an intact one, and the errors of every
dataset path.

* Verification: a file whose own md5 is the pinned one is the original; else, where a payload
  md5 is pinned, a gzip file whose decompressed content has that md5 is a repackaged copy of
  the same content (Debian recompresses Fashion-MNIST's archives), and it decodes to the same
  tensors.
* `md5=None` means the digest is unknown to fedskew (never guessed): the file is then
  checked structurally (the dataset module's `check` opens it and verifies the expected
  layout) and the md5 and sha256 of what was actually used are recorded in the marker.
* A file is hashed every time it is verified. The marker's entry for the same bytes (same sha256) spares
  only the costly part of the verification it recorded (the decompression for a payload md5, the
  structure check) and keeps their provenance; a file whose bytes changed is verified from scratch.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedskew.data.files import file_digests

log = logging.getLogger(__name__)


class DatasetUnavailableError(RuntimeError):
    """The raw files are neither on disk nor downloadable (offline, Reach.LOCAL, server error),
    or a dataset is not prepared for its current spec."""


class DatasetCorruptError(RuntimeError):
    """A raw file fails its checksum or structure check, verified files fail to decode, or a
    prepared tensor file no longer matches its manifest."""


@dataclass(frozen=True)
class SourceFile:
    """One raw file of a dataset: its name in the dataset folder, where it comes from, its digests.

    md5: the pinned digest of the file as published. payload_md5: the pinned digest of its
    gzip-decompressed content, for a file that is repackaged elsewhere (an OS package recompresses
    the archives: other bytes, the same content); a copy whose own md5 differs is accepted when its
    content has this md5. md5 None: no trusted digest is known; `check(path)` (raising
    DatasetCorruptError) then verifies the file's structure, and the digests of the file actually
    used are recorded.
    """

    filename: str
    urls: tuple[str, ...]
    md5: str | None
    check: Callable[[Path], None] | None = None
    payload_md5: str | None = None


# How a file proved to be an intact copy, as VERIFIED.json records it.
BY_ARCHIVE_MD5, BY_PAYLOAD_MD5, BY_STRUCTURE = "archive-md5", "payload-md5", "structure"


def verified(name: str, f: SourceFile, path: Path, where: str, origin: dict, recorded: object = None) -> dict:
    """The marker entry of `path` (digests, how it verified, where it came from); DatasetCorruptError if it is
    not an intact copy of `f`.

    The file is hashed every time (one pass). `recorded`, the marker's old entry for the file, counts only
    where its sha256 is that of these very bytes: it then spares what is expensive to repeat of the
    verification it recorded (decompressing for a payload md5, a structure check) and keeps where the
    bytes came from. A file whose bytes changed is verified from scratch."""
    digests = file_digests(path)
    same_bytes = isinstance(recorded, dict) and recorded.get("sha256") == digests["sha256"] \
        and recorded.get("size") == digests["size"]
    how = _recorded_verification(f, digests, recorded) if same_bytes else None
    if how is None:
        how = _verify(name, f, path, digests, where)
    if same_bytes and isinstance(recorded.get("source"), dict):
        origin = recorded["source"]  # provenance only: these bytes were verified all the same
    return {**digests, **how, "source": origin}


def _recorded_verification(f: SourceFile, digests: dict, recorded: dict) -> dict | None:
    """How the marker says these bytes verified, where that verification still holds under today's pins and
    is one worth sparing; None otherwise (a file whose own md5 is pinned is simply compared again)."""
    if recorded.get("expected_md5") != f.md5 or (f.md5 is not None and digests["md5"] == f.md5):
        return None
    if recorded.get("verified_by") == BY_PAYLOAD_MD5 and f.payload_md5 is not None \
            and recorded.get("expected_payload_md5") == f.payload_md5 == recorded.get("payload_md5"):
        return {"verified_by": BY_PAYLOAD_MD5, "payload_md5": f.payload_md5}
    if recorded.get("verified_by") == BY_STRUCTURE and f.md5 is None:
        return {"verified_by": BY_STRUCTURE}
    return None


def _verify(name: str, f: SourceFile, path: Path, digests: dict, where: str) -> dict:
    """How `path` proves to be an intact copy of `f` ({"verified_by": ...}, with the payload's md5 when that
    decided); DatasetCorruptError when it is not one."""
    if f.md5 is None:
        log.warning("%s: no pinned checksum for %s; checking its structure only and recording md5 %s, sha256 %s",
                    name, f.filename, digests["md5"], digests["sha256"])
        if f.check is not None:
            try:
                f.check(path)
            except DatasetCorruptError as error:
                raise DatasetCorruptError(f"{f.filename} {where} is not a valid {name} file: {error}") from error
        return {"verified_by": BY_STRUCTURE}
    if digests["md5"] == f.md5:
        return {"verified_by": BY_ARCHIVE_MD5}
    if f.payload_md5 is None:
        raise DatasetCorruptError(f"{f.filename} {where} has md5 {digests['md5']}, but fedskew's {name} "
                                  f"expects {f.md5}.")
    try:
        payload = gunzip_md5(path)
    except (OSError, EOFError, zlib.error) as error:
        found = f"it is not a readable gzip file ({error})"
    else:
        if payload == f.payload_md5:
            return {"verified_by": BY_PAYLOAD_MD5, "payload_md5": payload}
        found = f"its decompressed content has md5 {payload}"
    raise DatasetCorruptError(
        f"{f.filename} {where} is not fedskew's {name} file: it is neither the original archive (md5 "
        f"{digests['md5']}, expected {f.md5}) nor a repackaged copy of its content (expected the decompressed "
        f"content to have md5 {f.payload_md5}; {found}).")


def gunzip_md5(path: Path) -> str:
    """md5 of a gzip file's decompressed content, streamed (raises OSError/EOFError/zlib.error if it is no gzip)."""
    digest = hashlib.md5(usedforsecurity=False)
    with gzip.open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
