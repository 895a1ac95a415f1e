"""Reading verified raw files: a decoder re-hashes the bytes it reads, and archives are unpacked safely.

`ensure_files` verifies a file and returns its sha256; the decode that follows reads the file again, and
hashes what it reads against that digest, so a file swapped between the check and the decode is refused
(DatasetCorruptError naming it) before anything decoded from it is cached. The read is needed anyway, so
the hashing costs no extra pass over the file (a private copy, where one is needed, is made in that pass).

* `verified_reader`: one sequential read that hashes every byte; the rest of the file is read on leaving
  and the digest compared. For the decoders that stream (CINIC-10's 688 MB tar.gz).
* `read_verified`: the whole file in memory, verified, for files a decoder parses whole (Adult's text,
  LEAF's JSON, an image).
* `copy_verified`: a private copy in a scratch folder, made while hashing, for a decoder that needs a path
  (torchvision's classes, scipy's .mat reader) or random access (a zip): what it opens then is the very
  bytes that were verified, and nobody else can change them.
* `gunzip_verified` and `extract_tar_verified` unpack the torchvision archives into a scratch folder the
  same way. An archive member is unpacked only if it is a regular file or a folder whose name stays inside
  the target: a member with an absolute name or a `..` part, a symbolic or hard link, a device or a fifo is
  refused (`check_tar_member`) before a byte of it is written; nothing is unpacked with tarfile's
  `extractall`. The archives decoded without being unpacked (CINIC-10's tar, streamed; Tiny ImageNet's zip,
  from its private copy) refuse such members too (`check_tar_member`, `check_zip_member`): they are no
  dataset archive fedskew knows.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from fedskew.data.fetch.verify import DatasetCorruptError

BLOCK = 1 << 20


class _HashingReader:
    """A file object's `read`, hashing every byte it hands out (sha256)."""

    def __init__(self, handle) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data


def _changed(path: Path, expected: str, actual: str) -> DatasetCorruptError:
    return DatasetCorruptError(
        f"{Path(path).resolve()} changed after it was verified: its bytes now have sha256 {actual}, not the "
        f"verified {expected}; nothing decoded from it is kept. Run again to verify it anew; if it keeps changing, "
        f"something else is writing to that file.")


@contextmanager
def verified_reader(path: Path, sha256: str) -> Iterator[_HashingReader]:
    """`path` open for one sequential read that hashes what is read; on leaving, the rest is read and the digest
    compared with `sha256` (DatasetCorruptError if it differs). A decode error inside propagates as it is."""
    with open(path, "rb") as handle:
        reader = _HashingReader(handle)
        yield reader
        while reader.read(BLOCK):  # what the decoder left unread (a gzip trailer, tar padding) counts too
            pass
    if (actual := reader.digest.hexdigest()) != sha256:
        raise _changed(path, sha256, actual)


def read_verified(path: Path, sha256: str) -> bytes:
    """The bytes of `path`, read once; DatasetCorruptError if they cannot be read or their sha256 is not `sha256`."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise DatasetCorruptError(f"cannot read {Path(path).resolve()}, which verified a moment before: {error}") \
            from error
    if (actual := hashlib.sha256(data).hexdigest()) != sha256:
        raise _changed(path, sha256, actual)
    return data


def copy_verified(path: Path, dest: Path, sha256: str) -> Path:
    """Copy `path` to `dest` (in a scratch folder), hashing as it copies; `dest`, whose bytes are the verified
    ones (DatasetCorruptError if the copied bytes' sha256 is not `sha256`: the scratch folder's owner removes
    the copy with the folder)."""
    with verified_reader(path, sha256) as reader, open(dest, "wb") as out:
        shutil.copyfileobj(reader, out, BLOCK)
    return Path(dest)


def gunzip_verified(path: Path, dest: Path, sha256: str) -> Path:
    """Decompress the gzip file `path` into `dest`, hashing its bytes as they are read (see verified_reader)."""
    with verified_reader(path, sha256) as reader, gzip.GzipFile(fileobj=reader, mode="rb") as stream, \
            open(dest, "wb") as out:
        shutil.copyfileobj(stream, out, BLOCK)
    return Path(dest)


# --- archive members ----------------------------------------------------------------------------

def _unsafe_name(name: str) -> str | None:
    """Why a member name could not be unpacked inside a target folder, or None."""
    if not name or name.startswith(("/", "\\")):
        return "has an absolute name"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "leaves its folder (a '..' in its name)"
    return None


def _refused(archive: Path, name: str, why: str) -> DatasetCorruptError:
    return DatasetCorruptError(
        f"{Path(archive).name}: member {name!r} {why}; no dataset archive fedskew knows has such a member, so it is "
        f"refused and nothing of it was written. Replace {Path(archive).resolve()} with an intact copy.")


def check_tar_member(archive: Path, member: tarfile.TarInfo) -> tarfile.TarInfo:
    """`member` if it is a regular file or a folder with a name inside the target; else DatasetCorruptError
    naming the archive and the member (a link, a device, a fifo, an absolute name, a '..')."""
    if why := _unsafe_name(member.name):
        raise _refused(archive, member.name, why)
    if member.issym():
        raise _refused(archive, member.name, f"is a symbolic link (to {member.linkname!r})")
    if member.islnk():
        raise _refused(archive, member.name, f"is a hard link (to {member.linkname!r})")
    if member.ischr() or member.isblk():
        raise _refused(archive, member.name, "is a device file")
    if member.isfifo():
        raise _refused(archive, member.name, "is a fifo")
    if not (member.isfile() or member.isdir()):
        raise _refused(archive, member.name, f"is of tar type {member.type!r}, neither a file nor a folder")
    return member


def check_zip_member(archive: Path, info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """`info` if its name stays inside the target and it is no link, device or fifo (by the Unix mode a zip
    made on Unix records); else DatasetCorruptError naming the archive and the member."""
    if why := _unsafe_name(info.filename):
        raise _refused(archive, info.filename, why)
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise _refused(archive, info.filename, "is a symbolic link")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise _refused(archive, info.filename, "is a device, fifo or socket")
    return info


def extract_tar_verified(path: Path, dest: Path, sha256: str) -> None:
    """Unpack the tar.gz `path` into the folder `dest`, streaming and hashing its bytes (see verified_reader).

    Each member is checked (check_tar_member) before anything of it is written; only regular files and folders
    are made, with fedskew's own permissions (no owner, mode or time is taken from the archive)."""
    root = Path(dest).resolve()
    with verified_reader(path, sha256) as reader, tarfile.open(fileobj=reader, mode="r|gz") as tar:
        for member in tar:
            check_tar_member(path, member)
            target = root.joinpath(*PurePosixPath(member.name).parts)
            if not target.resolve().is_relative_to(root):  # a name this platform reads otherwise
                raise _refused(path, member.name, "would be written outside the target folder")
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as data, open(target, "wb") as out:
                shutil.copyfileobj(data, out, BLOCK)
