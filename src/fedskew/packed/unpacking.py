"""Reading a run archive within bounds set before it is read (fedskew.packed.archive ships and imports them).

The file holds at most MAX_ARCHIVE_BYTES, its tar stream is read once, in order, and each member is judged by its
header before a byte of it is inflated. A member must be a regular file (not a link, a folder, or a pax or GNU
extension header, which tarfile would read whole, whatever size it claims), the manifest at most
MAX_MANIFEST_BYTES, each run file of exactly the size its manifest entry gives, those entries MAX_ARCHIVE_BYTES at
most together (what `ship` packs into one archive), each under a results/runs/... path of params.yaml's names.
Members are hashed, and staged for import, in CHUNK_BYTES pieces as they stream by.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

FORMAT = "fedskew-runs/1"
MANIFEST = "MANIFEST.json"
MAX_ARCHIVE_BYTES = 16 * 2**20  # what one file coming back from a device machine may hold here
MAX_MANIFEST_BYTES = 2**20      # about 1.6 KB a run: the most runs an archive holds (~250 of ~4 KB) take ~400 KB
CHUNK_BYTES = 2**20             # what reading an archive holds of a member at once
_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # a name in params.yaml (its schema's `id`): never `.` or `..`
_RUN_PATH = re.compile(rf"results/runs/{_ID}/{_ID}/{_ID}/{_ID}/seed\d+/(config\.yaml|history\.csv|metrics\.json)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ArchiveError(RuntimeError):
    """An archive is damaged or does not match this project's params.yaml, or its runs could not be placed;
    nothing was imported."""


class _Refused(Exception):
    """What is wrong with an archive being read (its path is added where it is known)."""


class _StagingFailed(Exception):
    """Writing an archive's run files into the scratch folder failed (the archive may be fine)."""


class _RunFileHeader(tarfile.TarInfo):
    """A tar header as `read_archive` accepts it: a regular file. Its data is read only after the checks."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        # tarfile's hook for subclasses, called for each header before anything after it is read: an extension
        # header (pax, GNU long name, sparse) would be read into memory whole, whatever size it claims.
        if self.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise _Refused(f"member {self.name!r} is not a regular file")
        return super()._proc_member(tar)


def read_archive(path: Path, stage: Path | None = None) -> dict:
    """The manifest of an archive, after every member was checked against it; with `stage`, each run file is
    also written under that folder at its results/runs/... path (to be checked there before it counts)."""
    try:
        with open(path, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            if size > MAX_ARCHIVE_BYTES:
                raise _Refused(f"it holds {size} bytes, more than an archive may ({MAX_ARCHIVE_BYTES}); ship its "
                               "runs again (`packed ship` writes archives of at most that)")
            # gzip.GzipFile inflates at most what each read asks for; the tar stream is read once, in order.
            with gzip.GzipFile(fileobj=raw) as inflated, \
                    tarfile.open(fileobj=inflated, mode="r|", tarinfo=_RunFileHeader) as tar:
                return _read_members(tar, stage)
    except _Refused as why:
        raise ArchiveError(f"{path}: {why}") from None
    except _StagingFailed as error:
        raise ArchiveError(f"{path}: its run files could not be staged for checking under {stage} "
                           f"({error.__cause__}); free disk space there and import again") from error
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise ArchiveError(f"{path}: cannot be read as a gzipped tar ({error}); ship it again") from error


def _read_members(tar: tarfile.TarFile, stage: Path | None) -> dict:
    first = tar.next()
    if first is None or first.name != MANIFEST:
        raise _Refused(f"{MANIFEST} is not its first member; it is not a fedskew run archive")
    if first.size > MAX_MANIFEST_BYTES:
        raise _Refused(f"its {MANIFEST} claims {first.size} bytes, more than a manifest may ({MAX_MANIFEST_BYTES})")
    manifest = _parse_manifest(tar.extractfile(first).read())  # of a size checked just above
    listed = manifest["files"]
    seen: set[str] = set()
    while (member := tar.next()) is not None:  # each header is read (and judged) once the last member is done
        name = member.name
        if not _RUN_PATH.fullmatch(name):
            raise _Refused(f"{name!r} is not a run file under results/runs/")
        if name in seen:
            raise _Refused(f"member {name!r} appears twice")
        if name not in listed:
            raise _Refused(f"members and manifest disagree ({name} is not listed in {MANIFEST})")
        if member.size != listed[name]["size"]:
            raise _Refused(f"{name} holds {member.size} bytes, but {MANIFEST} says {listed[name]['size']}; the "
                           "archive is damaged")
        if _hash_member(tar.extractfile(member), stage / name if stage else None) != listed[name]["sha256"]:
            raise _Refused(f"{name} does not match its digest in {MANIFEST}; the archive is damaged")
        seen.add(name)
    if seen != set(listed):
        raise _Refused(f"members and manifest disagree (missing: {sorted(set(listed) - seen)})")
    return manifest


def _parse_manifest(data: bytes) -> dict:
    """The manifest, its shape checked: it decides how much of the archive is read."""
    try:
        manifest = json.loads(data)
    except ValueError as error:
        raise _Refused(f"{MANIFEST} is not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise _Refused(f"format {found!r}, expected {FORMAT!r}")
    files, runs = manifest.get("files"), manifest.get("runs")
    if not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str) and _SHA256.fullmatch(e["sha256"])
            and type(e.get("size")) is int and e["size"] >= 0 for e in files.values()):
        raise _Refused(f"{MANIFEST}: `files` is not a sha256 and a size for each file")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("run_id"), str) for r in runs):
        raise _Refused(f"{MANIFEST}: `runs` is not a list of runs with their run ids")
    total = sum(entry["size"] for entry in files.values())
    if total > MAX_ARCHIVE_BYTES:
        raise _Refused(f"its files would take {total} bytes, more than an archive may hold ({MAX_ARCHIVE_BYTES})")
    return manifest


def _hash_member(source: IO[bytes], target: Path | None) -> str:
    """The sha256 of a member read in CHUNK_BYTES pieces, each also written to `target` when there is one."""
    digest = hashlib.sha256()
    with _stage_file(target) as write:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
            write(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _stage_file(target: Path | None) -> Iterator[Callable[[bytes], None]]:
    """A `write(chunk)` into `target` in the scratch folder (without one, chunks are only hashed). An OSError
    there (a full disk) is _StagingFailed, so that it is not taken for a damaged archive."""
    if target is None:
        yield lambda chunk: None
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        out = open(target, "wb")
    except OSError as error:
        raise _StagingFailed() from error

    def write(chunk: bytes) -> None:
        try:
            out.write(chunk)
            out.flush()  # nothing left for close() to fail on
        except OSError as error:
            raise _StagingFailed() from error

    with out:
        yield write
