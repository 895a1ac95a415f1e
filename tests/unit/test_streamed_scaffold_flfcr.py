"""SCAFFOLD and FL-FCR aggregate through a stream, as every federated method does.

Each participant's update is folded in as soon as it has trained and then dropped by the
engine. Checked here against the one-shot aggregation they had before (kept below as the
reference, a fold that keeps a copy of every update and computes at the end): bit for bit
over several rounds with unequal clients (and, for FL-FCR, classes missing on some clients),
across a checkpoint, and that a round really holds one client's state and payload at a time.
"""

from __future__ import annotations

import gc
import io
import weakref
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

from fedskew.engine.sampling import client_seed
from fedskew.engine.rounds import federated_round, train_client
from fedskew.fl.base import (
    ClientContext,
    ClientUpdate,
    FederatedAlgorithm,
    Fold,
    RoundStart,
    StateDict,
    TrainingSettings,
    trainable_parameters,
)
from fedskew.fl.combinations import FedLCScaffold
from fedskew.fl.flfcr import FLFCR, HEAD_BIAS, HEAD_WEIGHT
from fedskew.fl.flfcr_features import ClassStatisticsPool, class_feature_statistics, symmetric_unpack
from fedskew.fl.flfcr_retraining import retrain_head, sample_class_features
from fedskew.fl.scaffold import Scaffold
from fedskew.fl.server_math import weighted_average
from fedskew.models.net import SplittableNet

NUM_CLASSES, DIM, HIDDEN = 4, 6, 8
SIZES = [7, 23, 3, 42, 12, 2, 30, 10]  # unequal; no client leaves a batch of one (BatchNorm)
SCHEDULE = [[0, 1, 2, 3, 4, 5, 6, 7], [1, 3, 5], [0, 2, 4, 6, 7], [5, 2, 7, 0]]  # not sorted in round 4


# ------------------------------------------------------------------ the one-shot reference

def _pool_all_at_once(clients, num_classes: int, dim: int):
    """FL-FCR's Eq. 5–6 pooling as it was before it streamed (pool_class_statistics, verbatim)."""
    packed = dim * (dim + 1) // 2
    total = torch.zeros(num_classes, dtype=torch.float64)
    mean = torch.zeros(num_classes, dim, dtype=torch.float64)
    m2 = torch.zeros(num_classes, packed, dtype=torch.float64)
    rows, cols = torch.triu_indices(dim, dim)
    for counts, means, covs in clients:
        n_b = counts.cpu().to(torch.float64)
        present, with_cov = n_b >= 1, n_b >= 2
        mean_b = torch.zeros(num_classes, dim, dtype=torch.float64)
        mean_b[present] = means.cpu().to(torch.float64)
        m2_b = torch.zeros(num_classes, packed, dtype=torch.float64)
        m2_b[with_cov] = covs.cpu().to(torch.float64) * (n_b[with_cov] - 1).unsqueeze(1)
        n = total + n_b
        delta = mean_b - mean
        share = torch.where(present, n_b / n.clamp_min(1), torch.zeros_like(n_b))
        cross = torch.where(present, total * n_b / n.clamp_min(1), torch.zeros_like(n_b))
        mean = mean + delta * share.unsqueeze(1)
        m2 = m2 + m2_b + (delta[:, rows] * delta[:, cols]) * cross.unsqueeze(1)
        total = n
    cov = m2 / (total - 1).clamp_min(1).unsqueeze(1)
    cov[total < 2] = 0
    return total.round().to(torch.int64), mean, cov


class KeepEveryUpdate(Fold):
    """The reference's way of aggregating: a copy of every update kept (the engine drops its own), and
    `one_shot(global_state, updates)` computed on all of them at the end."""

    def __init__(self, start: RoundStart, one_shot) -> None:
        super().__init__(start)
        self.one_shot, self.kept = one_shot, []

    def fold(self, update: ClientUpdate) -> None:
        self.kept.append(ClientUpdate(update.client_id, update.num_samples, _snapshot(update.state),
                                      update.num_steps, update.train_loss, _snapshot(update.payload)))

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.one_shot(self.start.global_state, self.kept)


class OneShotScaffold(Scaffold):
    """SCAFFOLD's server step as it was before it streamed: every update at once."""

    def begin_aggregate(self, start: RoundStart) -> Fold:
        return KeepEveryUpdate(start, self.one_shot)

    def one_shot(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        out = weighted_average([u.state for u in updates], [u.num_samples for u in updates])
        total = float(self.num_clients)
        new_c = {}
        for name, c in self._c.items():
            acc = c.clone()
            for update in updates:
                acc.add_(update.payload["delta_c"][name], alpha=1.0 / total)
            new_c[name] = acc
        self._c = new_c
        return out


class OneShotFedLCScaffold(FedLCScaffold):
    begin_aggregate = OneShotScaffold.begin_aggregate
    one_shot = OneShotScaffold.one_shot


class OneShotFLFCR(FLFCR):
    """FL-FCR's server side as it was before it streamed: every update at once."""

    begin_aggregate = OneShotScaffold.begin_aggregate

    def one_shot(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        state = weighted_average([u.state for u in updates], [u.num_samples for u in updates])
        weight, bias = state[HEAD_WEIGHT], state[HEAD_BIAS]
        for update in updates:
            self._reported[update.client_id] = update.payload["counts"].cpu().to(torch.int64)
        total, pooled_mean, pooled_cov = _pool_all_at_once(
            ((u.payload["counts"], u.payload["means"], u.payload["covs"]) for u in updates),
            self.num_classes, weight.shape[1])
        sampled = total >= 2
        num = int(self.hp["samples_per_class"])
        epochs = int(self.hp["retrain_epochs"])
        if not bool(sampled.any()) or num == 0 or epochs == 0:
            return state
        generator = torch.Generator().manual_seed(sum(u.payload["seed"] for u in updates) % 2 ** 63)
        classes = [c for c in range(self.num_classes) if sampled[c]]
        dim = weight.shape[1]
        virtual = torch.cat([sample_class_features(pooled_mean[c], symmetric_unpack(pooled_cov[c], dim), num,
                                                   generator) for c in classes])
        labels = torch.tensor(classes, dtype=torch.int64).repeat_interleave(num)
        lr = self.hp["retrain_lr"] or self.settings.lr
        state[HEAD_WEIGHT], state[HEAD_BIAS] = retrain_head(weight, bias, virtual, labels, sampled, epochs, lr,
                                                            self.settings.batch_size, generator)
        return state


# ------------------------------------------------------------------------------ a small run

def _data(seed: int = 0):
    """Features, labels and each client's indices; classes missing or seen once on some clients."""
    g = torch.Generator().manual_seed(seed)
    allowed = {0: [0, 1, 2], 2: [0, 1], 5: [0]}  # client 2 lacks classes 2–3, client 5 has only class 0
    xs, ys, indices, start = [], [], [], 0
    for k, n in enumerate(SIZES):
        classes = torch.tensor(allowed.get(k, list(range(NUM_CLASSES))))
        y = classes[torch.randint(0, len(classes), (n,), generator=g)]
        if k == 3:  # class 3 seen once on client 3: a mean, no covariance
            y[y == 3] = 2
            y[0] = 3
        xs.append(torch.randn(n, DIM, generator=g) + 0.5 * y.unsqueeze(1).float())
        ys.append(y)
        indices.append(torch.arange(start, start + n))
        start += n
    return torch.cat(xs), torch.cat(ys), indices


def _model(batch_norm: bool) -> SplittableNet:
    stages: OrderedDict[str, nn.Module] = OrderedDict(fc1=nn.Linear(DIM, HIDDEN))
    if batch_norm:  # a float buffer and an integer one (num_batches_tracked takes the maximum)
        stages["bn"] = nn.BatchNorm1d(HIDDEN)
    stages["relu"] = nn.ReLU()
    return SplittableNet(stages, HIDDEN, NUM_CLASSES, ("relu",))


class Run:
    """One method trained round by round through the engine's `federated_round`."""

    def __init__(self, cls: type[FederatedAlgorithm], momentum: float = 0.0, batch_norm: bool = False,
                 engine_counts: bool = False, **hp: Any) -> None:
        self.x, self.y, self.indices = _data()
        self.counts = torch.stack([torch.bincount(self.y[ix], minlength=NUM_CLASSES) for ix in self.indices])
        settings = TrainingSettings(local_epochs=2, batch_size=4, lr=0.05, momentum=momentum, weight_decay=1e-4)
        self.algorithm = cls(settings, len(SIZES), NUM_CLASSES, **hp)
        if engine_counts:
            self.algorithm.set_label_counts(self.counts)
        torch.manual_seed(0)
        self.model = self.algorithm.adapt_model(_model(batch_norm))
        self.global_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def round(self, round_: int) -> dict[str, Any]:
        clients = []
        for cid in SCHEDULE[(round_ - 1) % len(SCHEDULE)]:
            seed = client_seed(0, round_, cid)
            clients.append(ClientContext(cid, round_, self.indices[cid], self.counts[cid],
                                         torch.Generator().manual_seed(seed), seed))
        self.global_state = federated_round(self.algorithm, self.model, self.global_state, clients,
                                            self.x, self.y, "stream-test").global_state
        return {"global": self.global_state, "method": _snapshot(self.algorithm.state_dict())}


def _snapshot(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {key: _snapshot(value) for key, value in obj.items()}
    return obj


def _assert_identical(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            _assert_identical(a[key], b[key], f"{where}/{key}")
    else:
        assert a == b, where


# (streamed class, its one-shot reference, settings). FL-FCR without the engine's label counts
# learns N_c from the uploads: later clients of a round must still see the counts known before it.
CASES = {
    "scaffold": (Scaffold, OneShotScaffold, {}),
    "scaffold_momentum_batchnorm": (Scaffold, OneShotScaffold, {"momentum": 0.9, "batch_norm": True}),
    "fedlc_scaffold": (FedLCScaffold, OneShotFedLCScaffold, {"momentum": 0.5}),
    "flfcr_learned_counts": (FLFCR, OneShotFLFCR, {}),
    "flfcr_engine_counts_momentum_batchnorm": (FLFCR, OneShotFLFCR,
                                               {"momentum": 0.9, "batch_norm": True, "engine_counts": True}),
    "flfcr_local_counts": (FLFCR, OneShotFLFCR, {"momentum": 0.5, "global_counts": 0, "samples_per_class": 30}),
    "flfcr_no_retraining": (FLFCR, OneShotFLFCR, {"retrain_epochs": 0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_aggregation_is_the_one_shot_one_bit_for_bit(case: str) -> None:
    streamed_cls, one_shot_cls, options = CASES[case]
    streamed, one_shot = Run(streamed_cls, **options), Run(one_shot_cls, **options)
    start = RoundStart(streamed.global_state, SIZES, trainable_parameters(streamed.model))
    assert not isinstance(streamed.algorithm.begin_aggregate(start), KeepEveryUpdate)
    assert isinstance(one_shot.algorithm.begin_aggregate(start), KeepEveryUpdate)  # it keeps all
    for round_ in range(1, 5):
        _assert_identical(streamed.round(round_), one_shot.round(round_), f"{case} round {round_}")
    state = streamed.algorithm.state_dict()
    if streamed_cls is FLFCR:  # the server learned every client's counts
        assert torch.equal(state["reported_counts"], streamed.counts)
    else:  # c moved, and every client that trained keeps its c_i
        assert any(bool(c.abs().sum() > 0) for c in state["c"].values())
        assert set(state["client_c"]) == set(range(len(SIZES)))


@pytest.mark.parametrize("cls", [Scaffold, FLFCR])
def test_aggregate_called_directly_is_the_engines_stream(cls) -> None:
    """`aggregate` given every update at once and the engine's fold-and-drop give the same round."""
    direct, streamed = Run(cls, momentum=0.5), Run(cls, momentum=0.5)
    direct.round(1), streamed.round(1)
    clients = [ClientContext(cid, 2, direct.indices[cid], direct.counts[cid],
                             torch.Generator().manual_seed(client_seed(0, 2, cid)), client_seed(0, 2, cid))
               for cid in (6, 1, 3)]
    updates = [train_client(direct.algorithm, direct.model, direct.global_state, direct.x, direct.y, client, "direct")
               for client in clients]
    out = direct.algorithm.aggregate(direct.global_state, updates, trainable_parameters(direct.model))
    for client in clients:  # the same clients again, with fresh generators
        client.generator = torch.Generator().manual_seed(client.seed)
    via_engine = federated_round(streamed.algorithm, streamed.model, streamed.global_state, clients,
                                 streamed.x, streamed.y, "streamed").global_state
    _assert_identical(out, via_engine)
    _assert_identical(_snapshot(direct.algorithm.state_dict()), _snapshot(streamed.algorithm.state_dict()))


def _leaves(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _leaves(value)]
    return []


# ---------------------------------------------------------------------------- resume

@pytest.mark.parametrize("cls", [Scaffold, FLFCR])
def test_resume_from_a_checkpoint_is_bit_identical(cls) -> None:
    uninterrupted = Run(cls, momentum=0.9, batch_norm=True)
    expected = [uninterrupted.round(r) for r in range(1, 5)]

    first = Run(cls, momentum=0.9, batch_norm=True)
    first.round(1), first.round(2)
    buffer = io.BytesIO()  # through torch.save, as the engine's checkpoints
    torch.save({"global_state": first.global_state, "algorithm_state": first.algorithm.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=False)
    resumed = Run(cls, momentum=0.9, batch_norm=True)
    resumed.global_state = checkpoint["global_state"]
    resumed.algorithm.load_state_dict(checkpoint["algorithm_state"])
    for r in (3, 4):
        _assert_identical(resumed.round(r), expected[r - 1], f"round {r}")


# ------------------------------------------------------------------- the engine streams

def _held_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the tensors an aggregation object holds (not those of the method it points to, nor the round's
    global state it reads, which the engine holds anyway)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_held_bytes(value, seen) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_held_bytes(value, seen) for value in obj)
    if isinstance(obj, (FederatedAlgorithm, RoundStart)) or not hasattr(obj, "__dict__"):
        return 0
    return sum(_held_bytes(value, seen) for value in vars(obj).values())


class Watched:
    """Wraps a method's fold: what is alive at each fold, and what the fold holds after it."""

    def __init__(self, inner: Fold) -> None:
        self.inner = inner
        self.folded: list[ClientUpdate] = []
        self.alive: list[int] = []          # updates still holding a state or payload at each fold
        self.held: list[int] = []           # bytes the stream holds after each fold
        self.payloads: list[weakref.ref] = []

    def fold(self, update: ClientUpdate) -> None:
        self.alive.append(1 + sum(1 for u in self.folded if u.state or u.payload))
        self.inner.fold(update)
        self.folded.append(update)
        self.held.append(_held_bytes(self.inner, set()))
        self.payloads.extend(weakref.ref(t) for t in _leaves(update.payload))

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.inner.finish(updates)


@pytest.mark.parametrize("cls", [Scaffold, FedLCScaffold, FLFCR])
def test_a_round_holds_one_clients_state_and_payload_at_a_time(cls) -> None:
    run = Run(cls, momentum=0.9, batch_norm=True)
    reference = Run(cls, momentum=0.9, batch_norm=True)
    watched: list[Watched] = []
    begin = run.algorithm.begin_aggregate

    def watching(start):
        watched.append(Watched(begin(start)))
        return watched[-1]

    run.algorithm.begin_aggregate = watching
    # about one model (the running average, and c of the same shapes) plus FL-FCR's fixed-size pool
    # (float64 counts, means, packed second moments, and the index pairs) and reported counts
    model_bytes = _held_bytes(run.global_state, set())
    packed = HIDDEN * (HIDDEN + 1) // 2
    pool_bytes = 8 * NUM_CLASSES * (1 + HIDDEN + packed) + 2 * 8 * packed
    reported_bytes = 8 * len(SIZES) * NUM_CLASSES
    for r in range(1, 3):
        _assert_identical(run.round(r), reference.round(r))  # watching changes nothing
        stream = watched[-1]
        assert len(stream.folded) == len(SCHEDULE[r - 1])
        assert stream.alive == [1] * len(stream.folded)
        assert all(not u.state and not u.payload for u in stream.folded)  # the engine dropped them all
        # what the stream holds does not grow with the clients folded: one running sum per quantity
        assert stream.held == [stream.held[0]] * len(stream.held)
        assert stream.held[0] <= 2 * model_bytes + pool_bytes + reported_bytes
        gc.collect()
        assert all(ref() is None for ref in stream.payloads), "a folded payload is still referenced"


# ------------------------------------------------------------------ the incremental pool

def test_class_statistics_pool_is_eq5_6_of_the_pooled_raw_features() -> None:
    x, y, indices = _data()
    pool = ClassStatisticsPool(NUM_CLASSES, DIM)
    for ix in indices:
        pool.add(*class_feature_statistics(x[ix], y[ix], NUM_CLASSES))
    total, mean, cov = pool.result()
    assert torch.equal(total, torch.bincount(y, minlength=NUM_CLASSES))
    for c in range(NUM_CLASSES):
        v = x[y == c].double()
        assert torch.allclose(mean[c], v.mean(0), atol=1e-12)
        assert torch.allclose(symmetric_unpack(cov[c], DIM), torch.cov(v.T, correction=1), atol=1e-12)
    # and bit for bit the one-shot pooling, client by client in the same order
    one_shot = _pool_all_at_once((class_feature_statistics(x[ix], y[ix], NUM_CLASSES) for ix in indices),
                                 NUM_CLASSES, DIM)
    assert all(torch.equal(a, b) for a, b in zip(pool.result(), one_shot))
