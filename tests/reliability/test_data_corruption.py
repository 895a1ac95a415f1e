"""A damaged data/raw file makes the jobs that trust it fail with one line naming the file and the
repair command; `python -m fedskew download --dataset <name>` repairs it.

Also the one integrity path of fedskew.data.fetch: a torchvision source and a self-decoded one are
fetched by the same code and follow the same marker and cache rules (fakes from tests/fixtures,
served from a loopback HTTP server).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import REPO, TINY_PARAMS, single_setting

sys.path.insert(0, str(REPO / "tests" / "fixtures"))

import fake_datasets as fakes  # noqa: E402
from fake_archives import LoopbackServer, install_fake  # noqa: E402

from fedskew import cli  # noqa: E402
from fedskew.data import registry  # noqa: E402
from fedskew.data.datasets import adult, torchvision_family  # noqa: E402
from fedskew.data.fetch import (  # noqa: E402
    MARKER,
    DatasetCorruptError,
    DatasetUnavailableError,
    Reach,
    network,
)
from fedskew.data.tensors import CACHE, CACHE_META  # noqa: E402

REPAIR = "python -m fedskew download --dataset digits"
PARTITION = ["partition", "--dataset", "digits", "--partition", "dir0.5", "--seed", "0"]
TRAIN = ["train", "--suite", "tiny", "--dataset", "digits", "--partition", "dir0.5", "--method", "fedavg",
         "--seed", "0"]
TENSORS = Path("data/raw/digits/tensors.pt")
READY = Path("data/raw/digits/READY.json")


@pytest.fixture
def digits_project(tmp_path, monkeypatch):
    """A project folder (the working directory) with digits downloaded."""
    params = single_setting(copy.deepcopy(TINY_PARAMS))
    params["datasets"]["mnist"] = {"source": "mnist"}
    params["datasets"]["adult"] = {"source": "adult"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDSKEW_TRACKING", "0")
    assert cli.main(["download", "--dataset", "digits"]) == 0
    return tmp_path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(data))


def one_line_error(argv: list[str], capsys) -> str:
    """Run `python -m fedskew <argv>` in-process; it must fail with exit 2 and a single stderr line."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"fedskew {argv[0]}: ")
    return lines[0]


# --- a damaged data/raw/<dataset>: one line, then `download` repairs it -----------------------

CORRUPTIONS = {
    "byte-flipped": (lambda: flip_byte(TENSORS), TENSORS),
    "truncated": (lambda: TENSORS.write_bytes(TENSORS.read_bytes()[:1000]), TENSORS),
    "deleted": (lambda: TENSORS.unlink(), TENSORS),
    "garbled-manifest": (lambda: READY.write_text('{"dataset": "digits", "tens'), READY),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_damaged_data_fails_jobs_with_one_line_and_download_repairs(corruption, digits_project, capsys):
    damage, named = CORRUPTIONS[corruption]
    original = sha256(TENSORS)
    damage()
    for argv in (PARTITION, TRAIN):  # cli.main returning 2 (not raising) means no traceback
        line = one_line_error(argv, capsys)
        assert str(named) in line and REPAIR in line
    assert cli.main(["download", "--dataset", "digits"]) == 0
    assert sha256(TENSORS) == original  # regenerated to the same bytes
    assert json.loads(READY.read_text())["sha256"] == original
    assert registry.load("digits", {"source": "digits", "test_fraction": 0.2, "seed": 0}).x_train.shape[0] == 1437


def test_repaired_data_partitions_and_trains(digits_project, capsys):
    assert cli.main(PARTITION) == 0
    flip_byte(TENSORS)
    one_line_error(TRAIN, capsys)
    assert not Path("results/runs").exists()  # train stopped before doing anything
    assert cli.main(["download", "--dataset", "digits"]) == 0
    assert cli.main(PARTITION) == 0
    assert cli.main(TRAIN) == 0
    assert Path("results/runs/tiny/digits/dir0.5/fedavg/seed0/metrics.json").is_file()


def test_tensors_that_match_the_manifest_but_do_not_load_are_corrupt(digits_project):
    TENSORS.write_bytes(b"not a torch file")
    manifest = json.loads(READY.read_text())
    READY.write_text(json.dumps({**manifest, "sha256": sha256(TENSORS)}))
    spec = {"source": "digits", "test_fraction": 0.2, "seed": 0}
    with pytest.raises(DatasetCorruptError, match="cannot be read") as info:
        registry.load("digits", spec)
    assert "\n" not in str(info.value) and str(TENSORS) in str(info.value) and REPAIR in str(info.value)


def test_manifest_of_another_spec_asks_to_prepare_again(digits_project, capsys):
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["datasets"]["digits"]["test_fraction"] = 0.3
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    line = one_line_error(PARTITION, capsys)
    assert str(READY) in line and "another spec" in line and REPAIR in line
    with pytest.raises(DatasetUnavailableError):
        registry.load("digits", {"source": "digits", "test_fraction": 0.3, "seed": 0})


# --- downloaded sources: a corrupt shared cache is rebuilt from the verified raw files ---------

def serve(source: str, server: LoopbackServer, monkeypatch) -> None:
    if source == "mnist":
        install_fake("mnist", server, monkeypatch)
        return
    files = fakes.fake_adult()
    for name, body in files.items():
        server.files[f"/adult/{name}"] = body
    monkeypatch.setattr(adult, "ADULT_BASE_URL", f"{server.url}/adult/")
    monkeypatch.setattr(adult, "ADULT_MD5", {name: hashlib.md5(body).hexdigest() for name, body in files.items()})


@pytest.mark.parametrize("source", ["mnist", "adult"])
def test_corrupt_cache_of_a_downloaded_source_is_rebuilt_by_download(source, digits_project, server, monkeypatch,
                                                                    capsys):
    serve(source, server, monkeypatch)
    assert cli.main(["download", "--dataset", source]) == 0
    cache = Path("data/raw") / source / CACHE
    original = sha256(cache)
    flip_byte(cache)
    with pytest.raises(DatasetCorruptError) as info:
        registry.load(source, {"source": source})
    assert "\n" not in str(info.value) and str(cache) in str(info.value)
    assert f"python -m fedskew download --dataset {source}" in str(info.value)
    server.requests.clear()
    assert cli.main(["download", "--dataset", source, "--no-download"]) == 0  # offline: from the archives
    assert server.requests == []
    # The rebuild gives the same bytes, so another dataset sharing this cache still verifies.
    assert sha256(cache) == original == json.loads((cache.parent / CACHE_META).read_text())["sha256"]
    assert registry.load(source, {"source": source}).y_train.shape[0] == 10


# --- one integrity path for every source ------------------------------------------------------

@pytest.mark.parametrize("source", ["mnist", "adult"])
def test_one_fetch_path_and_one_marker_for_torchvision_and_external_sources(source, server, monkeypatch,
                                                                          tmp_path):
    serve(source, server, monkeypatch)
    streamed, original_stream = [], network._stream
    monkeypatch.setattr(network, "_stream", lambda url, dest: streamed.append(url) or original_stream(url, dest))
    raw = tmp_path / "data" / "raw"
    registry.prepare(source, {"source": source}, tmp_path)
    assert sorted(streamed) == sorted(server.url + path for path in server.requests) and streamed
    marker = json.loads((raw / source / MARKER).read_text())
    for filename, entry in marker["files"].items():  # the same record for every source
        body = (raw / source / filename).read_bytes()
        assert entry == {"expected_md5": hashlib.md5(body).hexdigest(), "md5": hashlib.md5(body).hexdigest(),
                         "expected_payload_md5": torchvision_family.PAYLOAD_MD5.get(source, {}).get(filename),
                         "sha256": hashlib.sha256(body).hexdigest(), "size": len(body), "verified_by": "archive-md5",
                         "source": {"kind": "download", "url": f"{server.url}/{source}/{filename}"}}

    (raw / source / MARKER).write_text("{garbled")  # an unreadable marker: the files are re-hashed
    registry.prepare(source, {"source": source}, tmp_path, reach=Reach.LOCAL)
    for filename, entry in marker["files"].items():  # the same digests; where the files came from went with it
        entry["source"] = {"kind": "hand-placed", "path": str((raw / source / filename).resolve())}
    assert json.loads((raw / source / MARKER).read_text()) == marker

    archive = raw / source / sorted(marker["files"])[0]
    (raw / source / MARKER).unlink()
    flip_byte(archive, at=-1)  # same size: only re-hashing tells
    with pytest.raises(DatasetCorruptError, match=archive.name) as info:
        registry.prepare(source, {"source": source}, tmp_path, reach=Reach.LOCAL)
    assert str(archive.resolve()) in str(info.value) and archive.is_file()  # reported, never deleted


def test_marker_and_cache_of_an_older_fedskew_are_reverified_not_trusted(server, monkeypatch, tmp_path):
    """Before the merge, torchvision datasets wrote {"md5", "size"} markers and a cache keyed by md5s."""
    fake = install_fake("mnist", server, monkeypatch)
    torchvision_family.load_tensors("mnist", tmp_path)
    folder = tmp_path / "mnist"
    old_marker = {"dataset": "mnist", "torchvision_class": "MNIST", "files": {
        fn: {"md5": hashlib.md5(body).hexdigest(), "size": len(body)} for fn, body in fake.files.items()}}
    (folder / MARKER).write_text(json.dumps(old_marker))
    meta = json.loads((folder / CACHE_META).read_text())
    old_meta = {"format": 1, "sha256": meta["sha256"], "shapes": meta["shapes"], "num_classes": 10,
                "sources": {fn: entry["md5"] for fn, entry in old_marker["files"].items()}}
    (folder / CACHE_META).write_text(json.dumps(old_meta))
    decoded, original_decode = [], torchvision_family._decode
    monkeypatch.setattr(torchvision_family, "_decode", lambda *a: decoded.append(a) or original_decode(*a))
    server.requests.clear()

    tensors = torchvision_family.load_tensors("mnist", tmp_path, reach=Reach.LOCAL)
    assert torch.equal(tensors.x_train, torch.from_numpy(fake.x_train)) and len(decoded) == 1
    assert server.requests == []
    assert "sha256" in json.loads((folder / MARKER).read_text())["files"]["t10k-labels-idx1-ubyte.gz"]

    (folder / MARKER).write_text(json.dumps(old_marker))
    flip_byte(folder / "t10k-labels-idx1-ubyte.gz", at=-1)  # the old marker still "matches" its size
    with pytest.raises(DatasetCorruptError, match="t10k-labels-idx1-ubyte.gz"):
        torchvision_family.load_tensors("mnist", tmp_path, reach=Reach.LOCAL)
