"""The simulation loop: build the run, restore it, then round after round train, check, evaluate, record.

`run_training` reads as the protocol: the process set-up (threads, CPU kernels, device, precision) and the run's
pieces (data, method, model, schedule, execution path: `_build_run`), the checkpoint to continue from
(`_restore_state`), then each round (`_train_round`) and its record (the history row, a checkpoint when due).
The loop has no per-method branches: a round is either the federated round (fedskew.engine.rounds: local
training through the FederatedAlgorithm hooks, then the aggregation) or a split method's own `run_round`
(fedskew.sfl); both return a RoundResult.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedskew import metrics, paths
from fedskew.numerics import cpu_pin, gemm
from fedskew.algorithms import ALGORITHMS
from fedskew.config import ConfigError, RunConfig
from fedskew.data import registry
from fedskew.data.augment import Augmenter, make_augmenter
from fedskew.data.partitions import load_partition
from fedskew.engine.checkpoint import CHECKPOINT_NAME, CorruptCheckpoint, load_checkpoint, save_checkpoint
from fedskew.engine.diagnostics import LocalDiagnostics
from fedskew.engine.evaluate import evaluate
from fedskew.engine.precision import configure_precision, precision_scope
from fedskew.engine.sampling import client_seed, clients_per_round, derive_seed, sampling_schedule
from fedskew.engine.rounds import NonFiniteError, check_finite, federated_round
from fedskew.engine.summary import evaluation_row, summarise_finished_run
from fedskew.engine.vectorised import choose_execution, choose_split_execution, round_parallelism
from fedskew.families import Family
from fedskew.fl.base import ClientContext, RoundResult, TrainingSettings
from fedskew.models import build_model
from fedskew.models.split import SplitView, split_model
from fedskew.sfl.base import SplitRound
from fedskew.training_config import TrainingConfig

log = logging.getLogger(__name__)


_SERVER_STREAM = 3  # randomness of the server side of a split round (see engine.sampling)


class RunStopped(Exception):
    """Raised by `stop_after_round` (used to test resuming): the run stopped on purpose."""


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    final: dict[str, Any]
    resumed_from: int
    loop_seconds: float = 0.0  # wall time of the rounds run in this process (the rest of a job is fixed cost)
    execution: str = "sequential"  # how this process trained the clients (training.execution, resolved)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("training.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


class Progress:
    """One log line every `every` rounds (round, accuracy, rounds per second, ETA); on a terminal,
    a live line instead. Rates count only the rounds run in this process (not the resumed ones)."""

    def __init__(self, run_id: str, rounds: int, start: int, every: int | None = None) -> None:
        self.run_id, self.rounds, self.start = run_id, rounds, start
        self.every = every or max(1, rounds // 10)
        self.on_terminal = sys.stderr.isatty()
        self.started = time.perf_counter()
        self.accuracy: float | None = None

    def update(self, row: dict[str, Any]) -> None:
        self.accuracy = row.get(metrics.reported().column, self.accuracy)  # the number tables report
        round_ = row["round"]
        done = round_ - self.start + 1
        elapsed = time.perf_counter() - self.started
        rate = done / elapsed if elapsed > 0 else float("inf")
        eta = (self.rounds - round_) / rate if rate > 0 else float("inf")
        acc = "n/a" if self.accuracy is None else f"{self.accuracy:.4f}"
        line = f"{self.run_id} round {round_}/{self.rounds} acc {acc} {rate:.2f} rounds/s ETA {_duration(eta)}"
        if self.on_terminal:
            print(f"\r{line}", end="" if round_ < self.rounds else "\n", file=sys.stderr, flush=True)
        elif round_ % self.every == 0 or round_ == self.rounds:
            log.info(line)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def run_training(cfg: RunConfig, root: Path = Path("."), stop_after_round: int | None = None,
                 threads: int | None = None, on_round: Callable[[dict[str, Any]], None] | None = None,
                 should_stop: Callable[[int], bool] | None = None) -> RunResult:
    """Run (or resume) one configuration to its last round and return its history.

    Checkpoints go to results/checkpoints/...; a checkpoint of the same run id is resumed
    from, one of another config is ignored. `on_round(row)` receives every history row as it
    is made, the resumed ones first (live tracking). `stop_after_round` raises RunStopped after
    checkpointing that round (for tests of resuming); `should_stop(round)`, asked after every
    round but the last, does the same when it returns True (a packed runner's time limit).
    """
    rounds = cfg.train.rounds
    run = _build_run(cfg, root, _set_up_process(cfg.train, threads))
    state = _restore_state(run)
    run.diagnostics = _local_diagnostics(run)
    progress = Progress(cfg.run_id, rounds, state.start)
    report = on_round or (lambda row: None)
    for row in state.history:  # the resumed rounds first: a live tracker shows the whole run
        report(row)
    round_ = state.start
    loop_started = time.perf_counter()
    try:
        for round_ in range(state.start, rounds + 1):
            row = _train_round(run, state, round_)
            state.history.append(row)
            progress.update(row)
            report(row)
            stop = round_ == stop_after_round or (should_stop is not None and round_ < rounds and should_stop(round_))
            if round_ % cfg.train.checkpoint_every == 0 or round_ == rounds or stop:
                _save(run, state, round_)
            if stop:
                raise RunStopped(f"stopped after round {round_}")
    except NonFiniteError as error:
        error.round, error.history = round_, state.history
        raise
    return _finished(run, state, time.perf_counter() - loop_started)


@dataclass
class _RunData:
    """A run's tensors on its device, loaded once: a client is a set of indices into the training set."""

    dataset: registry.Dataset           # the prepared dataset: its classes and pixel statistics
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    client_indices: list[torch.Tensor]
    label_counts: torch.Tensor          # clients × classes


@dataclass
class _Run:
    """What a run trains with, built once (`_build_run`) and the same in every round."""

    cfg: RunConfig
    device: torch.device
    data: _RunData
    algorithm: Any                      # a federated or a split method (fedskew.algorithms)
    model: torch.nn.Module
    view: SplitView | None              # the cut model of a split method; None for a federated one
    augment: Augmenter | None           # training batches only; evaluation sees the plain test set
    schedule: np.ndarray                # rounds × participants: the client-sampling schedule of the seed
    checkpoint_dir: Path
    vectorise: bool = False             # all of a round's participants at once (training.execution, resolved)
    diagnostics: LocalDiagnostics | None = None


@dataclass
class _State:
    """Where a run stands: the global model after the last round trained, the history so far, the next round."""

    global_state: dict[str, torch.Tensor]
    history: list[dict[str, Any]]
    start: int                          # the first round this process trains


def _set_up_process(train: TrainingConfig, threads: int | None) -> torch.device:
    """The process-wide settings a run computes under: ATen's threads, the portable CPU kernels, the device with
    its deterministic kernels, the precision. Returns the device."""
    torch.set_num_threads(threads or train.threads)
    cpu_pin.configure_torch()  # CPU kernels whose results do not depend on the CPU model (fedskew.numerics.cpu_pin)
    gemm.enabled()  # the layers' products: refuses an OpenBLAS loaded before the pin, fixes its threads
    device = resolve_device(train.device)
    if device.type == "cuda":
        # CPU kernels used here are deterministic already; on GPU ask for deterministic
        # kernels where they exist (some remain non-deterministic: see docs/reliability.md).
        # cuBLAS needs a fixed workspace for deterministic matmuls (read at CUDA init).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    configure_precision(train.precision, device)
    return device


def _build_run(cfg: RunConfig, root: Path, device: torch.device) -> _Run:
    """The data, the method and its model, the augmentation, the client schedule and the execution path, in the
    order that fixes the run's random draws: the model is drawn from the seed's own stream, the same for every
    method of a seed."""
    data = _load_data(cfg, root, device)
    torch.manual_seed(derive_seed(cfg.seed, 0))  # same initial model for every method of a seed
    algorithm = _build_algorithm(cfg, data)
    model, view = _build_model(cfg, algorithm, device)
    augment = make_augmenter(cfg.train.augmentation, data.dataset.pixel_mean, data.dataset.pixel_std)
    num_clients = len(data.client_indices)
    schedule = sampling_schedule(cfg.seed, num_clients, clients_per_round(num_clients, cfg.train.participation),
                                 cfg.train.rounds)
    run = _Run(cfg, device, data, algorithm, model, view, augment, schedule, root / cfg.path(paths.CHECKPOINT_DIR))
    run.vectorise = _choose_execution(run)
    return run


def _load_data(cfg: RunConfig, root: Path, device: torch.device) -> _RunData:
    """The prepared dataset and the run's partition of it (the workflow's download and partition jobs made both)."""
    dataset = registry.load(cfg.dataset, cfg.dataset_spec, root)
    partition = load_partition(root / cfg.path(paths.PARTITION))
    return _RunData(dataset, dataset.x_train.to(device), dataset.y_train.to(device), dataset.x_test.to(device),
                    dataset.y_test.to(device),
                    [torch.from_numpy(np.asarray(idx, dtype=np.int64)) for idx in partition.client_indices],
                    torch.from_numpy(np.asarray(partition.label_counts)).to(device))


def _build_algorithm(cfg: RunConfig, data: _RunData):
    """The run's method with its hyperparameters, told each client's label counts."""
    train = cfg.train
    settings = TrainingSettings(train.local_epochs, train.batch_size, train.lr, train.momentum, train.weight_decay,
                                train.optimizer)
    method_spec = dict(cfg.method_spec)
    algorithm = ALGORITHMS[method_spec.pop("algorithm")](settings, len(data.client_indices),
                                                         data.dataset.num_classes, **method_spec)
    algorithm.set_label_counts(data.label_counts)
    return algorithm


def _build_model(cfg: RunConfig, algorithm, device: torch.device) -> tuple[torch.nn.Module, SplitView | None]:
    """The run's model on its device: cut at its split point for a split method, adapted by a federated one."""
    model = build_model(cfg.train.model, registry.dataset_info(cfg.dataset_spec))
    view: SplitView | None = None
    if algorithm.family == Family.SPLIT:
        view = split_model(model, cfg.train.split_point or model.default_split)
    else:
        model = algorithm.adapt_model(model)
    return model.to(device), view


def _choose_execution(run: _Run) -> bool:
    """Whether the run's rounds train their participants at once (training.execution, resolved for this method,
    model and device); the training log says which path and why."""
    train = run.cfg.train
    if run.view is None:
        parallelism = round_parallelism(run.schedule, [len(idx) for idx in run.data.client_indices],
                                        train.local_epochs, train.batch_size)
        vectorise, why = choose_execution(train.execution, run.algorithm, run.model, run.augment is not None,
                                          run.device, parallelism)
    else:
        vectorise, why = choose_split_execution(train.execution, run.algorithm, run.view.client, run.device)
    log.info("run %s: %s", run.cfg.run_id, why)
    return vectorise


def _restore_state(run: _Run) -> _State:
    """Where the run continues from: its checkpoint, where one of this run id is found (the algorithm's state is
    restored with it), else the freshly built model before round 1."""
    global_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    checkpoint = load_checkpoint(run.checkpoint_dir, run.cfg.run_id,
                                 lambda payload: _restore(payload, run.model, run.algorithm))
    if checkpoint is None:
        return _State(global_state, [], 1)
    log.info("run %s: resuming after round %d from %s", run.cfg.run_id, checkpoint["round"],
             run.checkpoint_dir / CHECKPOINT_NAME)
    return _State({k: v.to(run.device) for k, v in checkpoint["global_state"].items()}, checkpoint["history"],
                  checkpoint["round"] + 1)


def _local_diagnostics(run: _Run) -> LocalDiagnostics | None:
    """The measurement of local drift (training.local_diagnostics), for federated methods only."""
    cfg = run.cfg
    if not cfg.train.local_diagnostics:
        return None
    if run.view is not None:
        raise ConfigError(f"training.{cfg.suite}.local_diagnostics needs a federated method; {cfg.method} is a "
                          "split method, which has no local model of the whole network")
    return LocalDiagnostics(run.data.x_test, run.data.y_test, run.data.dataset.num_classes)


def _train_round(run: _Run, state: _State, round_: int) -> dict[str, Any]:
    """One round of the protocol: the round's participants train from the global model and the method aggregates;
    the result is checked, becomes the global model, and is evaluated where the round is evaluated. Returns the
    round's history row."""
    train = run.cfg.train
    clients = _participants(run, round_)
    evaluated = round_ % train.eval_every == 0 or round_ == train.rounds
    diagnose = run.diagnostics if evaluated else None
    with precision_scope(train.precision, run.device):
        if diagnose is not None:
            diagnose.begin_round(run.model, state.global_state)
        outcome = _round_outcome(run, state.global_state, clients, round_, diagnose)
    check_finite(outcome, run.cfg.run_id, round_)
    state.global_state = outcome.global_state
    row = _history_row(round_, clients, outcome)
    if diagnose is not None:
        row.update(diagnose.row())
    if evaluated:
        with precision_scope(train.precision, run.device):
            evaluation = run.algorithm.evaluate_global(
                run.model, state.global_state,
                lambda m: evaluate(m, run.data.x_test, run.data.y_test, run.data.dataset.num_classes))
        row.update(evaluation_row(evaluation))
    # after evaluation: a method may report numbers from it (SplitFedV3's personalised accuracy)
    row.update({f"method_{key}": value for key, value in run.algorithm.round_metrics().items()})
    return row


def _participants(run: _Run, round_: int) -> list[ClientContext]:
    """The round's clients in ascending id, each with its own generator, seeded by (seed, round, client)."""
    clients = []
    for client_id in sorted(int(c) for c in run.schedule[round_ - 1]):
        seed = client_seed(run.cfg.seed, round_, client_id)
        clients.append(ClientContext(client_id, round_, run.data.client_indices[client_id],
                                     run.data.label_counts[client_id], torch.Generator().manual_seed(seed), seed))
    return clients


def _round_outcome(run: _Run, global_state: dict[str, torch.Tensor], clients: list[ClientContext], round_: int,
                   diagnose: LocalDiagnostics | None) -> RoundResult:
    """The family's round: the federated round (local training, then the method's aggregation) or a split
    method's own."""
    if run.view is None:
        return federated_round(run.algorithm, run.model, global_state, clients, run.data.x_train, run.data.y_train,
                               run.cfg.run_id, run.augment, diagnose.after_local if diagnose else None, run.vectorise)
    server_seed = derive_seed(run.cfg.seed, _SERVER_STREAM, round_)
    torch.manual_seed(server_seed)  # e.g. dropout in the server part
    return run.algorithm.run_round(SplitRound(
        round_, run.view, global_state, clients, run.data.x_train, run.data.y_train,
        torch.Generator().manual_seed(server_seed), run.augment, run.vectorise))


def _history_row(round_: int, clients: list[ClientContext], outcome: RoundResult) -> dict[str, Any]:
    """A round's training figures: the sample-weighted mean loss of its participants and the bytes sent."""
    total = sum(outcome.client_samples.values())
    return {
        "round": round_,
        "train_loss": sum(outcome.client_losses[c] * n for c, n in outcome.client_samples.items()) / total,
        "clients": len(clients),
        "bytes_up": sum(v for k, v in outcome.traffic.items() if k.startswith("up_")),
        "bytes_down": sum(v for k, v in outcome.traffic.items() if k.startswith("down_")),
        **{f"bytes_{key}": value for key, value in sorted(outcome.traffic.items())},
    }


def _save(run: _Run, state: _State, round_: int) -> None:
    """A checkpoint after `round_`: everything needed to continue bit-identically."""
    save_checkpoint(run.checkpoint_dir, {
        "run_id": run.cfg.run_id, "round": round_, "global_state": state.global_state,
        "algorithm_state": run.algorithm.state_dict(), "history": state.history,
    })


def _finished(run: _Run, state: _State, loop_seconds: float) -> RunResult:
    """The run's result once its last round is trained."""
    final = summarise_finished_run(state.history)
    if run.view is not None:  # the cut used, also when params.yaml left it to the model's default
        final["split_point"] = run.view.point
    return RunResult(state.history, final, state.start - 1, loop_seconds,
                     "vectorised" if run.vectorise else "sequential")


def _restore(payload: dict[str, Any], model: torch.nn.Module, algorithm) -> None:
    """Give `algorithm` the checkpoint's state, after checking that `model` can take its global state;
    CorruptCheckpoint (the algorithm left as it was) when either does not fit this run."""
    expected = {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    found = {name: (tuple(t.shape), t.dtype) for name, t in payload["global_state"].items()}
    if found != expected:
        differ = sorted(name for name in expected.keys() | found.keys() if expected.get(name) != found.get(name))
        raise CorruptCheckpoint(f"its global_state does not fit this run's model (tensors that differ: "
                                f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''})")
    fresh = copy.deepcopy(algorithm.state_dict())
    try:
        algorithm.load_state_dict(payload["algorithm_state"])
    except Exception as error:  # noqa: BLE001 - a state of another shape fails each method in its own way
        algorithm.load_state_dict(fresh)
        raise CorruptCheckpoint(f"its algorithm_state does not fit {algorithm.name}: "
                                f"{type(error).__name__}: {error}") from error


