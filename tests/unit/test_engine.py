"""The simulation engine: sampling, order independence, determinism, resume, NaN guard,
evaluation, communication accounting and checkpoints.

Expected values are derived by hand (literals, math) or from a second, independent run;
never by re-running the function under test on the same input and calling that "expected".
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedskew import paths
from fedskew.config import load_params
from fedskew.engine.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from fedskew.engine.evaluate import evaluate
from fedskew.engine.sampling import client_seed, clients_per_round, sampling_schedule
from fedskew.engine.rounds import NonFiniteError, train_client
from fedskew.engine.simulation import RunStopped, run_training
from fedskew.fl import ALGORITHMS
from fedskew.fl.base import ClientContext, FederatedAlgorithm, Fold, TrainingSettings
from fedskew.fl.server_math import weighted_average
from fedskew.models import build_model
from fedskew.runfiles import write_run_files
from tests.helpers import DIGITS_INFO

METHODS = ["fedavg", "fedprox", "fedlc"]


@pytest.fixture
def tiny_params(tiny_params):
    """One partition and one seed (faster `project` set-up); every method in the suite."""
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    tiny_params["suites"]["tiny"]["seeds"] = [0]
    tiny_params["suites"]["tiny"]["methods"] = [*METHODS, "scala"]
    return tiny_params


def _cfg(tiny_params: dict, method: str = "fedavg", **training):
    """The tiny digits/dir0.5 run (4 clients, 2 per round, 4 rounds, eval and checkpoint every 2)."""
    params = copy.deepcopy(tiny_params)
    params["training"]["tiny"].update(training)
    return load_params(params).run("tiny", "digits", "dir0.5", method, 0)


def _canonical(history: list[dict]) -> str:
    """Exact comparison that also treats NaN == NaN (json writes floats with full precision)."""
    return json.dumps(history, sort_keys=True)


def _clear_results(root: Path = Path(".")) -> None:
    shutil.rmtree(root / "results", ignore_errors=True)


# --------------------------------------------------------------------------- sampling

def test_sampling_schedule_shape_range_and_distinct_clients() -> None:
    schedule = np.asarray(sampling_schedule(seed=3, num_clients=10, per_round=4, rounds=25))
    assert schedule.shape == (25, 4)
    assert schedule.min() >= 0 and schedule.max() <= 9
    for row in schedule:
        assert len(set(row.tolist())) == 4  # without replacement within a round
    # over 25 rounds of 4 out of 10, every client is drawn at some point
    assert set(schedule.ravel().tolist()) == set(range(10))


def test_sampling_schedule_full_participation_takes_everyone() -> None:
    schedule = np.asarray(sampling_schedule(0, 5, 5, 3))
    assert [sorted(row.tolist()) for row in schedule] == [[0, 1, 2, 3, 4]] * 3


def test_sampling_schedule_depends_on_seed_only() -> None:
    a = np.asarray(sampling_schedule(7, 20, 5, 30))
    b = np.asarray(sampling_schedule(7, 20, 5, 30))
    c = np.asarray(sampling_schedule(8, 20, 5, 30))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # The schedule cannot depend on the method: the function has no method input at all,
    # so every method of a seed sees the same clients in the same rounds.
    assert list(inspect.signature(sampling_schedule).parameters) == ["seed", "num_clients", "per_round", "rounds"]


def test_sampling_schedule_prefix_is_stable_in_rounds() -> None:
    """A longer run starts with the same rounds as a shorter one (draws are sequential per round)."""
    short = np.asarray(sampling_schedule(1, 10, 3, 5))
    long = np.asarray(sampling_schedule(1, 10, 3, 12))
    assert np.array_equal(long[:5], short)


def test_clients_per_round_by_hand() -> None:
    assert clients_per_round(4, 0.5) == 2
    assert clients_per_round(100, 0.1) == 10
    assert clients_per_round(10, 1.0) == 10
    assert clients_per_round(3, 0.1) == 1  # at least one client


def test_client_seeds_differ_per_round_and_client_and_repeat() -> None:
    seeds = {client_seed(0, r, c) for r in range(1, 6) for c in range(10)}
    assert len(seeds) == 50
    assert client_seed(0, 3, 4) == client_seed(0, 3, 4)
    assert client_seed(0, 3, 4) != client_seed(1, 3, 4)
    assert all(0 <= s < 2 ** 63 for s in seeds)


# --------------------------------------------------------------------------- order independence

def _train_round(method: str, order: list[int], client_indices: dict[int, torch.Tensor], x, y,
                 global_state: dict, seed: int = 5, round_: int = 3) -> dict[int, object]:
    settings = TrainingSettings(local_epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-4)
    algorithm = ALGORITHMS[method](settings, num_clients=len(client_indices), num_classes=10)
    torch.manual_seed(999)
    model = build_model("mlp", DIGITS_INFO)  # a different object; its state is replaced per client
    updates = {}
    for cid in order:
        s = client_seed(seed, round_, cid)
        torch.manual_seed(s)
        idx = client_indices[cid]
        client = ClientContext(cid, round_, idx, torch.bincount(y[idx], minlength=10), torch.Generator().manual_seed(s))
        updates[cid] = train_client(algorithm, model, global_state, x, y, client, "run-order")
    return updates


@pytest.mark.parametrize("method", METHODS)
def test_round_result_does_not_depend_on_client_order(method) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (120,), generator=g)
    client_indices = {0: torch.arange(0, 40), 1: torch.arange(40, 90), 2: torch.arange(90, 120)}
    torch.manual_seed(1)
    global_state = {k: v.clone() for k, v in build_model("mlp", DIGITS_INFO).state_dict().items()}

    forward = _train_round(method, [0, 1, 2], client_indices, x, y, global_state)
    backward = _train_round(method, [2, 1, 0], client_indices, x, y, global_state)
    # Per-client updates: each is computed from the same state, data order and generator,
    # so they must be bit-identical (torch.equal).
    for cid in (0, 1, 2):
        assert forward[cid].num_samples == backward[cid].num_samples == len(client_indices[cid])
        assert forward[cid].train_loss == backward[cid].train_loss
        for key in global_state:
            assert torch.equal(forward[cid].state[key], backward[cid].state[key]), (cid, key)
    # The averages add the clients in the order they were trained; float addition is not
    # associative, so the two sums may differ in the last bits: compare with atol 1e-6.
    avg_f = weighted_average([forward[c].state for c in (0, 1, 2)], [forward[c].num_samples for c in (0, 1, 2)])
    avg_b = weighted_average([backward[c].state for c in (2, 1, 0)], [backward[c].num_samples for c in (2, 1, 0)])
    for key in global_state:
        assert torch.allclose(avg_f[key], avg_b[key], rtol=0, atol=1e-6), key
    # and training did something
    assert any(not torch.equal(avg_f[k], global_state[k]) for k in global_state)


# --------------------------------------------------------------------------- determinism and resume

@pytest.mark.parametrize("method", METHODS)
def test_run_training_is_deterministic(project, tiny_params, method) -> None:
    cfg = _cfg(tiny_params, method)
    first = run_training(cfg)
    _clear_results()
    second = run_training(cfg)
    assert first.resumed_from == second.resumed_from == 0
    assert len(first.history) == 4
    assert _canonical(first.history) == _canonical(second.history)
    assert first.final == second.final


def test_cli_run_files_are_byte_identical(project, tiny_params) -> None:
    cfg = _cfg(tiny_params, "fedlc")
    contents = []
    for _ in range(2):
        _clear_results()
        result = run_training(cfg)
        files = write_run_files(cfg, result.history, result.final)
        assert [f.name for f in files] == ["config.yaml", "history.csv", "metrics.json"]
        contents.append({name: (Path(cfg.path(template))).read_bytes()
                         for name, template in (("metrics", paths.RUN_METRICS), ("history", paths.RUN_HISTORY))})
        # atomic writes leave no temporary files beside the results
        run_dir = Path(cfg.path(paths.RUN_DIR))
        assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "history.csv", "metrics.json"]
    assert contents[0]["metrics"] == contents[1]["metrics"]
    assert contents[0]["history"] == contents[1]["history"]
    metrics = json.loads(contents[0]["metrics"])
    assert metrics["run_id"] == cfg.run_id and metrics["final_round"] == 4
    assert contents[0]["history"].decode().count("\n") == 1 + 4  # header + one row per round


@pytest.mark.parametrize("method, stop", [("fedavg", 2), ("fedprox", 2), ("fedlc", 2), ("fedavg", 3), ("fedavg", 1)])
def test_resume_gives_the_uninterrupted_history(project, tiny_params, method, stop) -> None:
    cfg = _cfg(tiny_params, method)
    assert cfg.training["rounds"] == 4 and cfg.training["checkpoint_every"] == 2
    uninterrupted = run_training(cfg)
    _clear_results()

    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=stop)
    checkpoint = load_checkpoint(Path(cfg.path(paths.CHECKPOINT_DIR)), cfg.run_id)
    assert checkpoint is not None and checkpoint["round"] == stop
    assert [row["round"] for row in checkpoint["history"]] == list(range(1, stop + 1))

    resumed = run_training(cfg)
    assert resumed.resumed_from == stop
    assert _canonical(resumed.history) == _canonical(uninterrupted.history)
    assert resumed.final == uninterrupted.final


def test_checkpoint_of_another_config_is_ignored(project, tiny_params) -> None:
    cfg = _cfg(tiny_params, "fedavg", lr=0.05)
    other = _cfg(tiny_params, "fedavg", lr=0.1)
    assert other.run_id != cfg.run_id
    assert cfg.path(paths.CHECKPOINT_DIR) == other.path(paths.CHECKPOINT_DIR)  # same folder, other run
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    result = run_training(other)
    assert result.resumed_from == 0
    assert [row["round"] for row in result.history] == [1, 2, 3, 4]
    # and it is the run lr=0.1 gives from scratch, not a continuation of the lr=0.05 one
    _clear_results()
    fresh = run_training(other)
    assert _canonical(fresh.history) == _canonical(result.history)


# --------------------------------------------------------------------------- NaN guard

def _assert_names_run_round_client(message: str, run_id: str) -> None:
    assert run_id in message
    assert "round" in message
    assert "client" in message


def test_huge_learning_rate_raises_non_finite_error(project, tiny_params) -> None:
    cfg = _cfg(tiny_params, "fedavg", lr=1e6)
    with pytest.raises(NonFiniteError) as info:
        run_training(cfg)
    _assert_names_run_round_client(str(info.value), cfg.run_id)


def test_nan_loss_raises_non_finite_error_naming_the_client(project, tiny_params, monkeypatch) -> None:
    def nan_loss(self, logits, features, y, client, x=None):
        return logits.sum() * float("nan")

    monkeypatch.setattr(FederatedAlgorithm, "local_loss", nan_loss)
    cfg = _cfg(tiny_params, "fedavg")
    with pytest.raises(NonFiniteError) as info:
        run_training(cfg)
    message = str(info.value)
    _assert_names_run_round_client(message, cfg.run_id)
    assert "round 1" in message
    # 4 clients, 2 per round: the named client is one of round 1's sampled clients
    round_one = np.asarray(sampling_schedule(0, 4, 2, 4))[0].tolist()
    assert any(f"client {c}" in message for c in round_one), message


# --------------------------------------------------------------------------- evaluate

class Logits(nn.Module):
    """A 'model' whose outputs are its inputs: the logits are chosen by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


EVAL_LOGITS = [
    [2.0, 0.0, 0.0, 0.0],  # y=0, predicts 0: right
    [0.0, 1.0, 0.0, 0.0],  # y=0, predicts 1: wrong
    [0.0, 3.0, 0.0, 0.0],  # y=1, predicts 1: right
    [1.0, 2.0, 0.0, 0.0],  # y=1, predicts 1: right
    [0.0, 0.0, 0.0, 1.0],  # y=1, predicts 3 (a class absent from y): wrong
    [0.0, 0.0, 1.0, 0.0],  # y=2, predicts 2: right
]
EVAL_Y = [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize("batch_size", [2048, 4, 1])
def test_evaluate_matches_hand_metrics(batch_size) -> None:
    model = Logits().train()
    out = evaluate(model, torch.tensor(EVAL_LOGITS), torch.tensor(EVAL_Y), num_classes=4, batch_size=batch_size)
    assert out["acc"] == pytest.approx(4 / 6, abs=1e-12)
    # recalls: class 0: 1/2, class 1: 2/3, class 2: 1/1; class 3 is absent from y
    assert out["balanced_acc"] == pytest.approx((1 / 2 + 2 / 3 + 1) / 3, abs=1e-12)
    per_class = out["per_class_acc"]
    assert len(per_class) == 4
    assert per_class[:3] == pytest.approx([0.5, 2 / 3, 1.0], abs=1e-12)
    assert math.isnan(per_class[3])
    expected_loss = sum(-row[t] + math.log(sum(math.exp(z) for z in row)) for row, t in zip(EVAL_LOGITS, EVAL_Y)) / 6
    assert out["loss"] == pytest.approx(expected_loss, abs=1e-6)
    assert model.training  # the mode is restored


def test_evaluate_restores_eval_mode() -> None:
    model = Logits().eval()
    evaluate(model, torch.tensor(EVAL_LOGITS), torch.tensor(EVAL_Y), num_classes=4)
    assert not model.training


# --------------------------------------------------------------------------- communication

def test_bytes_up_and_down_count_the_model_state(project, tiny_params) -> None:
    cfg = _cfg(tiny_params, "fedavg")
    assert cfg.training["model"] == "mlp"
    # mlp on 8x8 digits: fc1 64*200 + 200, fc2 200*200 + 200, head 200*10 + 10 parameters
    params = (64 * 200 + 200) + (200 * 200 + 200) + (200 * 10 + 10)
    assert params == 55210
    model_bytes = params * 4  # float32
    per_round = 2 * model_bytes  # 4 clients at participation 0.5: 2 per round
    result = run_training(cfg)
    assert len(result.history) == 4
    for row in result.history:
        assert row["clients"] == 2
        assert row["bytes_up"] == per_round == 441680
        assert row["bytes_down"] == per_round
    assert result.final["total_bytes_up"] == 4 * per_round
    assert result.final["total_bytes_down"] == 4 * per_round


# --------------------------------------------------------------------------- checkpoints

def test_run_checkpoints_leave_no_temporary_files(project, tiny_params) -> None:
    cfg = _cfg(tiny_params, "fedprox")
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    directory = Path(cfg.path(paths.CHECKPOINT_DIR))
    assert [p.name for p in directory.iterdir()] == [CHECKPOINT_NAME]
    run_training(cfg)
    assert [p.name for p in directory.iterdir()] == [CHECKPOINT_NAME]
    assert load_checkpoint(directory, cfg.run_id)["round"] == 4


def test_load_checkpoint_checks_run_id(tmp_path) -> None:
    assert load_checkpoint(tmp_path / "absent", "abc") is None
    payload = {"run_id": "abc", "round": 3, "global_state": {"w": torch.tensor([1.0, 2.0])},
               "algorithm_state": {}, "history": [{"round": 1}, {"round": 2}, {"round": 3}]}
    path = save_checkpoint(tmp_path / "ck", payload)
    assert path == tmp_path / "ck" / CHECKPOINT_NAME
    assert [p.name for p in (tmp_path / "ck").iterdir()] == [CHECKPOINT_NAME]
    assert load_checkpoint(tmp_path / "ck", "other-run") is None
    loaded = load_checkpoint(tmp_path / "ck", "abc")
    assert loaded["round"] == 3 and [row["round"] for row in loaded["history"]] == [1, 2, 3]
    assert torch.equal(loaded["global_state"]["w"], torch.tensor([1.0, 2.0]))


def _payload(run_round: int) -> dict:
    return {"run_id": "abc", "round": run_round, "global_state": {"w": torch.zeros(2)}, "algorithm_state": {},
            "history": [{"round": r} for r in range(1, run_round + 1)]}


def test_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    save_checkpoint(tmp_path, _payload(2))
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, _payload(4))
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(tmp_path, "abc")["round"] == 2


def test_device_auto_picks_cuda_only_when_present_and_cuda_without_gpu_fails_clearly(monkeypatch) -> None:
    import torch

    from fedskew.engine.simulation import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="no CUDA device.*'cpu' or 'auto'"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@pytest.mark.parametrize("method", ["fedavg", "scala"])
def test_augmented_training_is_seeded_resumable_and_changes_only_training(project, tiny_params, method) -> None:
    plain = run_training(_cfg(tiny_params, method)).history
    _clear_results()
    cfg = _cfg(tiny_params, method, augmentation="crop_flip")
    assert cfg.run_id != _cfg(tiny_params, method).run_id  # a different protocol, a different run
    augmented = run_training(cfg).history
    assert _canonical(augmented) != _canonical(plain)
    _clear_results()
    with pytest.raises(RunStopped):
        run_training(cfg, stop_after_round=2)
    assert _canonical(run_training(cfg).history) == _canonical(augmented)  # per-client generators: resumable


def test_streamed_fedavg_round_equals_averaging_the_kept_updates_bit_for_bit() -> None:
    from fedskew.engine.rounds import federated_round

    class KeepAll(Fold):  # every update's state kept to the end of the round, then averaged at once
        def __init__(self, start):
            super().__init__(start)
            self.states, self.sizes = [], []

        def fold(self, update):
            self.states.append({k: v.clone() for k, v in update.state.items()})
            self.sizes.append(update.num_samples)

        def finish(self, updates):
            return weighted_average(self.states, self.sizes)

    class KeepsUpdates(FederatedAlgorithm):  # the same average, through the list-based function
        def begin_aggregate(self, start):
            return KeepAll(start)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (100,), generator=g)
    parts = [torch.arange(0, 13), torch.arange(13, 60), torch.arange(60, 100)]
    settings = TrainingSettings(local_epochs=1, batch_size=16, lr=0.1, momentum=0.9, weight_decay=0.0)
    torch.manual_seed(0)
    model = build_model("mlp", DIGITS_INFO)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def clients():
        return [ClientContext(k, 1, p, torch.bincount(y[p], minlength=10), torch.Generator().manual_seed(k), k)
                for k, p in enumerate(parts)]

    streamed = federated_round(FederatedAlgorithm(settings, 3, 10), model, state, clients(), x, y, "r")
    kept = federated_round(KeepsUpdates(settings, 3, 10), model, state, clients(), x, y, "r")
    assert streamed.global_state.keys() == kept.global_state.keys()
    assert all(torch.equal(streamed.global_state[k], kept.global_state[k]) for k in kept.global_state)
    assert streamed.traffic == kept.traffic and streamed.client_losses == kept.client_losses


def test_progress_logs_a_line_every_tenth_of_the_run_with_rate_and_eta(caplog, monkeypatch) -> None:
    from fedskew.engine.simulation import Progress

    monkeypatch.setattr("sys.stderr.isatty", lambda: False)  # as in a job's log file
    progress = Progress("abc", rounds=20, start=1)
    with caplog.at_level(logging.INFO, logger="fedskew.engine.simulation"):
        for r in range(1, 21):
            progress.update({"round": r, **({"test_acc": r / 100} if r % 5 == 0 else {})})
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 10 and lines[0].startswith("abc round 2/20 acc n/a ")
    assert lines[-1].startswith("abc round 20/20 acc 0.2000 ") and lines[-1].endswith("ETA 0:00:00")
    assert all("rounds/s ETA" in line for line in lines)


def test_a_streamed_round_reads_the_client_state_without_copying_it(project, tiny_params) -> None:
    from fedskew.engine.rounds import train_client
    from fedskew.fl.base import ClientContext, TrainingSettings
    from fedskew.fl.fedavg import FedAvg
    from fedskew.models import build_model, example_info

    model = build_model("mlp", example_info("mlp"))
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    algorithm = FedAvg(TrainingSettings(1, 8, 0.1, 0.0, 0.0), 1, 10)
    x, y = torch.randn(16, 64), torch.arange(16) % 10
    client = ClientContext(0, 1, torch.arange(16), torch.bincount(y, minlength=10), torch.Generator().manual_seed(0))
    shared = train_client(algorithm, model, global_state, x, y, client, "r", copy_state=False).state
    assert all(shared[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())
    client.generator.manual_seed(0)
    copied = train_client(algorithm, model, global_state, x, y, client, "r").state
    assert all(copied[k].data_ptr() != v.data_ptr() for k, v in model.state_dict().items())
    assert all(torch.equal(copied[k], v) for k, v in model.state_dict().items())


def test_every_federated_method_streams_its_aggregation() -> None:
    """No method holds one state per participant until the end of the round: the aggregation is always the
    method's fold, which the engine streams, and a method that would aggregate the whole list is refused."""
    with pytest.raises(TypeError, match="begin_aggregate"):
        class WholeList(FederatedAlgorithm):
            def aggregate(self, global_state, updates, parameters):
                return weighted_average([u.state for u in updates], [u.num_samples for u in updates])
