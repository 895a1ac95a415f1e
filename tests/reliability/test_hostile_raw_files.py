"""Raw dataset files that are not what they were when they verified, and archives that try to write outside
their folder (fedskew.data.fetch, fedskew.data.fetch.reading).

* A marker (VERIFIED.json) is a cache of a verification, never a substitute for it: a same-size copy of a
  file with its labels swapped is refused at the next prepare, named, and kept; a valid tensor cache beside
  it is not used.
* A decode re-hashes what it reads: a file swapped between the check and the decode is refused.
* Archives are unpacked member by member: a member outside the folder, a link, a device or a fifo is refused
  before anything of it is written, and nothing lands outside the scratch folder.

Fakes in the real formats (tests/fixtures), hand-placed or served from a loopback HTTP server.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import stat
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures"))

import fake_datasets as fakes  # noqa: E402
from fake_archives import install_fake, make_fake  # noqa: E402

from fedskew.data import registry, tensors  # noqa: E402
from fedskew.data.datasets import (  # noqa: E402
    adult,
    cinic10,
    femnist,
    imagenet_subset,
    tinyimagenet,
    torchvision_family,
)
from fedskew.data.fetch import MARKER, DatasetCorruptError, Reach, verify  # noqa: E402
from fedskew.data.tensors import CACHE, CACHE_META  # noqa: E402

try:
    import scipy.io  # noqa: F401

    HAVE_SCIPY = True
except ImportError:
    HAVE_SCIPY = False

LABELS = "train-labels-idx1-ubyte.gz"


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below root (relative path -> bytes): what a test compares before and after."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".decode-" in p.name or ".partial-" in p.name
                  or ".tmp-" in p.name)


def swapped_labels(archive: bytes, level: int = 9, mtime: int = 0) -> bytes:
    """The IDX label archive with two different labels swapped, gzipped as `level`/`mtime` say, of the same size
    as `archive` (the first swap whose compressed size matches)."""
    content = gzip.decompress(archive)
    labels = content[8:]  # after the IDX magic and the count
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            if labels[i] == labels[j]:
                continue
            changed = bytearray(content)
            changed[8 + i], changed[8 + j] = labels[j], labels[i]
            out = gzip.compress(bytes(changed), compresslevel=level, mtime=mtime)
            if len(out) == len(archive):
                return out
    pytest.fail("no label swap keeps the archive's size")


def two_bytes_swapped(archive: bytes) -> bytes:
    """The archive with two different bytes of its deflate stream exchanged in place (not recompressed)."""
    data = bytearray(archive)
    middle = len(data) // 2
    other = next(k for k in range(middle + 1, len(data)) if data[k] != data[middle])
    data[middle], data[other] = data[other], data[middle]
    return bytes(data)


def repackaged(fake, monkeypatch) -> dict[str, bytes]:
    """The fake's IDX archives recompressed as an OS package ships them, with their contents' md5s pinned: they
    verify by payload md5, the verification a marker may spare."""
    monkeypatch.setitem(torchvision_family.PAYLOAD_MD5, "mnist",
                        {fn: md5_of(gzip.decompress(body)) for fn, body in fake.files.items()})
    return {fn: gzip.compress(gzip.decompress(body), compresslevel=1, mtime=1_600_000_000)
            for fn, body in fake.files.items()}


def place(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (folder / name).write_bytes(body)


# --- a marker never vouches for bytes it did not see ------------------------------------------

TAMPERINGS = {
    # verified by its own md5; labels swapped and recompressed exactly as the original was gzipped
    "original-recompressed": (False, lambda body: swapped_labels(body)),
    # verified by its content's md5 (the marker would spare the decompression); labels swapped, recompressed alike
    "repackaged-recompressed": (True, lambda body: swapped_labels(body, level=1, mtime=1_600_000_000)),
    # two bytes of the compressed stream exchanged in place
    "original-edited-in-place": (False, two_bytes_swapped),
}


@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_a_same_size_tampered_file_beside_its_marker_is_refused_named_and_kept(tampering, server, monkeypatch,
                                                                              tmp_path):
    by_payload, tamper = TAMPERINGS[tampering]
    fake = install_fake("mnist", server, monkeypatch)
    folder = tmp_path / "data" / "raw" / "mnist"
    place(folder, repackaged(fake, monkeypatch) if by_payload else fake.files)
    registry.prepare("mnist", {"source": "mnist"}, tmp_path, reach=Reach.LOCAL)
    marker = (folder / MARKER).read_bytes()
    assert {e["verified_by"] for e in json.loads(marker)["files"].values()} == \
        {"payload-md5" if by_payload else "archive-md5"}
    labels = folder / LABELS
    tampered = tamper(labels.read_bytes())
    assert len(tampered) == labels.stat().st_size and tampered != labels.read_bytes()
    labels.write_bytes(tampered)

    with pytest.raises(DatasetCorruptError) as info:
        registry.prepare("mnist", {"source": "mnist"}, tmp_path, reach=Reach.LOCAL)
    message = str(info.value)
    assert str(labels.resolve()) in message and md5_of(tampered) in message and md5_of(fake.files[LABELS]) in message
    assert "Delete" in message and "\n" not in message
    assert labels.read_bytes() == tampered  # the user's file is never deleted
    assert (folder / MARKER).read_bytes() == marker  # nor the record of what verified
    assert server.requests == []
    with pytest.raises(DatasetCorruptError, match=LABELS):  # the decoder's own entry point refuses it too
        torchvision_family.load_tensors("mnist", tmp_path / "data" / "raw", reach=Reach.LOCAL)


def test_a_same_size_tampered_adult_file_beside_its_marker_is_refused(monkeypatch, tmp_path):
    files = fakes.fake_adult()
    monkeypatch.setattr(adult, "ADULT_BASE_URL", "http://127.0.0.1:9/closed/")
    monkeypatch.setattr(adult, "ADULT_MD5", {name: md5_of(body) for name, body in files.items()})
    place(tmp_path / "adult", files)
    adult.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    path = tmp_path / "adult" / "adult.data"
    tampered = files["adult.data"].replace(b"<=50K", b">50KX", 1)  # one income flipped, same size
    assert len(tampered) == len(files["adult.data"])
    path.write_bytes(tampered)
    with pytest.raises(DatasetCorruptError) as info:
        adult.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert str(path.resolve()) in str(info.value) and md5_of(tampered) in str(info.value)
    assert path.read_bytes() == tampered


def test_a_valid_tensor_cache_beside_a_tampered_file_is_not_used(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    folder = tmp_path / "data" / "raw" / "mnist"
    place(folder, fake.files)
    registry.prepare("mnist", {"source": "mnist"}, tmp_path, reach=Reach.LOCAL)
    cache = files_under(folder)
    loaded = []
    real_load = tensors.load_cache
    monkeypatch.setattr(tensors, "load_cache", lambda *a: loaded.append(a) or real_load(*a))
    (folder / LABELS).write_bytes(swapped_labels(fake.files[LABELS]))

    with pytest.raises(DatasetCorruptError, match=LABELS):
        registry.prepare("mnist", {"source": "mnist"}, tmp_path, reach=Reach.LOCAL)
    assert loaded == []  # refused before the cache was even looked at
    assert {k: v for k, v in files_under(folder).items() if k != LABELS} == \
        {k: v for k, v in cache.items() if k != LABELS}  # cache, sidecar and marker untouched


def test_a_changed_file_that_still_verifies_rebuilds_the_cache(server, monkeypatch, tmp_path):
    """The cache is keyed by the digests of the bytes on disk now: a repackaged copy of the same content (other
    bytes, verified by its content) does not reuse a cache built from the original bytes."""
    fake = install_fake("mnist", server, monkeypatch)
    root = tmp_path / "raw"
    place(root / "mnist", fake.files)
    first = torchvision_family.load_tensors("mnist", root, reach=Reach.LOCAL)
    place(root / "mnist", repackaged(fake, monkeypatch))
    decoded, real_decode = [], torchvision_family._decode
    monkeypatch.setattr(torchvision_family, "_decode", lambda *a: decoded.append(a) or real_decode(*a))
    again = torchvision_family.load_tensors("mnist", root, reach=Reach.LOCAL)
    assert len(decoded) == 1  # rebuilt, from the new bytes
    assert torch.equal(again.x_train, first.x_train) and torch.equal(again.y_train, first.y_train)
    key = json.loads((root / "mnist" / CACHE_META).read_text())["key"]["sha256"]
    assert key == {fn: hashlib.sha256((root / "mnist" / fn).read_bytes()).hexdigest() for fn in fake.files}


def test_a_structure_verified_file_that_changed_is_checked_again(server, monkeypatch, tmp_path):
    """Without a pinned md5 the structure check is what the marker may spare, and only for the same bytes."""
    first, _ = fakes.fake_cinic10(seed=0)
    second, expected = fakes.fake_cinic10(seed=1)
    monkeypatch.setattr(cinic10, "CINIC10_MD5", None)
    place(tmp_path / "cinic10", {cinic10.ARCHIVE: first})
    cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    checked, real_check = [], cinic10.check_structure
    monkeypatch.setattr(cinic10, "check_structure", lambda path: checked.append(path) or real_check(path))
    cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert checked == []  # the same bytes: the marker spares the check it recorded
    place(tmp_path / "cinic10", {cinic10.ARCHIVE: second})
    _, decoded = cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert len(checked) == 1 and np.array_equal(decoded["y_train"].numpy(), expected.y_train)
    assert np.array_equal(decoded["x_train"].numpy(), expected.x_train)
    entry = json.loads((tmp_path / "cinic10" / MARKER).read_text())["files"][cinic10.ARCHIVE]
    assert entry["sha256"] == hashlib.sha256(second).hexdigest() and entry["source"]["kind"] == "hand-placed"


def test_every_file_is_hashed_at_every_prepare(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    root = tmp_path / "raw"
    torchvision_family.load_tensors("mnist", root)
    hashed, real_digests = [], verify.file_digests
    monkeypatch.setattr(verify, "file_digests", lambda path: hashed.append(path.name) or real_digests(path))
    torchvision_family.load_tensors("mnist", root)
    assert sorted(hashed) == sorted(fake.files)


# --- a file swapped between the check and the decode ------------------------------------------

def swap_after_check(module, monkeypatch, path: Path, body: bytes) -> None:
    """Make `module`'s ensure_files verify the files, then replace `path` with `body` before the decode."""
    real = module.ensure_files

    def ensure_then_swap(*args, **kwargs):
        entries = real(*args, **kwargs)
        path.write_bytes(body)
        return entries

    monkeypatch.setattr(module, "ensure_files", ensure_then_swap)


def assert_refused_as_changed(info, path: Path, body: bytes) -> None:
    message = str(info.value)
    assert str(path.resolve()) in message and "changed after it was verified" in message
    assert hashlib.sha256(body).hexdigest() in message and "\n" not in message
    assert path.read_bytes() == body  # kept
    assert not (path.parent / CACHE).exists()  # nothing decoded from it was cached


@pytest.mark.parametrize("name", ["mnist", "cifar10", pytest.param("svhn", marks=pytest.mark.skipif(
    not HAVE_SCIPY, reason="SVHN's .mat files need scipy"))])
def test_a_torchvision_archive_swapped_after_its_check_is_refused_by_the_decode(name, server, monkeypatch,
                                                                                tmp_path):
    fake = install_fake(name, server, monkeypatch)
    place(tmp_path / name, fake.files)
    filename = LABELS if name == "mnist" else sorted(fake.files)[0]
    path = tmp_path / name / filename
    # A valid archive of the same format: only the re-hash at the decode can tell it from the verified one.
    body = swapped_labels(fake.files[LABELS]) if name == "mnist" else make_fake(name, server.url, seed=1).files[filename]
    swap_after_check(torchvision_family, monkeypatch, path, body)
    with pytest.raises(DatasetCorruptError) as info:
        torchvision_family.load_tensors(name, tmp_path, reach=Reach.LOCAL)
    assert_refused_as_changed(info, path, body)
    assert temporaries(tmp_path) == []


def test_cinic10_swapped_after_its_check_is_refused_by_the_decode(monkeypatch, tmp_path):
    first, _ = fakes.fake_cinic10(seed=0)
    second, _ = fakes.fake_cinic10(seed=1)
    monkeypatch.setattr(cinic10, "CINIC10_MD5", md5_of(first))
    place(tmp_path / "cinic10", {cinic10.ARCHIVE: first})
    path = tmp_path / "cinic10" / cinic10.ARCHIVE
    swap_after_check(cinic10, monkeypatch, path, second)
    with pytest.raises(DatasetCorruptError) as info:
        cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert_refused_as_changed(info, path, second)


@pytest.fixture(scope="module")
def tiny_zip() -> bytes:
    return fakes.fake_tinyimagenet()[0]


def test_tinyimagenet_swapped_after_its_check_is_refused_by_the_decode(tiny_zip, monkeypatch, tmp_path):
    monkeypatch.setattr(tinyimagenet, "TINYIMAGENET_MD5", md5_of(tiny_zip))
    place(tmp_path / "tinyimagenet", {tinyimagenet.ARCHIVE: tiny_zip})
    path = tmp_path / "tinyimagenet" / tinyimagenet.ARCHIVE
    body = tiny_zip + b"\0"  # other bytes
    swap_after_check(tinyimagenet, monkeypatch, path, body)
    with pytest.raises(DatasetCorruptError) as info:
        tinyimagenet.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert_refused_as_changed(info, path, body)
    assert temporaries(tmp_path) == []


def test_adult_swapped_after_its_check_is_refused_by_the_preprocessing(monkeypatch, tmp_path):
    files = fakes.fake_adult()
    monkeypatch.setattr(adult, "ADULT_MD5", {name: md5_of(body) for name, body in files.items()})
    place(tmp_path / "adult", files)
    path = tmp_path / "adult" / "adult.test"
    body = files["adult.test"].replace(b">50K.", b"<=50K.", 1)
    swap_after_check(adult, monkeypatch, path, body)
    with pytest.raises(DatasetCorruptError) as info:
        adult.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert_refused_as_changed(info, path, body)


def test_a_leaf_file_swapped_after_it_was_hashed_is_refused_by_the_decode(monkeypatch, tmp_path):
    fakes.write_fake_leaf(tmp_path / "femnist")
    path = sorted((tmp_path / "femnist" / "train").glob("*.json"))[0]
    content = json.loads(path.read_text())
    content["user_data"][content["users"][0]]["y"][0] = (content["user_data"][content["users"][0]]["y"][0] + 1) % 62
    body = json.dumps(content).encode()
    real = femnist.tree_digests
    monkeypatch.setattr(femnist, "tree_digests", lambda *a: (real(*a), path.write_bytes(body))[0])
    with pytest.raises(DatasetCorruptError) as info:
        femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    message = str(info.value)
    assert str(path.resolve()) in message and "changed after it was verified" in message
    assert not (tmp_path / "femnist" / CACHE).exists()


def test_a_leaf_file_rewritten_with_the_same_size_and_mtime_rebuilds_the_cache(tmp_path):
    import os

    fakes.write_fake_leaf(tmp_path / "femnist")
    _, first = femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    path = sorted((tmp_path / "femnist" / "train").glob("*.json"))[0]
    before = path.stat()
    text = path.read_text()
    index = text.index('"y": [') + len('"y": [')
    digit = text[index]
    path.write_text(text[:index] + ("1" if digit != "1" else "2") + text[index + 1:])  # one label, same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    _, again = femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    assert not torch.equal(again["y_train"], first["y_train"])  # the changed input was seen, the cache rebuilt


def test_an_image_swapped_after_it_was_hashed_is_refused_by_the_decode(monkeypatch, tmp_path):
    written = fakes.write_fake_imagenet(tmp_path / "imagenet", imagenet_subset.WNIDS)
    wnid = imagenet_subset.WNIDS[0]
    path = tmp_path / "imagenet" / "train" / wnid / next(iter(written["train"])).split("/")[1]
    body = fakes.png(np.zeros((64, 64, 3), dtype=np.uint8))
    real = imagenet_subset.tree_digests
    monkeypatch.setattr(imagenet_subset, "tree_digests", lambda *a: (real(*a), path.write_bytes(body))[0])
    with pytest.raises(DatasetCorruptError) as info:
        imagenet_subset.load_tensors({"imagenet_dir": str(tmp_path / "imagenet")}, tmp_path)
    assert str(path.resolve()) in str(info.value) and "changed after it was verified" in str(info.value)


# --- archives that reach outside their folder -------------------------------------------------

def hostile_tar(archive: bytes, hostile: tarfile.TarInfo, body: bytes = b"", then: tarfile.TarInfo | None = None
                ) -> bytes:
    """The tar.gz `archive` with `hostile` (and `then`, a file written through it) among its members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as source, \
            tarfile.open(fileobj=out, mode="w:gz") as tar:
        members = source.getmembers()
        for k, member in enumerate(members):
            if k == len(members) // 2:  # halfway: some members are already unpacked when it comes
                tar.addfile(hostile, io.BytesIO(body) if hostile.isfile() else None)
                if then is not None:
                    tar.addfile(then, io.BytesIO(b"planted"))
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3  # /dev/null
    return info


def hostile_members(tmp_path: Path) -> dict[str, tuple[tarfile.TarInfo, tarfile.TarInfo | None, str]]:
    """id -> (the hostile member, a member written through it, what the error says), aimed at tmp_path's folders:
    the archive lies in tmp_path/raw/cifar10/, the decode's scratch folder is tmp_path/raw/.cifar10.decode-*/."""
    outside, victim = tmp_path / "outside", tmp_path / "victim.txt"
    unique = f"escaped-{tmp_path.name}"
    return {
        "parent": (tar_member("../escaped.txt", size=7), None, "'..'"),
        "far-parent": (tar_member(f"cifar-10-batches-py/../../../../{unique}", size=7), None, "'..'"),
        "absolute": (tar_member(str(outside / "absolute.txt"), size=7), None, "absolute"),
        "symlink": (tar_member("cifar-10-batches-py/escape", tarfile.SYMTYPE, str(outside)),
                    tar_member("cifar-10-batches-py/escape/planted.txt", size=7), "symbolic link"),
        "hard-link": (tar_member("cifar-10-batches-py/victim", tarfile.LNKTYPE, str(victim)), None, "hard link"),
        "device": (tar_member("cifar-10-batches-py/null", tarfile.CHRTYPE), None, "device"),
        "fifo": (tar_member("cifar-10-batches-py/pipe", tarfile.FIFOTYPE), None, "fifo"),
    }


@pytest.mark.parametrize("kind", ["parent", "far-parent", "absolute", "symlink", "hard-link", "device", "fifo"])
def test_a_cifar_archive_with_a_member_outside_its_folder_is_refused_and_writes_nothing(kind, server, monkeypatch,
                                                                                       tmp_path):
    fake = install_fake("cifar10", server, monkeypatch)
    hostile, then, says = hostile_members(tmp_path)[kind]
    data = hostile_tar(fake.files["cifar-10-python.tar.gz"], hostile, b"escaped" if hostile.isfile() else b"", then)
    monkeypatch.setattr(torchvision_family.TORCHVISION_DATASETS["cifar10"].cls, "tgz_md5", md5_of(data))
    (tmp_path / "outside").mkdir()
    (tmp_path / "victim.txt").write_text("precious")
    root = tmp_path / "raw"
    place(root / "cifar10", {"cifar-10-python.tar.gz": data})
    torchvision_family.ensure_archives("cifar10", root, reach=Reach.LOCAL)  # it verifies: its md5 is the pinned one
    before, beside = files_under(tmp_path), sorted(p.name for p in tmp_path.parent.iterdir())

    with pytest.raises(DatasetCorruptError) as info:
        torchvision_family.load_tensors("cifar10", root, reach=Reach.LOCAL)
    message = str(info.value)
    assert "cifar-10-python.tar.gz" in message and repr(hostile.name) in message and says in message
    assert "\n" not in message
    assert files_under(tmp_path) == before  # nothing written anywhere below, scratch folder gone
    assert sorted(p.name for p in tmp_path.parent.iterdir()) == beside  # nor beside it
    assert list((tmp_path / "outside").iterdir()) == [] and (tmp_path / "victim.txt").stat().st_nlink == 1
    assert temporaries(tmp_path) == [] and not (root / "cifar10" / CACHE).exists()
    assert (root / "cifar10" / "cifar-10-python.tar.gz").read_bytes() == data  # reported, not deleted


@pytest.mark.parametrize("pinned", [True, False], ids=["md5-pinned", "structure-checked"])
@pytest.mark.parametrize("hostile", [
    tar_member("../train/airplane/evil.png", size=7),  # once counted as a training image of the airplane class
    tar_member("/train/airplane/evil.png", size=7),
    tar_member("train/airplane/evil.png", tarfile.SYMTYPE, "/etc/passwd"),
    tar_member("train/airplane/evil.png", tarfile.LNKTYPE, "train/airplane/cifar10-train-0.png"),
], ids=["parent", "absolute", "symlink", "hard-link"])
def test_a_cinic10_tarball_with_a_hostile_member_is_refused(pinned, hostile, monkeypatch, tmp_path):
    data = hostile_tar(fakes.fake_cinic10()[0], hostile, b"escaped")
    monkeypatch.setattr(cinic10, "CINIC10_MD5", md5_of(data) if pinned else None)
    place(tmp_path / "cinic10", {cinic10.ARCHIVE: data})
    with pytest.raises(DatasetCorruptError) as info:
        cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert cinic10.ARCHIVE in str(info.value) and repr(hostile.name) in str(info.value)
    assert not (tmp_path / "cinic10" / CACHE).exists() and (tmp_path / "cinic10" / cinic10.ARCHIVE).read_bytes() == data


def hostile_zip(archive: bytes, name: str, mode: int = stat.S_IFREG | 0o644, body: bytes = b"escaped") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as zf:
        for info in source.infolist():
            zf.writestr(info, source.read(info))
        extra = zipfile.ZipInfo(name)
        extra.create_system, extra.external_attr = 3, mode << 16  # a Unix mode, as zip records it
        zf.writestr(extra, body)
    return out.getvalue()


@pytest.mark.parametrize("name,mode,says", [
    ("tiny-imagenet-200/../../escaped.txt", stat.S_IFREG | 0o644, "'..'"),
    ("/tiny-imagenet-200/escaped.txt", stat.S_IFREG | 0o644, "absolute"),
    ("tiny-imagenet-200/train/link", stat.S_IFLNK | 0o777, "symbolic link"),
    ("tiny-imagenet-200/pipe", stat.S_IFIFO | 0o644, "fifo"),
], ids=["parent", "absolute", "symlink", "fifo"])
def test_a_tinyimagenet_zip_with_a_hostile_member_is_refused(name, mode, says, tiny_zip, monkeypatch, tmp_path):
    data = hostile_zip(tiny_zip, name, mode, b"/etc" if stat.S_ISLNK(mode) else b"escaped")
    monkeypatch.setattr(tinyimagenet, "TINYIMAGENET_MD5", md5_of(data))
    place(tmp_path / "tinyimagenet", {tinyimagenet.ARCHIVE: data})
    with pytest.raises(DatasetCorruptError) as info:
        tinyimagenet.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    assert tinyimagenet.ARCHIVE in str(info.value) and repr(name) in str(info.value) and says in str(info.value)
    assert not (tmp_path / "tinyimagenet" / CACHE).exists() and temporaries(tmp_path) == []
