"""The last source of a raw file: its dataset's own hosts, and the error for files that no source provides.

Each of a file's URLs is tried in turn, with bounded socket waits; a short body counts as a failed download.
The downloaded file is verified like every other copy (fedskew.data.fetch.verify) before anything trusts it.
Offline, or under Reach.LOCAL (no file is asked of the network), the error lists the files to place and where,
and the other ways to provide them.
"""

from __future__ import annotations

import http.client
import logging
import sys
import urllib.error
import urllib.request
from pathlib import Path

from fedskew.data.fetch.verify import DatasetCorruptError, DatasetUnavailableError, SourceFile, verified
from fedskew.data.sources import how_to_provide

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60.0  # per blocking socket operation (connect, each read), not per file


def download_verified(name: str, folder: Path, f: SourceFile, files: list[SourceFile], dest: Path,
                      how_to_get: str, refused: list[str]) -> dict:
    """Download `f` to `dest` and verify it; its marker entry."""
    if not f.urls:
        raise unavailable(name, folder, files, f"{f.filename} cannot be downloaded automatically", how_to_get,
                          refused)
    url = _download_from_urls(name, folder, files, f, dest, how_to_get, refused)
    try:
        return verified(name, f, dest, f"downloaded from {url}", {"kind": "download", "url": url})
    except DatasetCorruptError as error:
        raise DatasetCorruptError(
            f"{error} The download was discarded and nothing was written to {folder.resolve()}. Run "
            f"again to retry; if it persists, fetch the file elsewhere and place it in that folder by hand."
        ) from error


def _download_from_urls(name: str, folder: Path, files: list[SourceFile], f: SourceFile, dest: Path,
                        how_to_get: str, refused: list[str]) -> str:
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


# --- the error when no source has a file ---------------------------------------------------------

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
