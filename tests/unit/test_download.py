"""fedskew.data.datasets.torchvision_family (through fedskew.data.fetch) against fake archives in the real formats,
served from a loopback HTTP server.

Every test runs the real download -> verify -> decode path; only the torchvision class attributes
(URLs and md5s) are pointed at 127.0.0.1. Expected tensors come from the generated arrays.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from fake_archives import FakeDataset, LoopbackServer, install_fake  # noqa: E402

from fedskew.data import registry  # noqa: E402
from fedskew.data.datasets import torchvision_family  # noqa: E402
from fedskew.data.datasets.torchvision_family import (  # noqa: E402
    TORCHVISION_DATASETS,
    DatasetCorruptError,
    DatasetUnavailableError,
    RawTensors,
    ensure_archives,
    load_tensors,
    raw_dir,
)
from fedskew.data.fetch import MARKER, Reach, network  # noqa: E402
from fedskew.data.files import file_sha256  # noqa: E402
from fedskew.data.tensors import CACHE, CACHE_META  # noqa: E402

try:
    import scipy.io  # noqa: F401

    HAVE_SCIPY = True
except ImportError:
    HAVE_SCIPY = False

ALL = [
    "mnist", "fashionmnist", "cifar10", "cifar100",
    pytest.param("svhn", marks=pytest.mark.skipif(not HAVE_SCIPY, reason="SVHN's .mat files need scipy")),
]
SHAPES = {"mnist": (1, 28, 28), "fashionmnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32),
          "svhn": (3, 32, 32)}


@pytest.fixture
def server():
    srv = LoopbackServer()
    yield srv
    srv.close()


def leftovers(root: Path) -> list[str]:
    """Temporary files or folders fedskew left anywhere under root."""
    return sorted(p.name for p in root.rglob("*") if ".partial-" in p.name or ".decode-" in p.name
                  or ".tmp-" in p.name)


def assert_matches(tensors: RawTensors, fake: FakeDataset, name: str) -> None:
    for split in ("train", "test"):
        x, y = getattr(tensors, f"x_{split}"), getattr(tensors, f"y_{split}")
        assert x.dtype == torch.uint8 and y.dtype == torch.int64
        assert tuple(x.shape) == (len(getattr(fake, f"y_{split}")), *SHAPES[name])
        assert torch.equal(x, torch.from_numpy(getattr(fake, f"x_{split}")))
        assert torch.equal(y, torch.from_numpy(getattr(fake, f"y_{split}")))
    assert tensors.num_classes == fake.num_classes == TORCHVISION_DATASETS[name].num_classes


@pytest.mark.parametrize("name", ALL)
def test_downloads_verifies_and_decodes_from_loopback(name, server, monkeypatch, tmp_path):
    fake = install_fake(name, server, monkeypatch)
    tensors = load_tensors(name, tmp_path)
    assert_matches(tensors, fake, name)
    folder = raw_dir(name, tmp_path)
    assert folder == tmp_path / name
    assert sorted(server.requests) == sorted(f"/{name}/{fn}" for fn in fake.files)  # one GET per archive
    for filename, body in fake.files.items():  # the original archives, byte for byte
        assert (folder / filename).read_bytes() == body
    marker = json.loads((folder / MARKER).read_text())
    assert {fn: entry["md5"] for fn, entry in marker["files"].items()} == {
        fn: md5_of((folder / fn).read_bytes()) for fn in fake.files}
    assert (folder / CACHE).is_file() and (folder / CACHE_META).is_file()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_second_call_uses_cache_without_network(name, server, monkeypatch, tmp_path):
    fake = install_fake(name, server, monkeypatch)
    load_tensors(name, tmp_path)
    server.requests.clear()
    decoded = []
    monkeypatch.setattr(torchvision_family, "_decode", lambda *a: decoded.append(a))  # must not be needed
    assert_matches(load_tensors(name, tmp_path), fake, name)
    assert server.requests == [] and decoded == []


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_corrupt_download_raises_and_leaves_nothing_trusted(name, server, monkeypatch, tmp_path):
    fake = install_fake(name, server, monkeypatch)
    last = sorted(fake.files)[-1]  # for MNIST, earlier files were already fetched when this one fails
    good = server.files[f"/{name}/{last}"]
    server.files[f"/{name}/{last}"] = good[:-1] + bytes([good[-1] ^ 0xFF])
    with pytest.raises(DatasetCorruptError) as info:
        ensure_archives(name, tmp_path)
    message = str(info.value)
    assert last in message and md5_of(fake.files[last]) in message  # the expected md5
    assert md5_of(server.files[f"/{name}/{last}"]) in message  # the actual md5
    folder = raw_dir(name, tmp_path)
    assert not (folder / MARKER).exists()
    assert not folder.exists() or list(folder.iterdir()) == []
    assert leftovers(tmp_path) == []
    with pytest.raises(DatasetUnavailableError):  # nothing on disk is trusted for an offline run
        ensure_archives(name, tmp_path, reach=Reach.LOCAL)
    server.files[f"/{name}/{last}"] = good  # the mirror recovers: a retry succeeds
    assert_matches(load_tensors(name, tmp_path), fake, name)


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_unreachable_server_raises_unavailable_with_instructions(name, server, monkeypatch, tmp_path):
    dead = LoopbackServer()
    dead.close()  # its 127.0.0.1 port is closed now: connections are refused
    fake = install_fake(name, dead, monkeypatch)
    monkeypatch.setattr(network, "DOWNLOAD_TIMEOUT_S", 5.0)
    with pytest.raises(DatasetUnavailableError) as info:
        ensure_archives(name, tmp_path)
    message = str(info.value)
    assert "download" in message and "failed" in message and "refused" in message.lower()
    assert str(raw_dir(name, tmp_path).resolve()) in message
    for filename in fake.files:
        assert filename in message and md5_of(fake.files[filename]) in message
    assert not (raw_dir(name, tmp_path) / MARKER).exists()
    assert leftovers(tmp_path) == []


def test_http_error_is_reported_as_unavailable(server, monkeypatch, tmp_path):
    install_fake("cifar10", server, monkeypatch)
    server.files.clear()  # every request now gets 404
    with pytest.raises(DatasetUnavailableError, match="HTTP 404"):
        ensure_archives("cifar10", tmp_path)
    assert leftovers(tmp_path) == [] and not (tmp_path / "cifar10" / MARKER).exists()


def test_truncated_response_is_unavailable_not_corrupt(server, monkeypatch, tmp_path):
    install_fake("cifar10", server, monkeypatch)
    server.truncated.add("/cifar10/cifar-10-python.tar.gz")
    with pytest.raises(DatasetUnavailableError, match="IncompleteRead"):
        ensure_archives("cifar10", tmp_path)
    assert leftovers(tmp_path) == []


def test_blackholed_server_times_out(monkeypatch, tmp_path, server):
    install_fake("cifar10", server, monkeypatch)
    with socket.socket() as silent:  # accepts connections (kernel backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/cifar-10-python.tar.gz"
        monkeypatch.setattr(TORCHVISION_DATASETS["cifar10"].cls, "url", url)
        monkeypatch.setattr(network, "DOWNLOAD_TIMEOUT_S", 0.5)
        start = time.monotonic()
        with pytest.raises(DatasetUnavailableError, match="timed out"):
            ensure_archives("cifar10", tmp_path)
        assert time.monotonic() - start < 5
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ALL)
def test_hand_placed_archives_load_offline(name, server, monkeypatch, tmp_path):
    fake = install_fake(name, server, monkeypatch)
    folder = tmp_path / name
    folder.mkdir()
    for filename, body in fake.files.items():
        (folder / filename).write_bytes(body)
    assert_matches(load_tensors(name, tmp_path, reach=Reach.LOCAL), fake, name)
    assert server.requests == []
    assert (folder / MARKER).is_file()


def test_partially_hand_placed_downloads_only_the_rest(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "train-images-idx3-ubyte.gz").write_bytes(fake.files["train-images-idx3-ubyte.gz"])
    assert_matches(load_tensors("mnist", tmp_path), fake, "mnist")
    assert "/mnist/train-images-idx3-ubyte.gz" not in server.requests and len(server.requests) == 3


def test_missing_files_without_download_lists_expected_files(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    with pytest.raises(DatasetUnavailableError) as info:
        load_tensors("mnist", tmp_path, reach=Reach.LOCAL)
    message = str(info.value)
    assert "downloads are off (--no-download; Reach.LOCAL)" in message and str((tmp_path / "mnist").resolve()) in message
    for filename in fake.files:
        assert filename in message and md5_of(fake.files[filename]) in message
    assert server.requests == []


def test_corrupt_hand_placed_file_is_reported_and_kept(server, monkeypatch, tmp_path):
    fake = install_fake("cifar100", server, monkeypatch)
    folder = tmp_path / "cifar100"
    folder.mkdir()
    bad = folder / "cifar-100-python.tar.gz"
    bad.write_bytes(b"not the archive")
    with pytest.raises(DatasetCorruptError) as info:
        ensure_archives("cifar100", tmp_path)
    message = str(info.value)
    assert str(bad.resolve()) in message and md5_of(fake.files[bad.name]) in message
    assert md5_of(b"not the archive") in message
    assert bad.read_bytes() == b"not the archive" and server.requests == []


def test_archive_deleted_after_verification_is_not_trusted(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    ensure_archives("mnist", tmp_path)
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetUnavailableError, match="t10k-labels-idx1-ubyte.gz"):
        ensure_archives("mnist", tmp_path, reach=Reach.LOCAL)
    server.requests.clear()
    ensure_archives("mnist", tmp_path)
    assert server.requests == ["/mnist/t10k-labels-idx1-ubyte.gz"]
    assert (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes() == fake.files["t10k-labels-idx1-ubyte.gz"]


def tamper_same_shapes(path: Path) -> None:
    data = torch.load(path, weights_only=True)
    data["y_train"] = (data["y_train"] + 1) % 10  # plausible, well-formed, wrong
    torch.save(data, path)


@pytest.mark.parametrize("tamper", [
    pytest.param(tamper_same_shapes, id="relabelled"),
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[:100]), id="truncated"),
    pytest.param(lambda p: (p.parent / CACHE_META).unlink(), id="sidecar-missing"),
    pytest.param(lambda p: p.unlink(), id="cache-missing"),
])
def test_tampered_cache_is_rebuilt_not_trusted(tamper, server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    load_tensors("mnist", tmp_path)
    cache = tmp_path / "mnist" / CACHE
    tamper(cache)
    server.requests.clear()
    assert_matches(load_tensors("mnist", tmp_path), fake, "mnist")
    assert server.requests == []  # rebuilt from the verified archives, not re-downloaded
    meta = json.loads((tmp_path / "mnist" / CACHE_META).read_text())
    assert meta["sha256"] == file_sha256(cache)


def test_cache_with_consistent_but_wrong_sidecar_is_rebuilt(server, monkeypatch, tmp_path):
    """Someone rewrote tensors.pt and its sha256 but with malformed data: shapes/labels are checked too."""
    fake = install_fake("mnist", server, monkeypatch)
    load_tensors("mnist", tmp_path)
    cache, sidecar = tmp_path / "mnist" / CACHE, tmp_path / "mnist" / CACHE_META
    data = torch.load(cache, weights_only=True)
    data["y_test"] = data["y_test"] + 50  # labels out of range
    torch.save(data, cache)
    meta = json.loads(sidecar.read_text())
    meta["sha256"] = file_sha256(cache)
    sidecar.write_text(json.dumps(meta))
    assert_matches(load_tensors("mnist", tmp_path), fake, "mnist")


def test_stale_temporaries_of_dead_runs_are_removed(server, monkeypatch, tmp_path):
    install_fake("mnist", server, monkeypatch)
    dead_pid = 2**22 + 1  # above Linux's pid_max limit: no such process can exist
    stale = tmp_path / f".mnist.partial-x1y2-{dead_pid}"
    stale.mkdir()
    half_cache = tmp_path / "mnist" / f".{CACHE}.tmp-{dead_pid}"
    half_cache.parent.mkdir()
    half_cache.write_bytes(b"half a cache")
    (stale / "train-images-idx3-ubyte.gz").write_bytes(b"half a download")
    alive = tmp_path / f".mnist.partial-{os.getppid()}"  # a concurrent live run: keep
    alive.mkdir()
    other = tmp_path / f".cifar10.partial-{dead_pid}"  # another dataset's: not ours to touch now
    other.mkdir()
    load_tensors("mnist", tmp_path)
    assert not stale.exists() and not half_cache.exists()
    assert alive.exists() and other.exists()


def test_unknown_dataset_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="cifar10"):
        raw_dir("imagenet", tmp_path)


def test_archive_changed_after_verification_is_not_trusted(server, monkeypatch, tmp_path):
    install_fake("cifar10", server, monkeypatch)
    ensure_archives("cifar10", tmp_path)
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"appended later")
    with pytest.raises(DatasetCorruptError, match="cifar-10-python.tar.gz"):
        ensure_archives("cifar10", tmp_path, reach=Reach.LOCAL)


def test_mnist_falls_back_to_the_next_mirror(server, monkeypatch, tmp_path):
    fake = install_fake("mnist", server, monkeypatch)
    dead = LoopbackServer()
    dead.close()
    monkeypatch.setattr(TORCHVISION_DATASETS["mnist"].cls, "mirrors", [f"{dead.url}/", f"{server.url}/mnist/"])
    assert_matches(load_tensors("mnist", tmp_path), fake, "mnist")
    assert len(server.requests) == len(fake.files)


def test_a_reach_that_is_not_a_reach_is_refused_in_one_line_before_any_file_is_touched(tmp_path):
    """`reach` says where files may come from; a bool (what `download` used to be) is refused, not guessed at."""
    for call in (lambda: load_tensors("mnist", tmp_path, reach=False),
                 lambda: registry.prepare("mnist", {"source": "mnist"}, tmp_path, reach=True)):
        with pytest.raises(TypeError, match=r"^reach must be Reach\.LOCAL or Reach\.NETWORK \(.*\), got (False|True)$"):
            call()
    assert list(tmp_path.iterdir()) == []
