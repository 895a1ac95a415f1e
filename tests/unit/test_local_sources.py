"""Raw files from this machine before the network: FEDSKEW_DATA_DIRS and OS package folders, and archives
recompressed elsewhere, accepted by the md5 of their decompressed content (fedskew.data.fetch, .sources).

Fake IDX archives in the real format (tests/fixtures/fake_archives.py); the torchvision class attributes
point at a loopback server, whose request log shows whether the network was asked. The payload md5s are
those of the fakes' decompressed content, pinned the way torchvision_family.PAYLOAD_MD5 pins the real ones.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from fake_archives import FakeDataset, LoopbackServer, install_fake  # noqa: E402

from fedskew.cli import main  # noqa: E402
from fedskew.data import sources  # noqa: E402
from fedskew.data.datasets import torchvision_family  # noqa: E402
from fedskew.data.datasets.torchvision_family import load_tensors  # noqa: E402
from fedskew.data.fetch import (  # noqa: E402
    MARKER,
    DatasetCorruptError,
    DatasetUnavailableError,
    Reach,
    verify,
)
from fedskew.data.files import file_sha256  # noqa: E402
from fedskew.data.tensors import CACHE  # noqa: E402
from tests.helpers import FASHION_PARAMS  # noqa: E402


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def fake_with_payloads(name: str, server: LoopbackServer, monkeypatch) -> FakeDataset:
    """A fake IDX dataset served from the loopback server, with the md5s of its decompressed files pinned."""
    fake = install_fake(name, server, monkeypatch)
    monkeypatch.setitem(torchvision_family.PAYLOAD_MD5, name,
                        {fn: md5_of(gzip.decompress(body)) for fn, body in fake.files.items()})
    return fake


def recompressed(fake: FakeDataset, level: int = 1, mtime: int = 1_600_000_000) -> dict[str, bytes]:
    """The fake's archives as a repackager would ship them: the same content, other gzip bytes."""
    files = {fn: gzip.compress(gzip.decompress(body), compresslevel=level, mtime=mtime)
             for fn, body in fake.files.items()}
    assert all(md5_of(files[fn]) != md5_of(fake.files[fn]) for fn in files)  # their archive md5s differ
    return files


def place(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for filename, body in files.items():
        (folder / filename).write_bytes(body)
    return folder


def as_os_package(monkeypatch, source: str, folder: Path) -> None:
    monkeypatch.setattr(sources, "OS_PACKAGES", {source: sources.OsPackage(f"dataset-{source}", folder)})


def marker(root: Path, name: str) -> dict:
    return json.loads((root / name / MARKER).read_text())["files"]


def assert_decodes_to(tensors, fake: FakeDataset) -> None:
    for split in ("train", "test"):
        assert torch.equal(getattr(tensors, f"x_{split}"), torch.from_numpy(getattr(fake, f"x_{split}")))
        assert torch.equal(getattr(tensors, f"y_{split}"), torch.from_numpy(getattr(fake, f"y_{split}")))


# --- verification by the decompressed content ---------------------------------------------------

def test_recompressed_archives_with_the_pinned_content_are_accepted(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("mnist", server, monkeypatch)
    files = recompressed(fake)
    place(tmp_path / "mnist", files)
    assert_decodes_to(load_tensors("mnist", tmp_path, reach=Reach.LOCAL), fake)
    assert server.requests == []
    for filename, entry in marker(tmp_path, "mnist").items():
        assert entry["verified_by"] == "payload-md5" and entry["md5"] == md5_of(files[filename])
        assert entry["payload_md5"] == entry["expected_payload_md5"] == md5_of(gzip.decompress(files[filename]))
        assert entry["source"] == {"kind": "hand-placed", "path": str((tmp_path / "mnist" / filename).resolve())}


def test_original_archives_are_still_verified_by_their_own_md5(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("mnist", server, monkeypatch)
    load_tensors("mnist", tmp_path)
    for filename, entry in marker(tmp_path, "mnist").items():
        assert entry["verified_by"] == "archive-md5" and "payload_md5" not in entry
        assert entry["source"] == {"kind": "download", "url": f"{server.url}/mnist/{filename}"}
        assert (tmp_path / "mnist" / filename).read_bytes() == fake.files[filename]


def test_recompressed_archive_with_other_content_is_refused_and_kept(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("mnist", server, monkeypatch)
    files = recompressed(fake)
    name = "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(files[name]))
    content[-1] = (content[-1] + 1) % 10  # one label changed
    files[name] = gzip.compress(bytes(content), mtime=0)
    place(tmp_path / "mnist", files)
    with pytest.raises(DatasetCorruptError) as info:
        load_tensors("mnist", tmp_path)
    message = str(info.value)
    assert name in message and "neither the original archive" in message
    assert md5_of(files[name]) in message and md5_of(fake.files[name]) in message  # archive md5: found, expected
    assert md5_of(bytes(content)) in message  # the content's md5, found
    assert torchvision_family.PAYLOAD_MD5["mnist"][name] in message  # ... and expected
    assert str((tmp_path / "mnist" / name).resolve()) in message and "Delete" in message
    assert (tmp_path / "mnist" / name).read_bytes() == files[name]  # the user's file is never deleted
    assert server.requests == [] and not (tmp_path / "mnist" / MARKER).exists()


def test_a_file_that_is_no_gzip_says_so(server, monkeypatch, tmp_path):
    fake_with_payloads("mnist", server, monkeypatch)
    place(tmp_path / "mnist", {"train-labels-idx1-ubyte.gz": b"not a gzip file at all"})
    with pytest.raises(DatasetCorruptError, match="not a readable gzip file"):
        load_tensors("mnist", tmp_path)


def test_a_payload_verified_marker_spares_the_decompression_while_the_pinned_content_md5_is_the_same(
        server, monkeypatch, tmp_path):
    fake = fake_with_payloads("mnist", server, monkeypatch)
    place(tmp_path / "mnist", recompressed(fake))
    load_tensors("mnist", tmp_path, reach=Reach.LOCAL)
    hashed, digests, gunzip_md5 = [], verify.file_digests, verify.gunzip_md5
    monkeypatch.setattr(verify, "file_digests", lambda path: hashed.append(path.name) or digests(path))
    monkeypatch.setattr(verify, "gunzip_md5", lambda path: pytest.fail(f"{path} was decompressed"))
    load_tensors("mnist", tmp_path, reach=Reach.LOCAL)
    assert sorted(hashed) == sorted(fake.files)  # every file is hashed: the marker is no substitute for that,
    # but it spares decompressing the content it vouched for, for these very bytes
    monkeypatch.setitem(torchvision_family.PAYLOAD_MD5, "mnist", {**torchvision_family.PAYLOAD_MD5["mnist"],
                                                        "t10k-labels-idx1-ubyte.gz": "0" * 32})
    monkeypatch.setattr(verify, "gunzip_md5", gunzip_md5)
    with pytest.raises(DatasetCorruptError, match="t10k-labels-idx1-ubyte.gz"):  # pinned digest changed: re-checked
        load_tensors("mnist", tmp_path, reach=Reach.LOCAL)


def test_a_marker_written_before_payload_digests_is_still_accepted_and_rewritten(server, monkeypatch, tmp_path):
    fake_with_payloads("mnist", server, monkeypatch)
    load_tensors("mnist", tmp_path)
    path = tmp_path / "mnist" / MARKER
    old = json.loads(path.read_text())
    for entry in old["files"].values():  # the shape an older fedskew wrote
        for key in ("verified_by", "source", "expected_payload_md5"):
            del entry[key]
    path.write_text(json.dumps(old))
    monkeypatch.setattr(verify, "gunzip_md5", lambda path: pytest.fail(f"{path} was decompressed"))
    load_tensors("mnist", tmp_path, reach=Reach.LOCAL)  # the files' own md5s are the pinned ones
    assert {entry["verified_by"] for entry in marker(tmp_path, "mnist").values()} == {"archive-md5"}


# --- local folders before the network -------------------------------------------------------------

@pytest.mark.parametrize("layout", ["per-source", "flat"])
def test_a_folder_named_in_the_environment_is_used_before_the_network(layout, server, monkeypatch, tmp_path):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    files = recompressed(fake)
    named = tmp_path / "datasets"
    folder = place(named / "fashionmnist" if layout == "per-source" else named, files)
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", str(named))
    root = tmp_path / "raw"
    assert_decodes_to(load_tensors("fashionmnist", root), fake)
    assert server.requests == []  # the server holds the dataset too: it was not asked
    for filename, entry in marker(root, "fashionmnist").items():
        assert (root / "fashionmnist" / filename).read_bytes() == files[filename]  # a copy in data/raw
        assert entry["source"] == {"kind": "folder", "path": str(folder / filename)}
        assert entry["verified_by"] == "payload-md5"
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == sorted(files)  # the originals stay


def test_an_os_package_folder_is_used_before_the_network(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    files = recompressed(fake)
    package = place(tmp_path / "usr-share" / "fashion-mnist", files)
    as_os_package(monkeypatch, "fashionmnist", package)
    root = tmp_path / "raw"
    assert_decodes_to(load_tensors("fashionmnist", root, reach=Reach.LOCAL), fake)
    assert server.requests == []
    for filename, entry in marker(root, "fashionmnist").items():
        assert entry["source"] == {"kind": "os-package", "path": str(package / filename),
                                   "package": "dataset-fashionmnist"}


def test_files_fetched_earlier_keep_their_recorded_origin(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    package = place(tmp_path / "package", recompressed(fake))
    as_os_package(monkeypatch, "fashionmnist", package)
    root = tmp_path / "raw"
    load_tensors("fashionmnist", root, reach=Reach.LOCAL)
    (root / "fashionmnist" / "train-labels-idx1-ubyte.gz").unlink()  # the marker no longer vouches for the set
    place(root / "fashionmnist", {"t10k-labels-idx1-ubyte.gz": fake.files["t10k-labels-idx1-ubyte.gz"]})
    load_tensors("fashionmnist", root, reach=Reach.LOCAL)
    origins = {fn: entry["source"]["kind"] for fn, entry in marker(root, "fashionmnist").items()}
    assert origins == {"train-images-idx3-ubyte.gz": "os-package", "train-labels-idx1-ubyte.gz": "os-package",
                       "t10k-images-idx3-ubyte.gz": "os-package",
                       "t10k-labels-idx1-ubyte.gz": "hand-placed"}  # other bytes than those copied


def test_sources_are_taken_in_order_raw_then_named_folders_then_os_package_then_network(server, monkeypatch,
                                                                                        tmp_path):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    # Four copies of the same content with four different archive bytes: each tells where it came from.
    first, second, flat, package = (recompressed(fake, level, mtime=1000 + level) for level in (1, 2, 3, 4))
    named_1, named_2 = tmp_path / "named1", tmp_path / "named2"
    place(named_1 / "fashionmnist", first)
    place(named_1, flat)  # named_1/<files>: after named_1/fashionmnist/
    place(named_2 / "fashionmnist", second)
    as_os_package(monkeypatch, "fashionmnist", place(tmp_path / "package", package))
    root = tmp_path / "raw"

    def fetched_from(dirs: list[Path]) -> dict[str, bytes]:
        monkeypatch.setenv("FEDSKEW_DATA_DIRS", os.pathsep.join(map(str, dirs)))
        for path in (root / "fashionmnist").glob("*"):
            path.unlink()
        assert_decodes_to(load_tensors("fashionmnist", root), fake)
        return {fn: (root / "fashionmnist" / fn).read_bytes() for fn in fake.files}

    assert fetched_from([named_1, named_2]) == first
    assert fetched_from([named_2, named_1]) == second
    for filename in first:
        (named_1 / "fashionmnist" / filename).unlink()
    assert fetched_from([named_1, named_2]) == flat
    assert fetched_from([]) == package
    assert server.requests == []
    as_os_package(monkeypatch, "fashionmnist", tmp_path / "not-installed")
    assert fetched_from([]) == fake.files  # the network comes last
    assert len(server.requests) == len(fake.files)
    # Files already in data/raw come first: a named folder is not looked at again.
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", str(named_2))
    (root / "fashionmnist" / MARKER).unlink()
    load_tensors("fashionmnist", root)
    assert {fn: (root / "fashionmnist" / fn).read_bytes() for fn in fake.files} == fake.files


def test_the_same_tensors_whichever_source_served_the_files(server, monkeypatch, tmp_path):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    load_tensors("fashionmnist", tmp_path / "downloaded")
    as_os_package(monkeypatch, "fashionmnist", place(tmp_path / "package", recompressed(fake)))
    load_tensors("fashionmnist", tmp_path / "packaged", reach=Reach.LOCAL)
    assert file_sha256(tmp_path / "downloaded" / "fashionmnist" / CACHE) == \
        file_sha256(tmp_path / "packaged" / "fashionmnist" / CACHE)


def test_a_local_file_of_another_dataset_is_skipped_for_the_network(server, monkeypatch, tmp_path):
    """MNIST and Fashion-MNIST name their files alike: a flat folder of one must not break the other."""
    fashion = fake_with_payloads("fashionmnist", server, monkeypatch)
    other = install_fake("mnist", server, monkeypatch, seed=1)
    named = place(tmp_path / "flat", other.files)
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", str(named))
    root = tmp_path / "raw"
    assert_decodes_to(load_tensors("fashionmnist", root), fashion)
    assert sorted(server.requests) == sorted(f"/fashionmnist/{fn}" for fn in fashion.files)
    assert all((named / fn).read_bytes() == body for fn, body in other.files.items())  # left as they were
    assert {entry["source"]["kind"] for entry in marker(root, "fashionmnist").values()} == {"download"}


def test_offline_with_only_refused_local_files_names_them(server, monkeypatch, tmp_path):
    fake_with_payloads("fashionmnist", server, monkeypatch)
    other = install_fake("mnist", server, monkeypatch, seed=1)
    named = place(tmp_path / "flat", other.files)
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", str(named))
    with pytest.raises(DatasetUnavailableError) as info:
        load_tensors("fashionmnist", tmp_path / "raw", reach=Reach.LOCAL)
    message = str(info.value)
    assert "Files found but refused" in message and "FEDSKEW_DATA_DIRS" in message
    for filename in other.files:
        assert f"{filename} in folder {named}" in message
    assert server.requests == [] and not (tmp_path / "raw" / "fashionmnist").exists()


def test_the_offline_error_says_how_to_provide_the_files(server, monkeypatch, tmp_path):
    fake_with_payloads("fashionmnist", server, monkeypatch)
    as_os_package(monkeypatch, "fashionmnist", tmp_path / "not-installed")
    with pytest.raises(DatasetUnavailableError) as info:
        load_tensors("fashionmnist", tmp_path, reach=Reach.LOCAL)
    message = str(info.value)
    assert "sudo apt-get install dataset-fashionmnist" in message
    assert "export FEDSKEW_DATA_DIRS=" in message and "<folder>/fashionmnist/" in message
    for filename, payload in torchvision_family.PAYLOAD_MD5["fashionmnist"].items():
        assert f"{filename}  (md5 " in message and payload in message


def test_a_complete_set_is_moved_into_place_or_nothing(server, monkeypatch, tmp_path):
    """Three files from a local folder, the fourth from a network that fails: nothing lands in data/raw."""
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    files = recompressed(fake)
    last = "t10k-labels-idx1-ubyte.gz"
    place(tmp_path / "named", {fn: body for fn, body in files.items() if fn != last})
    monkeypatch.setenv("FEDSKEW_DATA_DIRS", str(tmp_path / "named"))
    dead = LoopbackServer()
    dead.close()
    monkeypatch.setattr(torchvision_family.TORCHVISION_DATASETS["fashionmnist"].cls, "mirrors", [f"{dead.url}/"])
    with pytest.raises(DatasetUnavailableError, match=f"downloading {last} failed"):
        load_tensors("fashionmnist", tmp_path / "raw")
    raw = tmp_path / "raw"
    assert not (raw / "fashionmnist").exists() or list((raw / "fashionmnist").iterdir()) == []
    assert [p.name for p in raw.iterdir() if ".partial-" in p.name] == []


def test_named_folders_parse_like_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    value = os.pathsep.join(["", "relative/data", "~/datasets", " ", "/abs"])
    assert sources.named_folders({"FEDSKEW_DATA_DIRS": value}) == [
        tmp_path / "relative" / "data", Path.home() / "datasets", Path("/abs")]
    assert sources.named_folders({}) == []


# --- the command line -----------------------------------------------------------------------------

@pytest.fixture
def fashion_project(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(FASHION_PARAMS, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args", [["fashionmnist"], ["--dataset", "fashionmnist"]], ids=" ".join)
def test_download_takes_the_dataset_as_argument_or_option(args, fashion_project, server, monkeypatch):
    fake = fake_with_payloads("fashionmnist", server, monkeypatch)
    as_os_package(monkeypatch, "fashionmnist", place(fashion_project / "package", recompressed(fake)))
    assert main(["download", *args, "--no-download"]) == 0
    ready = json.loads((fashion_project / "data" / "raw" / "fashionmnist" / "READY.json").read_text())
    assert ready["shapes"]["x_train"] == [len(fake.y_train), 1, 28, 28] and server.requests == []


def test_download_refuses_two_different_datasets_or_none(fashion_project, capsys):
    assert main(["download", "fashionmnist", "--dataset", "mnist"]) == 2
    assert "names two datasets" in capsys.readouterr().err
    assert main(["download"]) == 2
    assert "python -m fedskew download <dataset>" in capsys.readouterr().err
    assert main(["download", "cifar10"]) == 2
    assert "'cifar10' is not defined under `datasets`" in capsys.readouterr().err
