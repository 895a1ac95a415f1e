"""Unit tests for fedskew.data.partitions: coverage, determinism, scheme statistics, errors, I/O."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedskew.data.partitions import (
    SCHEME_DEFAULTS,
    SCHEME_PARAMS,
    SCHEMES,
    Partition,
    PartitionError,
    check_feasible,
    load_partition,
    make_partition,
    plot_heatmap,
    save_partition,
)
from fedskew.data.partitions.registry import SCHEME_CLASSES

C = 10


def _labels_from_counts(counts: list[int], seed: int) -> np.ndarray:
    labels = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(seed).shuffle(labels)
    return labels.astype(np.int64)


# ~2000 samples, 10 classes, mildly varied counts; and a strongly imbalanced one.
VARIED = _labels_from_counts([200, 210, 190, 220, 180, 205, 195, 215, 185, 200], seed=1)
IMBALANCED = _labels_from_counts([600, 400, 300, 200, 150, 120, 90, 70, 50, 20], seed=2)
# 200 per class: with 10 clients and alpha=2 the Q(alpha) sets (100 samples) align with classes.
BALANCED = _labels_from_counts([200] * C, seed=3)

CONFIGS: dict[str, dict] = {
    "iid": {"clients": 10},
    "dirichlet": {"clients": 10, "beta": 0.5},
    "quantity": {"clients": 10, "alpha": 2},
    "quantity_per_label": {"clients": 10, "alpha": 2},
    "shards": {"clients": 10, "shards_per_client": 2},
    "natural": {},
    "extended_dirichlet": {"clients": 10, "classes_per_client": 2, "beta": 0.5},
    "iid_mixture": {"clients": 10, "rho": 0.5, "beta": 0.5},
    "longtail_dirichlet": {"clients": 10, "imbalance_ratio": 5.0, "beta": 0.5},
}


def _groups(n: int, k: int = 7, seed: int = 4) -> np.ndarray:
    g = np.arange(n) % k
    np.random.default_rng(seed).shuffle(g)
    return g


def _make(labels: np.ndarray, scheme: str, seed: int = 0, **over) -> Partition:
    params = {**CONFIGS[scheme], **over}
    groups = _groups(len(labels)) if scheme == "natural" else None
    return make_partition(labels, C, scheme, params, seed, dataset="toy", natural_groups=groups)


def test_registry_consistent() -> None:
    assert set(SCHEMES) == set(SCHEME_PARAMS) == set(CONFIGS)


def test_the_schema_takes_the_schemes_and_their_parameters_from_the_classes() -> None:
    import re

    from fedskew.config_schema import SCHEMA_PATH, params_schema

    text = SCHEMA_PATH.read_text()
    assert [s for s in SCHEMES if re.search(rf"\b{s}\b", text)] == []  # the file names no scheme
    partition = params_schema()["$defs"]["partition"]
    assert partition["properties"]["scheme"]["enum"] == list(SCHEMES)
    clauses = {branch["if"]["properties"]["scheme"]["const"]: branch["then"] for branch in partition["allOf"]}
    assert {scheme: set(then["properties"]) - {"scheme"} for scheme, then in clauses.items()} == \
        {scheme: set(spec) for scheme, spec in SCHEME_PARAMS.items()}
    assert {scheme: set(then.get("required", [])) for scheme, then in clauses.items()} == \
        {scheme: set(spec) - set(SCHEME_DEFAULTS[scheme]) for scheme, spec in SCHEME_PARAMS.items()}
    dirichlet = clauses["dirichlet"]["properties"]
    assert dirichlet["beta"] == {"type": "number", "exclusiveMinimum": 0}
    assert dirichlet["min_size"] == {"$ref": "#/$defs/sample_count"}
    assert dirichlet["max_redraws"] == {"type": "integer", "minimum": 1, "maximum": 100000}


@pytest.mark.parametrize("labels", [VARIED, IMBALANCED], ids=["varied", "imbalanced"])
@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_every_sample_once_and_counts(scheme: str, labels: np.ndarray) -> None:
    p = _make(labels, scheme)
    flat = np.concatenate(p.client_indices)
    assert flat.dtype == np.int64
    if SCHEME_CLASSES[scheme].leaves_samples_out:  # each sample at most once, some held by no client
        assert np.unique(flat).size == flat.size < len(labels) and 0 <= flat.min() and flat.max() < len(labels)
    else:
        assert np.array_equal(np.sort(flat), np.arange(len(labels)))
    assert all(np.all(np.diff(ix) > 0) for ix in p.client_indices)  # sorted, unique
    assert p.label_counts.dtype == np.int64
    assert p.label_counts.shape == (p.num_clients, C)
    for k, ix in enumerate(p.client_indices):
        assert np.array_equal(p.label_counts[k], np.bincount(labels[ix], minlength=C))
    assert p.label_counts.sum(axis=0).tolist() == np.bincount(labels[flat], minlength=C).tolist()
    assert p.meta["scheme"] == scheme and p.meta["seed"] == 0 and p.meta["dataset"] == "toy"
    assert p.meta["num_samples"] == len(labels) and p.meta["num_classes"] == C
    assert len(p.content_hash) == 64


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_deterministic_bytes_and_seed_sensitivity(scheme: str, tmp_path: Path) -> None:
    a, b = _make(VARIED, scheme, seed=5), _make(VARIED, scheme, seed=5)
    save_partition(a, tmp_path / "a" / "part.npz")
    save_partition(b, tmp_path / "b" / "part.npz")
    for suffix in (".npz", ".json"):
        assert (tmp_path / "a" / f"part{suffix}").read_bytes() == (tmp_path / "b" / f"part{suffix}").read_bytes()
    assert a.content_hash == b.content_hash
    c = _make(VARIED, scheme, seed=6)
    assert c.content_hash != a.content_hash
    if scheme != "natural":  # natural ignores the seed by construction
        assert any(not np.array_equal(x, y) for x, y in zip(a.client_indices, c.client_indices))


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_roundtrip(scheme: str, tmp_path: Path) -> None:
    p = _make(IMBALANCED, scheme, seed=3)
    path = tmp_path / "p.npz"
    save_partition(p, path)
    q = load_partition(path)
    assert q.content_hash == p.content_hash
    assert q.meta == p.meta
    assert np.array_equal(q.label_counts, p.label_counts)
    assert all(np.array_equal(x, y) for x, y in zip(p.client_indices, q.client_indices))
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["content_hash"] == p.content_hash
    assert side["client_sizes"] == p.client_sizes.tolist()
    assert side["label_counts"] == p.label_counts.tolist()
    assert side["meta"] == p.meta
    assert not list(tmp_path.glob("*.tmp"))  # no temporaries left behind


def _rewrite_npz(path: Path, **changes: np.ndarray) -> None:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def test_load_detects_tampering(tmp_path: Path) -> None:
    p = _make(VARIED, "dirichlet")
    path = tmp_path / "p.npz"
    save_partition(p, path)
    with np.load(path) as z:
        idx, counts = z["indices"].copy(), z["label_counts"].copy()
    # Move one sample between clients (swap two entries across a client boundary).
    off = p.client_sizes[0]
    idx[0], idx[off] = idx[off], idx[0]
    _rewrite_npz(path, indices=idx)
    with pytest.raises(PartitionError, match="hash mismatch"):
        load_partition(path)

    save_partition(p, path)
    counts[0, 0] += 1
    _rewrite_npz(path, label_counts=counts)
    with pytest.raises(PartitionError, match="hash mismatch"):
        load_partition(path)

    save_partition(p, path)
    meta = dict(p.meta, seed=99)
    _rewrite_npz(path, meta_json=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    with pytest.raises(PartitionError, match="hash mismatch"):
        load_partition(path)

    save_partition(p, path)
    side = path.with_suffix(".json")
    side.write_text(side.read_text().replace(p.content_hash, "0" * 64))
    with pytest.raises(PartitionError, match="do not belong together"):
        load_partition(path)

    path.write_bytes(b"not a zip")
    with pytest.raises(PartitionError):
        load_partition(path)


def test_npz_has_no_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    save_partition(_make(VARIED, "iid"), path)
    with zipfile.ZipFile(path) as zf:
        assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in zf.infolist())


# ---------------------------------------------------------------- scheme statistics


def test_iid_close_to_uniform() -> None:
    p = _make(IMBALANCED, "iid")
    sizes = p.client_sizes
    assert sizes.max() - sizes.min() <= 1
    global_share = np.bincount(IMBALANCED, minlength=C) / len(IMBALANCED)
    shares = p.label_counts / sizes[:, None]
    assert np.abs(shares - global_share).max() < 0.1


def test_quantity_alpha_classes_when_sets_align() -> None:
    for seed in range(5):
        for alpha in (1, 2, 4):
            p = make_partition(BALANCED, C, "quantity", {"clients": 10, "alpha": alpha}, seed)
            # 2000 / (10*alpha) = 200, 100, 50 samples per set divides the class size 200,
            # so no set straddles two classes -> every client holds at most alpha classes.
            assert ((p.label_counts > 0).sum(axis=1) <= alpha).all()
            assert (p.client_sizes == 2000 // 10).all()


def test_quantity_holds_at_most_alpha_classes_on_imbalanced_data() -> None:
    # Sets are cut within classes, so even when n/(m*alpha) does not divide the class
    # sizes every client holds at most alpha classes, and sets stay near-equal in size.
    labels = np.concatenate([IMBALANCED, np.array([9, 9, 9])])
    for seed in range(5):
        for alpha in (1, 2, 3):
            p = make_partition(labels, C, "quantity", {"clients": 10, "alpha": alpha}, seed)
            assert ((p.label_counts > 0).sum(axis=1) <= alpha).all()
            assert p.client_sizes.sum() == len(labels)
    # Set sizes: each class's share of the 20 sets is proportional to its size.
    p = make_partition(labels, C, "quantity", {"clients": 10, "alpha": 2}, 0)
    per_class = np.bincount(labels, minlength=C)
    mean_set = len(labels) / 20
    nonzero = p.label_counts[p.label_counts > 0]
    assert nonzero.max() <= 2 * per_class.max()  # a client may draw two sets of one class
    assert abs(p.client_sizes.mean() - 2 * mean_set) < 1e-9


def test_quantity_needs_a_set_for_every_class() -> None:
    with pytest.raises(PartitionError, match="cannot cover"):
        make_partition(VARIED, C, "quantity", {"clients": 4, "alpha": 2}, 0)


def test_quantity_per_label_distinct_and_balanced() -> None:
    for labels in (VARIED, IMBALANCED):
        for seed in range(4):
            for clients, alpha in ((10, 2), (20, 3), (5, 10), (10, 1)):
                p = make_partition(labels, C, "quantity_per_label", {"clients": clients, "alpha": alpha}, seed)
                present = p.label_counts > 0
                assert (present.sum(axis=1) == alpha).all()  # alpha distinct classes each
                per_class = clients * alpha // C
                assert (present.sum(axis=0) == per_class).all()  # every class used, P portions
                class_n = np.bincount(labels, minlength=C)
                for c in range(C):
                    got = p.label_counts[present[:, c], c]
                    assert got.max() - got.min() <= 1  # near-equal portions
                    assert got.sum() == class_n[c]


def test_quantity_per_label_assignment_varies() -> None:
    sets = {
        frozenset(frozenset(np.flatnonzero(row).tolist()) for row in
                  make_partition(VARIED, C, "quantity_per_label", {"clients": 10, "alpha": 3}, s).label_counts > 0)
        for s in range(6)
    }
    assert len(sets) > 1


def test_shards_sizes() -> None:
    for seed in range(3):
        for m, s in ((10, 2), (20, 5), (4, 1)):
            p = make_partition(VARIED, C, "shards", {"clients": m, "shards_per_client": s}, seed)
            assert (p.client_sizes == s * (2000 // (m * s))).all()
            # a shard no larger than the smallest class (180) touches at most 2 classes
            if 2000 // (m * s) <= 180:
                assert ((p.label_counts > 0).sum(axis=1) <= 2 * s).all()


def test_shards_same_class_can_repeat() -> None:
    # 10 clients x 2 shards over 10 classes of 200 -> each shard is one class; over a few
    # seeds some client must get both halves of one class (fewer than 2 classes).
    repeats = 0
    for seed in range(20):
        p = make_partition(BALANCED, C, "shards", {"clients": 10, "shards_per_client": 2}, seed)
        repeats += int(((p.label_counts > 0).sum(axis=1) == 1).sum())
    assert repeats > 0


def test_dirichlet_min_size_and_concentration() -> None:
    def mean_max_share(beta: float) -> float:
        vals = []
        for seed in range(4):
            p = make_partition(VARIED, C, "dirichlet", {"clients": 10, "beta": beta, "min_size": 20}, seed)
            assert (p.client_sizes >= 20).all()
            vals.append((p.label_counts.max(axis=1) / p.client_sizes).mean())
        return float(np.mean(vals))

    low, high = mean_max_share(0.1), mean_max_share(10.0)
    assert low > 0.5 and high < 0.3 and low > high + 0.3


def test_dirichlet_defaults_recorded() -> None:
    p = make_partition(VARIED, C, "dirichlet", {"clients": 5, "beta": 1}, 0)
    assert p.meta["params"] == {"clients": 5, "beta": 1.0, "min_size": 10, "max_redraws": 1000}


def test_natural_groups() -> None:
    g = _groups(len(VARIED), k=7)
    p = make_partition(VARIED, C, "natural", {}, 0, natural_groups=g)
    assert p.num_clients == 7
    for k, ix in enumerate(p.client_indices):
        assert np.array_equal(ix, np.flatnonzero(g == k))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("scheme", "params", "words"),
    [
        ("nope", {"clients": 2}, ["unknown partition scheme", "nope"]),
        ("iid", {"clients": 2, "beta": 1.0}, ["unknown parameter", "beta"]),
        ("dirichlet", {"clients": 2}, ["missing", "beta"]),
        ("iid", {"clients": 0}, ["clients", ">= 1"]),
        ("iid", {"clients": 2.5}, ["clients", "integer"]),
        ("iid", {"clients": 2001}, ["more clients", "2000"]),
        ("dirichlet", {"clients": 5, "beta": 0.0}, ["beta", "> 0"]),
        ("dirichlet", {"clients": 5, "beta": -1}, ["beta", "> 0"]),
        ("dirichlet", {"clients": 100, "beta": 1.0, "min_size": 30}, ["min_size", "fewer clients"]),
        ("quantity", {"clients": 5, "alpha": 0}, ["alpha", "num_classes=10"]),
        ("quantity", {"clients": 5, "alpha": 11}, ["alpha", "num_classes=10"]),
        ("quantity_per_label", {"clients": 5, "alpha": 11}, ["alpha"]),
        ("quantity_per_label", {"clients": 7, "alpha": 2}, ["divisible", "num_classes=10"]),
        ("shards", {"clients": 5, "shards_per_client": 0}, ["shards_per_client", ">= 1"]),
        ("shards", {"clients": 1000, "shards_per_client": 3}, ["shards", "exceed"]),
        ("natural", {}, ["natural_groups"]),
    ],
)
def test_invalid_requests(scheme: str, params: dict, words: list[str]) -> None:
    with pytest.raises(PartitionError) as err:
        make_partition(VARIED, C, scheme, params, 0, dataset="toy")
    msg = str(err.value)
    for w in words:
        assert w in msg
    if scheme != "nope":
        assert "n=2000" in msg


def test_dirichlet_gives_up_with_advice() -> None:
    with pytest.raises(PartitionError) as err:
        make_partition(IMBALANCED, C, "dirichlet",
                       {"clients": 50, "beta": 0.01, "min_size": 35, "max_redraws": 3}, 0, dataset="toy")
    msg = str(err.value)
    for w in ("beta=0.01", "m=50", "n=2000", "'toy'", "larger beta", "fewer clients", "smaller min_size"):
        assert w in msg


def test_bad_labels_and_natural_groups() -> None:
    with pytest.raises(PartitionError, match="labels must lie"):
        make_partition(np.array([0, 1, 10]), C, "iid", {"clients": 1}, 0)
    with pytest.raises(PartitionError, match="integers"):
        make_partition(np.array([0.0, 1.0]), C, "iid", {"clients": 1}, 0)
    with pytest.raises(PartitionError, match="fewer samples"):
        make_partition(IMBALANCED, C, "quantity_per_label", {"clients": 250, "alpha": 1}, 0)
    with pytest.raises(PartitionError, match="seed"):
        make_partition(VARIED, C, "iid", {"clients": 2}, -1)


def test_natural_drops_group_ids_no_sample_carries(caplog) -> None:
    # Ids 1 and 4 are gaps: the three groups left become clients 0, 1, 2 and the gaps are recorded.
    groups = np.array([0, 2, 2, 3, 0, 3])
    with caplog.at_level("INFO", logger="fedskew.data.partitions.build"):
        p = make_partition(np.array([0, 1, 2, 3, 4, 5]), C, "natural", {}, 0, dataset="toy", natural_groups=groups)
    assert [ix.tolist() for ix in p.client_indices] == [[0, 4], [1, 2], [3, 5]]
    assert p.meta["dropped_empty_groups"] == [1] and p.meta["num_clients"] == 3
    assert "group id(s) [1] hold no sample; dropped" in caplog.text and "'toy'" in caplog.text
    # Without gaps nothing is recorded, so existing natural partitions keep their content hash.
    assert "dropped_empty_groups" not in _make(VARIED, "natural").meta


@pytest.mark.parametrize("scheme", sorted(set(CONFIGS) - {"natural"}))
def test_a_scheme_that_leaves_a_client_empty_is_refused(scheme: str, monkeypatch) -> None:
    # check_feasible keeps the real schemes from emptying a client; this is the net behind it.
    real = SCHEMES[scheme]

    def emptying(*args, **kwargs):
        parts = real(*args, **kwargs)
        return [parts[0][:0], np.concatenate([parts[0], parts[1]]), *parts[2:]]

    monkeypatch.setitem(SCHEMES, scheme, emptying)
    with pytest.raises(PartitionError) as err:
        _make(VARIED, scheme)
    message = str(err.value)
    assert "1 client(s) would hold no sample (client ids [0])" in message and "use fewer clients" in message
    assert f"scheme={scheme!r}" in message and "n=2000" in message


@pytest.mark.parametrize(("scheme", "params"), [
    ("iid", {"clients": 20}),  # one sample each
    ("dirichlet", {"clients": 20, "beta": 0.1, "min_size": 1}),
    ("quantity", {"clients": 10, "alpha": 2}),  # 20 one-sample sets
    ("quantity_per_label", {"clients": 10, "alpha": 2}),  # 2 one-sample portions per class
    ("shards", {"clients": 10, "shards_per_client": 2}),
])
def test_the_tightest_feasible_request_gives_every_client_a_sample(scheme: str, params: dict) -> None:
    labels = np.repeat(np.arange(C), 2)  # 20 samples, 2 per class
    p = make_partition(labels, C, scheme, params, 0)
    assert p.num_clients == params["clients"] and p.client_sizes.min() >= 1


def test_min_size_zero_is_refused() -> None:
    with pytest.raises(PartitionError, match=r"min_size must be >= 1 \(no client may be empty\), got 0"):
        make_partition(VARIED, C, "dirichlet", {"clients": 5, "beta": 0.5, "min_size": 0}, 0)


# ---------------------------------------------------------------- feasibility before data (check_feasible)


def test_check_feasible_is_what_make_partition_applies(monkeypatch) -> None:
    import fedskew.data.partitions.build as partition

    calls = []
    monkeypatch.setattr(partition, "check_feasible",
                        lambda *args, **kwargs: calls.append(args) or check_feasible(*args, **kwargs))
    make_partition(VARIED, C, "quantity", {"clients": 5, "alpha": 2}, 0, dataset="toy")
    scheme, params, n, num_classes, counts, dataset = calls[0]
    assert (scheme, params, n, num_classes, dataset) == ("quantity", {"clients": 5, "alpha": 2}, 2000, C, "toy")
    assert counts.tolist() == np.bincount(VARIED, minlength=C).tolist()


def test_check_feasible_fills_defaults_and_needs_no_labels() -> None:
    assert check_feasible("dirichlet", {"clients": 5, "beta": 1}, 1437, 10) == {
        "clients": 5, "beta": 1.0, "min_size": 10, "max_redraws": 1000}
    with pytest.raises(PartitionError, match="min_size=10 for each of 500 clients needs 5000 samples but only 1437"):
        check_feasible("dirichlet", {"clients": 500, "beta": 0.5}, 1437, 10, dataset="digits")
    with pytest.raises(PartitionError, match="unknown partition scheme 'nope'"):
        check_feasible("nope", {}, 10, 2)


def test_rules_needing_class_counts_wait_for_them() -> None:
    # Class 9 has 20 samples: 250 clients x alpha 1 / 10 classes = 25 portions per class is too many.
    counts = np.bincount(IMBALANCED, minlength=C)
    with pytest.raises(PartitionError, match="fewer samples"):
        check_feasible("quantity_per_label", {"clients": 250, "alpha": 1}, 2000, C, counts)
    check_feasible("quantity_per_label", {"clients": 250, "alpha": 1}, 2000, C)  # unknown counts: left to later
    # Q(1) over 5 clients covers 5 classes, not the 10 present; unknown counts leave it to make_partition.
    with pytest.raises(PartitionError, match="cannot cover the 10"):
        check_feasible("quantity", {"clients": 5, "alpha": 1}, 2000, C, counts)
    check_feasible("quantity", {"clients": 5, "alpha": 1}, 2000, C)


@pytest.mark.parametrize(("test_fraction", "seed"), [(0.2, 0), (0.2, 3), (0.1, 1), (0.33, 2), (0.5, 7), (0.05, 0)])
def test_digits_sizes_are_those_of_the_real_split(test_fraction: float, seed: int) -> None:
    from fedskew.data import sizes
    from fedskew.data.datasets.digits import load_digits_split

    spec = {"source": "digits", "test_fraction": test_fraction, "seed": seed}
    y_train = load_digits_split(test_fraction, seed)["y_train"].numpy()
    assert sizes.train_size(spec) == len(y_train)
    assert sizes.class_counts(spec).tolist() == np.bincount(y_train, minlength=10).tolist()


def test_synthetic_sizes_are_those_of_the_generated_data() -> None:
    from fedskew.data import sizes
    from fedskew.data.datasets.synthetic import generate_synthetic

    for seed in (0, 1):
        spec = {"source": "synthetic", "lam": 1.0, "mu": 1.0, "clients": 12, "dim": 60, "classes": 10, "seed": seed}
        y_train = generate_synthetic(1.0, 1.0, 12, 60, 10, seed)["y_train"].numpy()
        assert sizes.train_size(spec) == len(y_train)
        assert sizes.class_counts(spec).tolist() == np.bincount(y_train, minlength=10).tolist()


def test_fixed_sizes_agree_with_the_cost_table_and_the_class_counts() -> None:
    from fedskew import catalog
    from fedskew.data import sizes
    from fedskew.data.registry import dataset_info
    from fedskew.reproduce.cost import dataset_sizes

    fixed = [name for name, source in catalog.sources().items() if source.train_size is not None]
    assert fixed == ["adult", "cifar10", "cifar100", "cinic10", "fashionmnist", "mnist", "svhn", "tinyimagenet"]
    for source in fixed:
        spec = {"source": source, **catalog.dataset_defaults(source)}
        assert sizes.train_size(spec) == dataset_sizes(spec)[0], source
        counts = sizes.class_counts(spec)
        assert counts is None or len(counts) == dataset_info(spec).num_classes, source
    for source in ("femnist", "imagenet_subset"):  # depend on a writer draw / a local copy: unknown
        assert sizes.train_size({"source": source, **catalog.dataset_defaults(source)}) is None


# ---------------------------------------------------------------- figure


def test_heatmap_png(tmp_path: Path) -> None:
    small = make_partition(VARIED, C, "quantity", {"clients": 5, "alpha": 4}, 0, dataset="toy")
    out = tmp_path / "fig" / "small.png"
    plot_heatmap(small, out)
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    big_labels = _labels_from_counts([40] * 100, seed=0)
    big = make_partition(big_labels, 100, "dirichlet", {"clients": 60, "beta": 0.3, "min_size": 1}, 0)
    out2 = tmp_path / "big.png"
    plot_heatmap(big, out2, title="big")
    assert out2.stat().st_size > 1000
    assert not list(tmp_path.rglob("*.tmp"))
