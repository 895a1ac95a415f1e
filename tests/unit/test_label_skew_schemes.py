"""The label-skew schemes extended_dirichlet, iid_mixture and longtail_dirichlet: each one's defining property
(not only that it runs), and what every scheme owes: a seeded, byte-identical draw, disjoint clients of at least
min_size samples, infeasible requests refused with what to change, a heatmap, a clause of the params schema.

All on synthetic label arrays, so that the file runs in seconds.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from fedskew.data.partitions import (
    Partition,
    PartitionError,
    check_feasible,
    make_partition,
    plot_heatmap,
    save_partition,
)
from fedskew.data.partitions.build import _scheme_constant
from fedskew.data.partitions.dirichlet import Dirichlet
from fedskew.data.partitions.extended_dirichlet import ExtendedDirichlet, assign_classes
from fedskew.data.partitions.iid import Iid
from fedskew.data.partitions.iid_mixture import IidMixture, draw_parts
from fedskew.data.partitions.longtail_dirichlet import keep_long_tail, long_tail_counts
from fedskew.data.partitions.store import load_partition

C = 10


def _labels(counts: list[int], seed: int) -> np.ndarray:
    labels = np.repeat(np.arange(len(counts)), counts).astype(np.int64)
    np.random.default_rng(seed).shuffle(labels)
    return labels


BALANCED = _labels([500] * C, seed=1)  # 5000 samples, a CIFAR-10 in miniature
IMBALANCED = _labels([900, 700, 600, 500, 400, 350, 300, 250, 200, 150], seed=2)  # 4350
CONFIGS = {
    "extended_dirichlet": {"clients": 20, "classes_per_client": 2, "beta": 10.0},
    "iid_mixture": {"clients": 10, "rho": 0.5, "beta": 0.1},
    "longtail_dirichlet": {"clients": 10, "imbalance_ratio": 10.0, "beta": 0.5},
}


def _draw(scheme: str, labels: np.ndarray, seed: int = 0, **over) -> Partition:
    """The partition job's partition (make_partition) of `labels` under the scheme's configuration."""
    return make_partition(labels, C, scheme, {**CONFIGS[scheme], **over}, seed, dataset="toy")


# ---------------------------------------------------------------- extended_dirichlet


@pytest.mark.parametrize(("m", "per_client", "k"), [(10, 1, 10), (5, 2, 10), (7, 3, 10), (100, 2, 10), (3, 10, 10),
                                                    (30, 4, 100), (500, 1, 10)])
def test_exdir_assigns_exactly_c_distinct_classes_and_every_class_its_holders(m, per_client, k) -> None:
    need = max(per_client * m // k // 5, 1)  # the authors' rule
    for seed in range(5):
        holders = assign_classes(m, per_client, k, np.random.default_rng(seed))
        member = np.zeros((m, k), dtype=int)
        for c, who in enumerate(holders):
            member[who, c] += 1
        assert member.max() == 1 and (member.sum(axis=1) == per_client).all()  # C distinct classes each
        assert (member.sum(axis=0) >= need).all()  # every class held, by `need` clients at least


def test_exdir_clients_hold_only_their_assigned_classes() -> None:
    params = check_feasible("extended_dirichlet", {"clients": 20, "classes_per_client": 3, "beta": 0.3}, 5000, C)
    for seed in range(4):
        holders = assign_classes(20, 3, C, np.random.default_rng(seed))  # the draw's first step, same generator
        parts = ExtendedDirichlet.sample(BALANCED, C, params, np.random.default_rng(seed))
        for k, ix in enumerate(parts):
            assigned = {c for c, who in enumerate(holders) if k in who}
            assert set(np.unique(BALANCED[ix]).tolist()) <= assigned and len(assigned) == 3


def test_exdir_holds_at_most_c_classes_and_exactly_c_where_the_cap_cannot_shut_one() -> None:
    held = {}
    for seed in range(4):
        for per_client, beta in ((1, 0.1), (1, 10.0), (2, 0.1), (2, 10.0), (5, 0.1), (5, 10.0)):
            p = _draw("extended_dirichlet", BALANCED, seed, classes_per_client=per_client, beta=beta, min_size=1)
            classes = (p.label_counts > 0).sum(axis=1)
            assert (classes <= per_client).all() and p.label_counts.sum(axis=0).tolist() == [500] * C
            held.setdefault((per_client, beta), []).append(classes.mean())
    assert held[1, 0.1] == held[1, 10.0] == [1.0] * 4  # a client's first class is never shut: exactly C = 1
    # at the paper's beta = 10 shares are near-equal: most clients get all their classes; at 0.1 far fewer
    assert min(held[2, 10.0]) >= 1.8 and min(held[5, 10.0]) >= 4.5
    assert max(held[5, 0.1]) < min(held[5, 10.0])


def test_exdir_small_beta_concentrates_a_class_on_few_of_its_holders() -> None:
    def top_share(beta: float) -> float:
        """Mean over classes of the largest holder's share of the class (10 holders per class on average)."""
        shares = [(p.label_counts.max(axis=0) / p.label_counts.sum(axis=0)).mean()
                  for p in (_draw("extended_dirichlet", BALANCED, s, classes_per_client=5, beta=beta, min_size=1)
                            for s in range(4))]
        return float(np.mean(shares))

    low, high = top_share(0.05), top_share(100.0)
    assert low > 0.6 and high < 0.25


@pytest.mark.parametrize(("params", "words"), [
    ({"classes_per_client": 0}, ["classes_per_client must be in [1, classes present=10], got 0"]),
    ({"classes_per_client": 11}, ["classes_per_client must be in [1, classes present=10], got 11"]),
    ({"clients": 4, "classes_per_client": 2}, ["4*2 = 8 class slots cannot cover the 10 classes present",
                                               "use at least 5 clients or a classes_per_client of at least 3"]),
    ({"beta": 0.0}, ["beta must be > 0"]),
    ({"clients": 300, "classes_per_client": 2, "min_size": 20}, ["min_size=20 for each of 300 clients needs 6000",
                                                                 "fewer clients"]),
])
def test_exdir_refuses_what_it_cannot_draw(params, words) -> None:
    with pytest.raises(PartitionError) as err:
        _draw("extended_dirichlet", BALANCED, **params)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "scheme='extended_dirichlet'" in str(err.value) and "n=5000" in str(err.value)


def test_exdir_gives_up_with_advice() -> None:
    # One class each over ten clients is a perfect matching: the clients on a 15-sample class never reach 20.
    labels = _labels([60] * 5 + [15] * 5, seed=3)
    with pytest.raises(PartitionError) as err:
        make_partition(labels, C, "extended_dirichlet",
                       {"clients": 10, "classes_per_client": 1, "beta": 1.0, "min_size": 20, "max_redraws": 3}, 0)
    assert "in 4 draws (largest minimum client size seen: 15)" in str(err.value)
    assert "larger classes_per_client" in str(err.value)


# ---------------------------------------------------------------- iid_mixture

BIG = _labels([3000, 2500, 2200, 2000, 1800, 1600, 1400, 1200, 1000, 800], seed=4)  # 17500


def test_iid_shares_follow_the_global_label_distribution_and_the_dirichlet_shares_do_not() -> None:
    params = check_feasible("iid_mixture", {"clients": 10, "rho": 0.5, "beta": 0.1}, len(BIG), C)
    share = np.bincount(BIG, minlength=C) / len(BIG)
    iid, noniid = draw_parts(BIG, C, params, np.random.default_rng(0))
    iid_gap = [np.abs(np.bincount(BIG[ix], minlength=C) / ix.size - share).max() for ix in iid]
    skew_gap = [np.abs(np.bincount(BIG[ix], minlength=C) / ix.size - share).max() for ix in noniid]
    # ~875 IID samples a client: a share's sampling sd is at most 0.017, so 0.06 is over 3.5 sd
    assert max(iid_gap) < 0.06 and min(skew_gap) > 0.15
    pooled = np.bincount(BIG[np.concatenate(iid)], minlength=C)
    assert np.abs(pooled / pooled.sum() - share).max() < 0.02


@pytest.mark.parametrize("rho", [0.05, 0.3, 0.5, 0.9])
def test_a_fraction_rho_of_every_client_is_iid(rho: float) -> None:
    params = check_feasible("iid_mixture", {"clients": 10, "rho": rho, "beta": 0.3, "min_size": 30}, len(BIG), C)
    iid, noniid = draw_parts(BIG, C, params, np.random.default_rng(1))
    sizes = np.array([a.size + b.size for a, b in zip(iid, noniid)])
    assert (np.abs(np.array([a.size for a in iid]) - rho * sizes) < 2).all()
    assert sum(a.size for a in iid) == int(rho * len(BIG)) and sizes.min() >= 30
    together = IidMixture.sample(BIG, C, params, np.random.default_rng(1))
    assert all(np.array_equal(t, np.concatenate([b, a])) for t, a, b in zip(together, iid, noniid))
    held = np.concatenate(together)
    assert np.array_equal(np.sort(held), np.arange(len(BIG)))  # every sample once


def test_rho_one_is_iid_and_rho_zero_is_dirichlet() -> None:
    for seed in range(3):
        one = check_feasible("iid_mixture", {"clients": 7, "rho": 1.0, "beta": 0.5}, len(IMBALANCED), C)
        mixed = IidMixture.sample(IMBALANCED, C, one, np.random.default_rng(seed))
        plain = Iid.sample(IMBALANCED, C, {"clients": 7}, np.random.default_rng(seed))
        assert all(np.array_equal(a, b) for a, b in zip(mixed, plain, strict=True))
        zero = check_feasible("iid_mixture", {"clients": 7, "rho": 0.0, "beta": 0.5}, len(IMBALANCED), C)
        mixed = IidMixture.sample(IMBALANCED, C, zero, np.random.default_rng(seed))
        plain = Dirichlet.sample(IMBALANCED, C, {k: v for k, v in zero.items() if k != "rho"},
                                 np.random.default_rng(seed))
        assert all(np.array_equal(a, b) for a, b in zip(mixed, plain, strict=True))


@pytest.mark.parametrize(("params", "words"), [
    ({"rho": 1.5}, ["rho must be in [0, 1] (1: iid, 0: dirichlet), got 1.5"]),
    ({"rho": -0.1}, ["rho must be in [0, 1]"]),
    ({"beta": -1.0}, ["beta must be > 0"]),
    ({"rho": 0.999}, ["the Dirichlet part, 5 of the 4350 samples at rho=0.999, cannot give each of the 10 clients",
                      "use a smaller rho (or rho=1, plain iid)"]),
    ({"clients": 500}, ["min_size=10 for each of 500 clients needs 5000 samples but only 4350"]),
])
def test_iid_mixture_refuses_what_it_cannot_draw(params, words) -> None:
    with pytest.raises(PartitionError) as err:
        _draw("iid_mixture", IMBALANCED, **params)
    assert all(w in str(err.value) for w in words), str(err.value)


# ---------------------------------------------------------------- longtail_dirichlet


def test_the_long_tail_is_cifar10_lt() -> None:
    # CIFAR-10-LT at imbalance ratio 100 (LDAM-DRW's get_img_num_per_cls, 5000 per class)
    assert long_tail_counts(np.full(10, 5000), 100).tolist() == [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]
    assert long_tail_counts(np.full(10, 500), 100)[-1] == 5  # 500 * 100**-1 is 5, not 4.999...


@pytest.mark.parametrize("classes", [2, 5, 10, 100])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 10.0, 50.0, 100.0])
def test_kept_counts_follow_the_exponential_profile(classes: int, ratio: float) -> None:
    for counts in (np.full(classes, 1000), np.random.default_rng(classes).integers(300, 1500, classes)):
        kept = long_tail_counts(counts, ratio)
        n_max, c = kept[0], np.arange(classes)
        assert (kept <= counts).all() and (np.diff(kept) <= 0).all()
        assert np.array_equal(kept, np.floor(n_max * ratio ** (-c / (classes - 1)) + 1e-9).astype(int))
        assert kept[-1] == int(n_max / ratio + 1e-9)  # max/min is the ratio, up to flooring the tail
        assert abs(kept[0] / kept[-1] - ratio) <= ratio / kept[-1]
        curve = ratio ** (-c / (classes - 1))  # the largest head whose exact curve stays under every class
        assert (n_max * curve <= counts + 1e-6).all() and ((n_max + 1) * curve > counts).any()


def test_the_kept_samples_are_the_profile_split_disjointly() -> None:
    profile = long_tail_counts(np.bincount(IMBALANCED, minlength=C), 10.0)
    kept_sets = []
    for seed in range(3):
        p = _draw("longtail_dirichlet", IMBALANCED, seed, min_size=15)
        assert p.label_counts.sum(axis=0).tolist() == profile.tolist()
        held = np.concatenate(p.client_indices)
        assert np.unique(held).size == held.size == profile.sum()  # disjoint, and no sample outside the kept set
        assert held.min() >= 0 and held.max() < len(IMBALANCED) and p.client_sizes.min() >= 15
        kept_sets.append(set(held.tolist()))
        kept = keep_long_tail(IMBALANCED, C, 10.0, np.random.default_rng([seed, _scheme_constant(
            "longtail_dirichlet")]))
        assert set(held.tolist()) == set(kept.tolist())  # the clients hold exactly the kept set
    assert kept_sets[0] != kept_sets[1]  # which samples a class keeps is drawn
    everything = _draw("longtail_dirichlet", BALANCED, imbalance_ratio=1.0)
    assert everything.client_sizes.sum() == len(BALANCED)  # r = 1 on balanced data keeps all


@pytest.mark.parametrize(("labels", "params", "words"), [
    (IMBALANCED, {"imbalance_ratio": 0.5}, ["imbalance_ratio must be >= 1 (largest over smallest class count)"]),
    (IMBALANCED, {"imbalance_ratio": 2000.0}, ["imbalance_ratio=2000.0 leaves the tail class 9 no sample",
                                                "use an imbalance_ratio of at most"]),
    (_labels([100] * 9 + [0], seed=5), {}, ["class(es) [9] have no sample"]),
    (IMBALANCED, {"clients": 300, "imbalance_ratio": 100.0}, ["the long tail keeps 2230 of the 4350 samples, fewer "
                                                              "than min_size=10 for each of 300 clients",
                                                              "smaller imbalance_ratio"]),
    (IMBALANCED, {"beta": 0.0}, ["beta must be > 0"]),
])
def test_longtail_refuses_what_it_cannot_draw(labels, params, words) -> None:
    with pytest.raises(PartitionError) as err:
        _draw("longtail_dirichlet", labels, **params)
    assert all(w in str(err.value) for w in words), str(err.value)


# ---------------------------------------------------------------- what every scheme owes


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_same_seed_same_bytes_other_seed_other_draw(scheme: str, tmp_path: Path) -> None:
    a, b, c = (_draw(scheme, IMBALANCED, seed) for seed in (5, 5, 6))
    for name, part in (("a", a), ("b", b)):
        save_partition(part, tmp_path / name / "part.npz")
    for suffix in (".npz", ".json"):
        assert (tmp_path / "a" / f"part{suffix}").read_bytes() == (tmp_path / "b" / f"part{suffix}").read_bytes()
    assert load_partition(tmp_path / "a" / "part.npz").content_hash == a.content_hash == b.content_hash
    assert c.content_hash != a.content_hash
    assert any(not np.array_equal(x, y) for x, y in zip(a.client_indices, c.client_indices))


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
@pytest.mark.parametrize("labels", [BALANCED, IMBALANCED], ids=["balanced", "imbalanced"])
def test_disjoint_clients_of_min_size(scheme: str, labels: np.ndarray) -> None:
    for seed in range(3):
        p = _draw(scheme, labels, seed, min_size=25)
        held = np.concatenate(p.client_indices)
        assert np.unique(held).size == held.size and all(np.all(np.diff(ix) > 0) for ix in p.client_indices)
        assert p.num_clients == CONFIGS[scheme]["clients"] and p.client_sizes.min() >= 25
        for k, ix in enumerate(p.client_indices):
            assert np.array_equal(p.label_counts[k], np.bincount(labels[ix], minlength=C))


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_heatmap(scheme: str, tmp_path: Path) -> None:
    out = tmp_path / f"{scheme}.png"
    plot_heatmap(_draw(scheme, IMBALANCED), out)
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 1000


def test_the_schema_and_the_listing_know_them() -> None:
    from fedskew.config_schema import params_schema
    from fedskew.data.partitions import SCHEME_DEFAULTS, SCHEME_PARAMS

    clauses = {branch["if"]["properties"]["scheme"]["const"]: branch["then"]
               for branch in params_schema()["$defs"]["partition"]["allOf"]}
    assert set(clauses["extended_dirichlet"]["required"]) == {"clients", "classes_per_client", "beta"}
    assert set(clauses["iid_mixture"]["required"]) == {"clients", "rho", "beta"}
    assert clauses["iid_mixture"]["properties"]["rho"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert set(clauses["longtail_dirichlet"]["required"]) == {"clients", "imbalance_ratio", "beta"}
    assert clauses["longtail_dirichlet"]["properties"]["imbalance_ratio"] == {"type": "number", "minimum": 1}
    for scheme in CONFIGS:
        assert SCHEME_DEFAULTS[scheme] == {"min_size": 10, "max_redraws": 1000}
        assert set(SCHEME_PARAMS[scheme]) == set(clauses[scheme]["properties"]) - {"scheme"}


def test_params_yaml_validation_checks_them_against_the_dataset() -> None:
    from fedskew.config import ConfigError, load_params
    from tests.helpers import TINY_PARAMS

    params = copy.deepcopy(TINY_PARAMS)
    params["partitions"].update({"exdir": {"scheme": "extended_dirichlet", "clients": 10, "classes_per_client": 2,
                                           "beta": 10.0},
                                 "mix": {"scheme": "iid_mixture", "clients": 10, "rho": 0.5, "beta": 0.5},
                                 "lt": {"scheme": "longtail_dirichlet", "clients": 5, "imbalance_ratio": 5.0,
                                        "beta": 0.5}})
    params["suites"]["tiny"]["settings"][0]["partitions"] += ["exdir", "mix", "lt"]
    load_params(params)  # digits: 1437 training samples, 10 classes
    bad = copy.deepcopy(params)
    bad["partitions"]["mix"]["rho"] = 2  # the schema's bounds
    with pytest.raises(ConfigError, match="partitions.mix.rho: 2 is out of range; must be <= 1"):
        load_params(bad)
    bad = copy.deepcopy(params)
    bad["partitions"]["exdir"]["clients"] = 4  # the scheme's check, against the dataset
    bad["partitions"]["lt"]["imbalance_ratio"] = 1000.0
    with pytest.raises(ConfigError) as err:
        load_params(bad)
    assert "partitions.exdir cannot split datasets.digits" in str(err.value)
    assert "4*2 = 8 class slots cannot cover the 10 classes present" in str(err.value)
    assert "partitions.lt cannot split datasets.digits" in str(err.value)
    assert "imbalance_ratio=1000.0 leaves the tail class 9 no sample" in str(err.value)
