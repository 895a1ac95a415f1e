"""The simulation loop: sample clients, run the round, check, evaluate, checkpoint.

The loop has no per-method branches: a round is either the federated round
(fedskew.engine.rounds: local training through the FederatedAlgorithm hooks, then the
aggregation) or a split method's own `run_round` (fedskew.sfl); both return a RoundResult.
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

from fedskew import paths
from fedskew.numerics import cpu_pin, gemm
from fedskew.algorithms import ALGORITHMS
from fedskew.config import ConfigError, RunConfig
from fedskew.data import registry
from fedskew.data.augment import make_augmenter
from fedskew.data.partitions import load_partition
from fedskew.engine.checkpoint import CHECKPOINT_NAME, CorruptCheckpoint, load_checkpoint, save_checkpoint
from fedskew.engine.diagnostics import LocalDiagnostics
from fedskew.engine.evaluate import evaluate
from fedskew.engine.precision import configure_precision, precision_scope
from fedskew.engine.sampling import (
    client_seed,
    clients_per_round,
    derive_seed,
    sampling_schedule,
)
from fedskew.engine.rounds import NonFiniteError, check_finite, federated_round
from fedskew.engine.summary import evaluation_row, summarise
from fedskew.engine.vectorised import choose_execution, choose_split_execution, round_parallelism
from fedskew.fl.base import ClientContext, TrainingSettings
from fedskew.models import build_model
from fedskew.models.split import SplitView, split_model
from fedskew.sfl.base import SplitRound

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
        self.accuracy = row.get("test_acc", self.accuracy)
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
    training = cfg.training
    torch.set_num_threads(threads or training["threads"])
    cpu_pin.configure_torch()  # CPU kernels whose results do not depend on the CPU model (fedskew.numerics.cpu_pin)
    gemm.enabled()  # the layers' products: refuses an OpenBLAS loaded before the pin, fixes its threads
    device = resolve_device(training["device"])
    if device.type == "cuda":
        # CPU kernels used here are deterministic already; on GPU ask for deterministic
        # kernels where they exist (some remain non-deterministic: see docs/reliability.md).
        # cuBLAS needs a fixed workspace for deterministic matmuls (read at CUDA init).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    precision = training.get("precision", "fp32")
    configure_precision(precision, device)

    data = registry.load(cfg.dataset, cfg.dataset_spec, root)
    partition = load_partition(root / cfg.path(paths.PARTITION))
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    num_clients = len(partition.client_indices)
    client_indices = [torch.from_numpy(np.asarray(idx, dtype=np.int64)) for idx in partition.client_indices]
    label_counts = torch.from_numpy(np.asarray(partition.label_counts)).to(device)

    torch.manual_seed(derive_seed(cfg.seed, 0))  # same initial model for every method of a seed
    info = registry.dataset_info(cfg.dataset_spec)
    settings = TrainingSettings(training["local_epochs"], training["batch_size"], training["lr"],
                                training["momentum"], training["weight_decay"], training.get("optimizer", "sgd"))
    method_spec = dict(cfg.method_spec)
    algorithm = ALGORITHMS[method_spec.pop("algorithm")](settings, num_clients, data.num_classes, **method_spec)
    algorithm.set_label_counts(label_counts)
    model = build_model(training["model"], info)
    view: SplitView | None = None
    if algorithm.family == "split":
        view = split_model(model, training.get("split_point") or model.default_split)
    else:
        model = algorithm.adapt_model(model)
    model = model.to(device)
    # Training batches only; evaluation always sees the plain test set.
    augment = make_augmenter(training.get("augmentation", "none"), data.pixel_mean, data.pixel_std)
    rounds = training["rounds"]
    schedule = sampling_schedule(cfg.seed, num_clients, clients_per_round(num_clients, training["participation"]),
                                 rounds)
    vectorise = False
    if view is None:
        parallelism = round_parallelism(schedule, [len(idx) for idx in client_indices], training["local_epochs"],
                                        training["batch_size"])
        vectorise, why = choose_execution(training.get("execution", "sequential"), algorithm, model,
                                          augment is not None, device, parallelism)
        log.info("run %s: %s", cfg.run_id, why)
    else:
        vectorise, why = choose_split_execution(training.get("execution", "sequential"), algorithm, view.client,
                                                device)
        log.info("run %s: %s", cfg.run_id, why)

    checkpoint_dir = root / cfg.path(paths.CHECKPOINT_DIR)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    history: list[dict[str, Any]] = []
    start = 1
    checkpoint = load_checkpoint(checkpoint_dir, cfg.run_id, lambda payload: _restore(payload, model, algorithm))
    if checkpoint is not None:
        global_state = {k: v.to(device) for k, v in checkpoint["global_state"].items()}
        history = checkpoint["history"]
        start = checkpoint["round"] + 1
        log.info("run %s: resuming after round %d from %s", cfg.run_id, checkpoint["round"],
                 checkpoint_dir / CHECKPOINT_NAME)

    diagnostics = None
    if training.get("local_diagnostics", False):
        if view is not None:
            raise ConfigError(f"training.{cfg.suite}.local_diagnostics needs a federated method; {cfg.method} is a "
                              "split method, which has no local model of the whole network")
        diagnostics = LocalDiagnostics(x_test, y_test, data.num_classes)
    progress = Progress(cfg.run_id, rounds, start)
    if on_round is not None:
        for row in history:
            on_round(row)
    round_ = start
    loop_started = time.perf_counter()
    try:
        for round_ in range(start, rounds + 1):
            clients = []
            for client_id in sorted(int(c) for c in schedule[round_ - 1]):
                seed = client_seed(cfg.seed, round_, client_id)
                clients.append(ClientContext(client_id, round_, client_indices[client_id], label_counts[client_id],
                                             torch.Generator().manual_seed(seed), seed))
            evaluated = round_ % training["eval_every"] == 0 or round_ == rounds
            diagnose = diagnostics if evaluated and diagnostics is not None else None
            with precision_scope(precision, device):
                if diagnose is not None:
                    diagnose.begin_round(model, global_state)
                if view is None:
                    outcome = federated_round(algorithm, model, global_state, clients, x_train, y_train, cfg.run_id,
                                              augment, diagnose.after_local if diagnose else None, vectorise)
                else:
                    torch.manual_seed(derive_seed(cfg.seed, _SERVER_STREAM, round_))  # e.g. dropout in the server part
                    outcome = algorithm.run_round(SplitRound(
                        round_, view, global_state, clients, x_train, y_train,
                        torch.Generator().manual_seed(derive_seed(cfg.seed, _SERVER_STREAM, round_)), augment,
                        vectorise))
            check_finite(outcome, cfg.run_id, round_)
            global_state = outcome.global_state
            total = sum(outcome.client_samples.values())
            row: dict[str, Any] = {
                "round": round_,
                "train_loss": sum(outcome.client_losses[c] * n for c, n in outcome.client_samples.items()) / total,
                "clients": len(clients),
                "bytes_up": sum(v for k, v in outcome.traffic.items() if k.startswith("up_")),
                "bytes_down": sum(v for k, v in outcome.traffic.items() if k.startswith("down_")),
                **{f"bytes_{key}": value for key, value in sorted(outcome.traffic.items())},
            }
            if diagnose is not None:
                row.update(diagnose.row())
            if evaluated:
                with precision_scope(precision, device):
                    metrics = algorithm.evaluate_global(
                        model, global_state, lambda m: evaluate(m, x_test, y_test, data.num_classes))
                row.update(evaluation_row(metrics))
            # after evaluation: a method may report numbers from it (SplitFedV3's personalised accuracy)
            row.update({f"method_{key}": value for key, value in algorithm.round_metrics().items()})
            history.append(row)
            progress.update(row)
            if on_round is not None:
                on_round(row)
            stop = round_ == stop_after_round or (should_stop is not None and round_ < rounds and should_stop(round_))
            if round_ % training["checkpoint_every"] == 0 or round_ == rounds or stop:
                save_checkpoint(checkpoint_dir, {
                    "run_id": cfg.run_id, "round": round_, "global_state": global_state,
                    "algorithm_state": algorithm.state_dict(), "history": history,
                })
            if stop:
                raise RunStopped(f"stopped after round {round_}")
    except NonFiniteError as error:
        error.round, error.history = round_, history
        raise
    loop_seconds = time.perf_counter() - loop_started
    final = summarise(history)
    if view is not None:  # the cut used, also when params.yaml left it to the model's default
        final["split_point"] = view.point
    return RunResult(history, final, start - 1, loop_seconds, "vectorised" if vectorise else "sequential")


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


