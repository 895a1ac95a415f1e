"""The self-decoded datasets (cinic10, tinyimagenet, adult, femnist, imagenet_subset) against tiny fakes.

Fakes are in the real on-disk formats (tests/fixtures/fake_datasets.py); downloadable ones are
served from a loopback HTTP server by pointing each module's URL and md5 constants at it.
Expected tensors are computed from the generated arrays, independently of fedskew.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

import fake_datasets as fakes  # noqa: E402
from fake_archives import LoopbackServer  # noqa: E402

from fedskew import catalog  # noqa: E402
from fedskew.data import registry  # noqa: E402
from fedskew.data.datasets import adult, cinic10, femnist, imagenet_subset, tinyimagenet  # noqa: E402
from fedskew.data.fetch import MARKER, DatasetCorruptError, DatasetUnavailableError, Reach  # noqa: E402
from fedskew.data.partitions import make_partition  # noqa: E402
from fedskew.data.tensors import CACHE, CACHE_META  # noqa: E402


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture(scope="module")
def cinic_fake():
    return fakes.fake_cinic10()


@pytest.fixture(scope="module")
def tiny_fake():
    return fakes.fake_tinyimagenet()


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".partial-" in p.name or ".tmp-" in p.name)


def assert_images(tensors: dict, expected: fakes.Expected, shape: tuple[int, ...]) -> None:
    for split in ("train", "test"):
        x, y = tensors[f"x_{split}"], tensors[f"y_{split}"]
        assert x.dtype == torch.uint8 and y.dtype == torch.int64 and x.is_contiguous()
        assert tuple(x.shape) == (len(getattr(expected, f"y_{split}")), *shape)
        assert np.array_equal(x.numpy(), getattr(expected, f"x_{split}"))
        assert np.array_equal(y.numpy(), getattr(expected, f"y_{split}"))


def serve_cinic(server, monkeypatch, data: bytes, md5: str | None = "auto") -> str:
    server.files["/cinic10/CINIC-10.tar.gz"] = data
    monkeypatch.setattr(cinic10, "CINIC10_URLS", (f"{server.url}/cinic10/CINIC-10.tar.gz",))
    monkeypatch.setattr(cinic10, "CINIC10_MD5", md5_of(data) if md5 == "auto" else md5)
    return "/cinic10/CINIC-10.tar.gz"


def serve_tiny(server, monkeypatch, data: bytes, md5: str | None = "auto") -> None:
    server.files["/tiny/tiny-imagenet-200.zip"] = data
    monkeypatch.setattr(tinyimagenet, "TINYIMAGENET_URLS", (f"{server.url}/tiny/tiny-imagenet-200.zip",))
    monkeypatch.setattr(tinyimagenet, "TINYIMAGENET_MD5", md5_of(data) if md5 == "auto" else md5)


def serve_adult(server, monkeypatch, files: dict[str, bytes]) -> None:
    for name, body in files.items():
        server.files[f"/adult/{name}"] = body
    monkeypatch.setattr(adult, "ADULT_BASE_URL", f"{server.url}/adult/")
    monkeypatch.setattr(adult, "ADULT_MD5", {name: md5_of(body) for name, body in files.items()})


def dead_server() -> LoopbackServer:
    dead = LoopbackServer()
    dead.close()  # its port is closed now: connections are refused
    return dead


# --- CINIC-10 ---------------------------------------------------------------------------------

def test_pinned_checksums_are_the_published_ones():
    assert cinic10.CINIC10_MD5 == "6ee4d0c996905fe93221de577967a372"
    assert tinyimagenet.TINYIMAGENET_MD5 == "90528d7ca1a48142e341f4ef8d21d0de"
    assert adult.ADULT_MD5 == {"adult.data": "5d7c39d7b8804f071cdd1f2a7c460872",
                               "adult.test": "35238206dfdf7f1fe215bbb874adecdc"}


def test_cinic10_downloads_verifies_and_decodes(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    path = serve_cinic(server, monkeypatch, data)
    cache, tensors = cinic10.load_tensors({}, tmp_path)
    assert cache == tmp_path / "cinic10" / CACHE and cache.is_file() and (cache.parent / CACHE_META).is_file()
    assert_images(tensors, expected, (3, 32, 32))
    assert server.requests == [path]
    assert (tmp_path / "cinic10" / "CINIC-10.tar.gz").read_bytes() == data
    marker = json.loads((tmp_path / "cinic10" / MARKER).read_text())["files"]["CINIC-10.tar.gz"]
    assert marker["md5"] == marker["expected_md5"] == md5_of(data)
    assert marker["sha256"] == hashlib.sha256(data).hexdigest()
    assert leftovers(tmp_path) == []


def test_cinic10_archive_with_a_top_folder_decodes_the_same(server, monkeypatch, tmp_path):
    data, expected = fakes.fake_cinic10(seed=1, prefix="CINIC-10/")
    serve_cinic(server, monkeypatch, data)
    assert_images(cinic10.load_tensors({}, tmp_path)[1], expected, (3, 32, 32))


def test_cinic10_second_call_reuses_the_cache(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    serve_cinic(server, monkeypatch, data)
    cinic10.load_tensors({}, tmp_path)
    server.requests.clear()
    monkeypatch.setattr(cinic10, "_decode", lambda *a: pytest.fail("decoded again"))
    assert_images(cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)[1], expected, (3, 32, 32))
    assert server.requests == []


def test_cinic10_tampered_cache_is_rebuilt(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    serve_cinic(server, monkeypatch, data)
    cache, _ = cinic10.load_tensors({}, tmp_path)
    tensors = torch.load(cache, weights_only=True)
    tensors["y_train"] = (tensors["y_train"] + 1) % 10
    torch.save(tensors, cache)
    assert_images(cinic10.load_tensors({}, tmp_path)[1], expected, (3, 32, 32))


def test_cinic10_corrupt_download_raises_and_writes_nothing(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    path = serve_cinic(server, monkeypatch, data)
    server.files[path] = data[:-1] + bytes([data[-1] ^ 0xFF])
    with pytest.raises(DatasetCorruptError) as info:
        cinic10.load_tensors({}, tmp_path)
    assert md5_of(data) in str(info.value) and md5_of(server.files[path]) in str(info.value)
    folder = tmp_path / "cinic10"
    assert not folder.exists() or list(folder.iterdir()) == []
    assert leftovers(tmp_path) == []
    with pytest.raises(DatasetUnavailableError):
        cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    server.files[path] = data  # the server recovers: a retry succeeds
    assert_images(cinic10.load_tensors({}, tmp_path)[1], expected, (3, 32, 32))


def test_cinic10_unknown_checksum_checks_structure_and_records_digests(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    flipped = data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
    path = "/cinic10/CINIC-10.tar.gz"
    for corrupt in (data[: len(data) // 2], flipped):  # truncated; one byte changed (only gzip's CRC tells)
        serve_cinic(server, monkeypatch, corrupt, md5=None)
        with pytest.raises(DatasetCorruptError, match="CINIC-10.tar.gz"):
            cinic10.load_tensors({}, tmp_path)
        assert not (tmp_path / "cinic10").exists() or list((tmp_path / "cinic10").iterdir()) == []
        assert leftovers(tmp_path) == []
    server.files[path] = data
    assert_images(cinic10.load_tensors({}, tmp_path)[1], expected, (3, 32, 32))
    marker = json.loads((tmp_path / "cinic10" / MARKER).read_text())["files"]["CINIC-10.tar.gz"]
    assert marker["expected_md5"] is None and marker["md5"] == md5_of(data)
    assert marker["sha256"] == hashlib.sha256(data).hexdigest()


def test_cinic10_offline_raises_unavailable_naming_file_and_folder(cinic_fake, monkeypatch, tmp_path):
    data, _ = cinic_fake
    serve_cinic(dead_server(), monkeypatch, data)
    with pytest.raises(DatasetUnavailableError) as info:
        cinic10.load_tensors({}, tmp_path)
    message = str(info.value)
    assert "refused" in message.lower() and "CINIC-10.tar.gz" in message and md5_of(data) in message
    assert str((tmp_path / "cinic10").resolve()) in message
    assert leftovers(tmp_path) == []


def test_cinic10_hand_placed_archive_is_used_offline(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    serve_cinic(server, monkeypatch, data)
    (tmp_path / "cinic10").mkdir()
    (tmp_path / "cinic10" / "CINIC-10.tar.gz").write_bytes(data)
    assert_images(cinic10.load_tensors({}, tmp_path, reach=Reach.LOCAL)[1], expected, (3, 32, 32))
    assert server.requests == []


def test_hand_placed_file_with_wrong_checksum_is_reported_and_kept(cinic_fake, server, monkeypatch, tmp_path):
    data, _ = cinic_fake
    serve_cinic(server, monkeypatch, data)
    bad = tmp_path / "cinic10" / "CINIC-10.tar.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"not the archive")
    with pytest.raises(DatasetCorruptError) as info:
        cinic10.load_tensors({}, tmp_path)
    assert str(bad.resolve()) in str(info.value) and md5_of(b"not the archive") in str(info.value)
    assert bad.read_bytes() == b"not the archive" and server.requests == []


# --- Tiny ImageNet ----------------------------------------------------------------------------

def test_tinyimagenet_downloads_and_decodes_train_and_val(tiny_fake, server, monkeypatch, tmp_path):
    data, expected = tiny_fake
    serve_tiny(server, monkeypatch, data)
    cache, tensors = tinyimagenet.load_tensors({}, tmp_path)
    assert_images(tensors, expected, (3, 64, 64))
    assert len(torch.unique(tensors["y_train"])) == 200
    gray = [i for i in range(len(expected.y_train)) if np.array_equal(expected.x_train[i][0], expected.x_train[i][2])]
    assert gray and torch.equal(tensors["x_train"][gray[0], 0], tensors["x_train"][gray[0], 1])
    server.requests.clear()
    monkeypatch.setattr(tinyimagenet, "_decode", lambda *a: pytest.fail("decoded again"))
    assert_images(tinyimagenet.load_tensors({}, tmp_path)[1], expected, (3, 64, 64))
    assert server.requests == []


def test_tinyimagenet_corrupt_zip_without_checksum_is_rejected(tiny_fake, server, monkeypatch, tmp_path):
    data, _ = tiny_fake
    at = data.index(b"JFIF") + 200  # inside a stored JPEG member: its CRC no longer matches
    serve_tiny(server, monkeypatch, data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:], md5=None)
    with pytest.raises(DatasetCorruptError, match="CRC"):
        tinyimagenet.load_tensors({}, tmp_path)
    assert not (tmp_path / "tinyimagenet").exists() or list((tmp_path / "tinyimagenet").iterdir()) == []
    assert leftovers(tmp_path) == []


def test_tinyimagenet_missing_without_download_names_the_zip(tiny_fake, server, monkeypatch, tmp_path):
    data, _ = tiny_fake
    serve_tiny(server, monkeypatch, data)
    with pytest.raises(DatasetUnavailableError) as info:
        tinyimagenet.load_tensors({}, tmp_path, reach=Reach.LOCAL)
    message = str(info.value)
    assert "tiny-imagenet-200.zip" in message and str((tmp_path / "tinyimagenet").resolve()) in message
    assert server.requests == []


# --- Adult ------------------------------------------------------------------------------------

def independent_adult_expectation():
    """Parse the fake rows by hand: drop '?', standardise numerics with train stats, label >50K."""
    def rows(lines):
        out = [[f.strip() for f in line.split(",")] for line in lines]
        return [r for r in out if "?" not in r]

    train, test = rows(fakes.ADULT_TRAIN_ROWS), rows(fakes.ADULT_TEST_ROWS)
    numeric_at = [0, 2, 4, 10, 11, 12]
    num_train = np.array([[float(r[i]) for i in numeric_at] for r in train])
    num_test = np.array([[float(r[i]) for i in numeric_at] for r in test])
    mean, std = num_train.mean(0), num_train.std(0)
    labels = [np.array([1 if r[14].startswith(">50K") else 0 for r in part]) for part in (train, test)]
    return train, test, (num_train - mean) / std, (num_test - mean) / std, labels


def test_adult_preprocessing_matches_an_independent_computation(server, monkeypatch, tmp_path):
    serve_adult(server, monkeypatch, fakes.fake_adult())
    _, tensors = adult.load_tensors({}, tmp_path)
    train, test, num_train, num_test, (y_train, y_test) = independent_adult_expectation()
    assert len(train) == 10 and len(test) == 4  # one '?' row dropped from each file
    assert tensors["x_train"].dtype == torch.float32 and tensors["x_train"].shape == (10, 105)
    assert tensors["x_test"].shape == (4, 105)
    assert np.array_equal(tensors["y_train"].numpy(), y_train) and np.array_equal(tensors["y_test"].numpy(), y_test)
    assert np.allclose(tensors["x_train"][:, :6].numpy(), num_train, atol=1e-6)
    assert np.allclose(tensors["x_test"][:, :6].numpy(), num_test, atol=1e-6)
    names = adult.feature_names()
    categorical_at = {"workclass": 1, "education": 3, "marital-status": 5, "occupation": 6, "relationship": 7,
                      "race": 8, "sex": 9, "native-country": 13}
    for x, rows in ((tensors["x_train"], train), (tensors["x_test"], test)):
        hot = x[:, 6:].numpy()
        assert set(np.unique(hot)) <= {0.0, 1.0} and np.array_equal(hot.sum(1), np.full(len(rows), 8.0))
        for r, row in enumerate(rows):
            on = {names[6 + j] for j in np.flatnonzero(hot[r])}
            assert on == {f"{column}={row[i]}" for column, i in categorical_at.items()}


def test_adult_one_hot_columns_are_the_fixed_category_lists():
    names = adult.feature_names()
    assert len(names) == adult.NUM_FEATURES == 105
    assert names[:6] == ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    expected_sizes = {"workclass": 8, "education": 16, "marital-status": 7, "occupation": 14, "relationship": 6,
                      "race": 5, "sex": 2, "native-country": 41}
    assert {c: len(v) for c, v in adult.CATEGORIES.items()} == expected_sizes
    assert names[6:] == [f"{c}={v}" for c, values in adult.CATEGORIES.items() for v in values]
    assert registry.dataset_info({"source": "adult"}) == registry.DatasetInfo((105,), 2, False, False)


def test_adult_is_deterministic_to_the_byte(server, monkeypatch, tmp_path):
    serve_adult(server, monkeypatch, fakes.fake_adult())
    first, a = adult.load_tensors({}, tmp_path / "one")
    second, b = adult.load_tensors({}, tmp_path / "two")
    for key in a:
        assert a[key].numpy().tobytes() == b[key].numpy().tobytes()
    assert first.read_bytes() == second.read_bytes()


def test_adult_unknown_category_is_an_error(tmp_path):
    files = fakes.fake_adult()
    (tmp_path / "adult.data").write_bytes(files["adult.data"].replace(b"State-gov", b"Space-gov"))
    (tmp_path / "adult.test").write_bytes(files["adult.test"])
    sha256 = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in files}
    with pytest.raises(DatasetCorruptError, match="Space-gov"):
        adult.preprocess(tmp_path / "adult.data", tmp_path / "adult.test", sha256)


def test_adult_offline_names_both_files(monkeypatch, tmp_path):
    serve_adult(dead_server(), monkeypatch, fakes.fake_adult())
    with pytest.raises(DatasetUnavailableError) as info:
        adult.load_tensors({}, tmp_path)
    message = str(info.value)
    assert "adult.data" in message and "adult.test" in message and str((tmp_path / "adult").resolve()) in message


def test_adult_hand_placed_files_are_used_offline(server, monkeypatch, tmp_path):
    files = fakes.fake_adult()
    serve_adult(server, monkeypatch, files)
    (tmp_path / "adult").mkdir()
    for name, body in files.items():
        (tmp_path / "adult" / name).write_bytes(body)
    assert adult.load_tensors({}, tmp_path, reach=Reach.LOCAL)[1]["x_train"].shape == (10, 105)
    assert server.requests == []


# --- FEMNIST ----------------------------------------------------------------------------------

def test_femnist_missing_files_explain_leaf_preprocessing(tmp_path):
    with pytest.raises(DatasetUnavailableError) as info:
        femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    message = str(info.value)
    folder = str((tmp_path / "femnist").resolve())
    assert f"{folder}/train/*.json" in message and f"{folder}/test/*.json" in message
    assert "preprocess.sh -s niid --sf 1.0 -k 0 -t sample" in message and "user_data" in message


def test_femnist_decodes_all_writers_with_natural_groups(tmp_path):
    leaf = fakes.write_fake_leaf(tmp_path / "femnist")
    _, tensors = femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    x = np.concatenate([leaf.train[w][0] for w in leaf.writers])
    y = np.concatenate([leaf.train[w][1] for w in leaf.writers])
    groups = np.concatenate([np.full(len(leaf.train[w][1]), i) for i, w in enumerate(leaf.writers)])
    assert tensors["x_train"].dtype == torch.uint8 and tensors["x_train"].shape == (len(y), 1, 28, 28)
    assert np.array_equal(tensors["x_train"].numpy(), x) and np.array_equal(tensors["y_train"].numpy(), y)
    assert np.array_equal(tensors["natural_groups"].numpy(), groups)
    x_test = np.concatenate([leaf.test[w][0] for w in sorted(leaf.test)])
    assert np.array_equal(tensors["x_test"].numpy(), x_test)
    partition = make_partition(tensors["y_train"].numpy(), 62, "natural", {}, seed=0, dataset="femnist",
                               natural_groups=tensors["natural_groups"].numpy())
    assert partition.num_clients == len(leaf.writers)
    for k, w in enumerate(leaf.writers):
        assert np.array_equal(tensors["y_train"].numpy()[partition.client_indices[k]], leaf.train[w][1])


def test_femnist_writer_subset_is_seeded_and_pools_their_test_data(tmp_path):
    leaf = fakes.write_fake_leaf(tmp_path / "femnist")
    path, tensors = femnist.load_tensors({"writers": 3, "seed": 5}, tmp_path)
    assert path == tmp_path / "femnist" / "writers3-seed5" / CACHE
    chosen = [leaf.writers[i] for i in np.sort(np.random.default_rng(5).choice(len(leaf.writers), 3, replace=False))]
    assert np.array_equal(tensors["y_train"].numpy(), np.concatenate([leaf.train[w][1] for w in chosen]))
    assert np.array_equal(tensors["natural_groups"].numpy(),
                          np.concatenate([np.full(len(leaf.train[w][1]), i) for i, w in enumerate(chosen)]))
    assert np.array_equal(tensors["x_test"].numpy(), np.concatenate([leaf.test[w][0] for w in chosen]))
    again = femnist.load_tensors({"writers": 3, "seed": 5}, tmp_path)[1]
    assert torch.equal(again["x_train"], tensors["x_train"])
    other = femnist.load_tensors({"writers": 3, "seed": 6}, tmp_path)[1]
    assert len(torch.unique(other["natural_groups"])) == 3
    with pytest.raises(DatasetUnavailableError, match="only 7 writers"):
        femnist.load_tensors({"writers": 8, "seed": 0}, tmp_path)


def test_femnist_reuses_its_cache_and_rebuilds_when_a_file_changes(tmp_path, monkeypatch):
    leaf = fakes.write_fake_leaf(tmp_path / "femnist")
    femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    calls, original = [], femnist._decode
    monkeypatch.setattr(femnist, "_decode", lambda *args: calls.append(1) or original(*args))
    femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)
    assert calls == []
    path = sorted((tmp_path / "femnist" / "train").glob("*.json"))[0]
    content = json.loads(path.read_text())
    user = content["users"][0]
    content["user_data"][user]["y"][0] = (content["user_data"][user]["y"][0] + 1) % 62
    path.write_text(json.dumps(content))
    tensors = femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)[1]
    assert calls == [1]
    first = sum(len(leaf.train[w][1]) for w in leaf.writers[: leaf.writers.index(user)])
    assert int(tensors["y_train"][first]) == content["user_data"][user]["y"][0]


def test_femnist_rejects_pixels_that_are_not_leaf_v_over_255(tmp_path):
    fakes.write_fake_leaf(tmp_path / "femnist")
    path = sorted((tmp_path / "femnist" / "train").glob("*.json"))[0]
    content = json.loads(path.read_text())
    user = content["users"][0]
    content["user_data"][user]["x"][0][0] = 0.5  # 127.5 / 255
    path.write_text(json.dumps(content))
    with pytest.raises(DatasetCorruptError, match="v/255"):
        femnist.load_tensors({"writers": None, "seed": 0}, tmp_path)


# --- ImageNet subset --------------------------------------------------------------------------

def test_imagenet_subset_without_imagenet_dir_explains_the_layout(tmp_path):
    for spec in ({"imagenet_dir": None}, {"imagenet_dir": str(tmp_path / "nowhere")}):
        with pytest.raises(DatasetUnavailableError) as info:
            imagenet_subset.load_tensors(spec, tmp_path)
        message = str(info.value)
        assert "imagenet_dir" in message and "/train/<wnid>/*.JPEG" in message and "/val/<wnid>/*.JPEG" in message
        assert all(w in message for w in imagenet_subset.WNIDS)


def test_imagenet_subset_missing_class_folder_is_named(tmp_path):
    fakes.write_fake_imagenet(tmp_path / "imagenet", imagenet_subset.WNIDS)
    for image in (tmp_path / "imagenet" / "val" / imagenet_subset.WNIDS[3]).iterdir():
        image.unlink()
    with pytest.raises(DatasetUnavailableError, match=f"val/{imagenet_subset.WNIDS[3]}"):
        imagenet_subset.load_tensors({"imagenet_dir": str(tmp_path / "imagenet")}, tmp_path)


def test_imagenet_subset_resizes_crops_and_caches(tmp_path, monkeypatch):
    import io

    from PIL import Image

    written = fakes.write_fake_imagenet(tmp_path / "imagenet", imagenet_subset.WNIDS)
    spec = {"imagenet_dir": str(tmp_path / "imagenet")}
    cache, tensors = imagenet_subset.load_tensors(spec, tmp_path)
    assert cache == tmp_path / "imagenet_subset" / CACHE
    assert tensors["x_train"].shape == (60, 3, 64, 64) and tensors["x_test"].shape == (24, 3, 64, 64)
    assert tensors["x_train"].dtype == torch.uint8
    assert np.array_equal(tensors["y_train"].numpy(), np.repeat(np.arange(12), 5))  # the extra class is ignored
    assert np.array_equal(tensors["y_test"].numpy(), np.repeat(np.arange(12), 2))
    names = ["cmyk", "flat", "gray", "tall", "wide"]  # file-name order within a class
    for label, wnid in enumerate(imagenet_subset.WNIDS):
        def pixels(split, kind):
            return np.asarray(Image.open(io.BytesIO(written[split][f"{wnid}/{wnid}_{kind}.JPEG"])).convert("RGB"))
        x = tensors["x_train"][5 * label: 5 * label + 5].numpy()
        assert np.array_equal(x[names.index("wide")], pixels("train", "wide")[:, 32:96].transpose(2, 0, 1))
        assert np.array_equal(x[names.index("tall")], pixels("train", "tall")[43:107].transpose(2, 0, 1))
        for kind in ("flat", "gray", "cmyk"):  # flat colours stay flat whatever the resize
            colour = pixels("train", kind).reshape(-1, 3).mean(0)
            assert np.abs(x[names.index(kind)].reshape(3, -1).T - colour).max() <= 3
        x_test = tensors["x_test"][2 * label: 2 * label + 2].numpy()
        assert np.array_equal(x_test[1], pixels("val", "wide")[:, 32:96].transpose(2, 0, 1))
    monkeypatch.setattr(imagenet_subset, "_decode", lambda *a: pytest.fail("decoded again"))
    assert torch.equal(imagenet_subset.load_tensors(spec, tmp_path)[1]["x_train"], tensors["x_train"])


# --- the registry: prepare -> READY.json -> load ----------------------------------------------

def test_registry_prepares_and_loads_cinic10(cinic_fake, server, monkeypatch, tmp_path):
    data, expected = cinic_fake
    serve_cinic(server, monkeypatch, data)
    spec = {**catalog.dataset_defaults("cinic10"), "source": "cinic10"}
    ready = registry.prepare("cinic", spec, tmp_path)
    manifest = json.loads(ready.read_text())
    assert ready == tmp_path / "data" / "raw" / "cinic" / "READY.json"
    assert manifest["tensors"] == "data/raw/cinic10/tensors.pt"
    assert manifest["sha256"] == hashlib.sha256((tmp_path / manifest["tensors"]).read_bytes()).hexdigest()
    loaded = registry.load("cinic", spec, tmp_path)
    assert loaded.num_classes == 10 and loaded.x_train.dtype == torch.float32
    assert loaded.x_train.shape == (20, 3, 32, 32) and torch.equal(loaded.y_test, torch.from_numpy(expected.y_test))
    assert loaded.x_train.mean(dim=(0, 2, 3)).abs().max() < 1e-5  # standardised per channel
    tensors = torch.load(tmp_path / manifest["tensors"], weights_only=True)
    tensors["y_train"][0] = (tensors["y_train"][0] + 1) % 10
    torch.save(tensors, tmp_path / manifest["tensors"])
    with pytest.raises(DatasetCorruptError, match="corrupt"):
        registry.load("cinic", spec, tmp_path)


def test_registry_adult_features_are_not_renormalised(server, monkeypatch, tmp_path):
    serve_adult(server, monkeypatch, fakes.fake_adult())
    spec = {"source": "adult"}
    registry.prepare("adult", spec, tmp_path)
    loaded = registry.load("adult", spec, tmp_path)
    raw = torch.load(tmp_path / "data" / "raw" / "adult" / CACHE, weights_only=True)
    assert torch.equal(loaded.x_train, raw["x_train"]) and torch.equal(loaded.x_test, raw["x_test"])
    assert loaded.num_classes == 2 and loaded.natural_groups is None


def test_registry_femnist_gives_natural_groups(tmp_path):
    leaf = fakes.write_fake_leaf(tmp_path / "data" / "raw" / "femnist")
    spec = {**catalog.dataset_defaults("femnist"), "source": "femnist", "writers": 4}
    ready = registry.prepare("femnist4", spec, tmp_path, reach=Reach.LOCAL)
    assert json.loads(ready.read_text())["tensors"] == "data/raw/femnist/writers4-seed0/tensors.pt"
    loaded = registry.load("femnist4", spec, tmp_path)
    assert loaded.num_classes == 62 and loaded.x_train.shape[1:] == (1, 28, 28)
    assert sorted(np.unique(loaded.natural_groups)) == [0, 1, 2, 3]
    partition = make_partition(loaded.y_train.numpy(), 62, "natural", {}, seed=0, dataset="femnist4",
                               natural_groups=loaded.natural_groups)
    assert partition.num_clients == 4 and sum(partition.client_sizes) == len(loaded.y_train) < sum(
        len(y) for _, y in leaf.train.values())


def test_registry_resolves_a_relative_imagenet_dir_against_the_root(tmp_path):
    fakes.write_fake_imagenet(tmp_path / "ilsvrc", imagenet_subset.WNIDS)
    spec = {"source": "imagenet_subset", "imagenet_dir": "ilsvrc"}
    ready = registry.prepare("imagenet_subset", spec, tmp_path)
    assert json.loads(ready.read_text())["spec"] == spec  # the spec as written, not the resolved path
    assert registry.load("imagenet_subset", spec, tmp_path).x_test.shape == (24, 3, 64, 64)


def test_dataset_info_and_defaults_of_the_new_sources():
    expected = {
        "cinic10": registry.DatasetInfo((3, 32, 32), 10, True, False),
        "tinyimagenet": registry.DatasetInfo((3, 64, 64), 200, True, False),
        "femnist": registry.DatasetInfo((1, 28, 28), 62, True, True),
        "adult": registry.DatasetInfo((105,), 2, False, False),
        "imagenet_subset": registry.DatasetInfo((3, 64, 64), 12, True, False),
    }
    for source, info in expected.items():
        assert registry.dataset_info({**catalog.dataset_defaults(source), "source": source}) == info
    assert catalog.dataset_defaults("femnist") == {"writers": 100, "seed": 0}
    assert catalog.dataset_defaults("imagenet_subset") == {"imagenet_dir": None}


def test_schema_accepts_the_new_sources_and_their_options():
    import jsonschema

    from fedskew.config_schema import params_schema

    schema = params_schema()
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/dataset"})
    good = [{"source": "cinic10"}, {"source": "tinyimagenet"}, {"source": "adult"},
            {"source": "femnist"}, {"source": "femnist", "writers": None, "seed": 3},
            {"source": "femnist", "writers": 100},
            {"source": "imagenet_subset", "imagenet_dir": "/data/ILSVRC2012"}, {"source": "imagenet_subset"},
            {"source": "mnist"}, {"source": "digits", "test_fraction": 0.2, "seed": 0}]
    bad = [{"source": "cinic10", "seed": 1}, {"source": "femnist", "writers": 0},
           {"source": "femnist", "imagenet_dir": "x"}, {"source": "imagenet_subset", "writers": 3},
           {"source": "adult", "test_fraction": 0.2}]
    for spec in good:
        assert not list(validator.iter_errors(spec)), spec
    for spec in bad:
        assert list(validator.iter_errors(spec)), spec
