"""The simulation loop: sample clients, run the round, check, evaluate, checkpoint.

One model object is re-loaded from state for every client; data stays in one set of
tensors and a client is a set of indices into it. The loop has no per-method branches:
a round is either the federated round below (local training through the
FederatedAlgorithm hooks, then `aggregate`) or a split method's own `run_round`
(fedskew.sfl); both return a RoundResult.
"""

from __future__ import annotations

import contextlib
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
    dropout_generator,
    sampling_schedule,
)
from fedskew.engine.vectorised import (
    choose_execution,
    choose_split_execution,
    round_parallelism,
    train_clients_vectorised,
)
from fedskew.fl.base import ClientContext, ClientUpdate, Exchange, FederatedAlgorithm, RoundResult, TrainingSettings
from fedskew.models import build_model
from fedskew.models.dropout import dropout_layers, has_foreign_dropout, masks_from
from fedskew.models.split import SplitView, split_model
from fedskew.sfl.base import SplitRound

log = logging.getLogger(__name__)


_SERVER_STREAM = 3  # randomness of the server side of a split round (see engine.sampling)


Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class NonFiniteError(RuntimeError):
    """A loss or the aggregated model became NaN/Inf; the message names run, round and client.

    `round` and `history` (the rounds completed before it) let the caller record the
    divergence as a result (training.on_divergence: record).
    """

    round: int | None = None
    history: list[dict[str, Any]] | None = None


class RunStopped(Exception):
    """Raised by `stop_after_round` (used to test resuming): the run stopped on purpose."""


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    final: dict[str, Any]
    resumed_from: int
    loop_seconds: float = 0.0  # wall time of the rounds run in this process (the rest of a job is fixed cost)
    execution: str = "sequential"  # how this process trained the clients (training.execution, resolved)


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a (nested) container: what crosses the network."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _nonfinite_advice(empty_clients: list[int]) -> str:
    """What to change after a NaN: an empty client (0 samples, 0 local steps) divides by zero, which
    no learning rate fixes; otherwise the usual cause is a step size too large."""
    if empty_clients:
        return (f"client(s) {empty_clients} hold 0 training samples (0 local steps), the likely cause; "
                "re-create the partition (make_partition now refuses empty clients), or use fewer clients")
    return "lower training.lr or check the method's hyperparameters"


def check_finite(outcome: RoundResult, run_id: str, round_: int) -> None:
    """The NaN guard: a client's loss or the new global model must be finite."""
    empty = sorted(c for c, n in outcome.client_samples.items() if n == 0)
    for client_id, loss in outcome.client_losses.items():
        if not math.isfinite(loss):
            raise NonFiniteError(f"run {run_id}: non-finite training loss ({loss}) in round {round_}, client "
                                 f"{client_id}; {_nonfinite_advice(empty)}")
    for key, value in outcome.global_state.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise NonFiniteError(f"run {run_id}: aggregated model has non-finite values in {key!r} after round "
                                 f"{round_} (clients {sorted(outcome.client_losses)}); {_nonfinite_advice(empty)}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("training.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


def nonfinite_loss(run_id: str, client: ClientContext, mean_loss: float, steps: int) -> NonFiniteError:
    empty = [client.client_id] if steps == 0 else []
    return NonFiniteError(f"run {run_id}: non-finite training loss ({mean_loss}) in round {client.round}, "
                          f"client {client.client_id}; {_nonfinite_advice(empty)}")


def state_slots(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's state tensors by state-dict key, looked up once for a round's clients.

    Loading the global state by copying into them is what `load_state_dict` does, without its
    per-call module traversal and checks (70 µs of a logistic regression's 115 µs of per-client
    cost): valid while the model keeps its tensors, which loading in place never replaces.
    """
    return list(model.state_dict(keep_vars=True).items())


def train_client(algorithm: FederatedAlgorithm, model: torch.nn.Module, global_state: dict,
                 x: torch.Tensor, y: torch.Tensor, client: ClientContext, run_id: str,
                 augment: Augment | None = None, copy_state: bool = True,
                 slots: list[tuple[str, torch.Tensor]] | None = None) -> ClientUpdate:
    """Local training of one client from the global model; returns its update.

    `augment(x_batch, generator)` (training.augmentation) transforms each training batch,
    drawing from the client's own generator. With ``copy_state=False`` the update's state
    holds the model's own tensors, valid only until the model is trained again: for a
    caller that folds it into an average at once. `slots` (`state_slots(model)`) saves
    looking the model's tensors up for every client.
    """
    settings = algorithm.settings
    if slots is None:
        model.load_state_dict(global_state)
    else:
        with torch.no_grad():
            for key, tensor in slots:
                tensor.copy_(global_state[key])
    model.train()
    optimizer = algorithm.make_optimizer(model)
    algorithm.begin_local(model, global_state, client)
    n, steps = client.num_samples, 0
    loss_sum = torch.zeros((), device=x.device)
    for _ in range(settings.local_epochs):
        order = client.indices[torch.randperm(n, generator=client.generator)].to(x.device)
        for start in range(0, n, settings.batch_size):
            batch = order[start:start + settings.batch_size]
            inputs = x[batch] if augment is None else augment(x[batch], client.generator)
            loss_sum += algorithm.local_step(model, optimizer, inputs, y[batch], client)
            steps += 1
    mean_loss = float(loss_sum) / max(steps, 1)  # one device sync per client, not per step
    if not math.isfinite(mean_loss):
        raise nonfinite_loss(run_id, client, mean_loss, steps)
    state = {key: value.detach().clone() if copy_state else value.detach()
             for key, value in (slots if slots is not None else model.state_dict().items())}
    return ClientUpdate(client.client_id, n, state, steps, mean_loss,
                        algorithm.client_payload(model, client, steps))


def federated_round(algorithm: FederatedAlgorithm, model: torch.nn.Module, global_state: dict,
                    clients: list[ClientContext], x: torch.Tensor, y: torch.Tensor, run_id: str,
                    augment: Augment | None = None,
                    after_local: Callable[[ClientContext, torch.nn.Module], None] | None = None,
                    vectorised: bool = False) -> RoundResult:
    """Local training of every participant from the global model, then the method's aggregation.

    A method whose aggregation streams (`begin_aggregate`: FedAvg's weighted average,
    FedOpt, FedNova, FedDyn, FedEXP, SCAFFOLD, FL-FCR, MOON) has each client's update folded in as
    soon as it is trained and its state and payload dropped, so a round holds one model copy
    besides the global state, whatever the number of participants; each fold takes the same
    sums in the same order as the method's `aggregate`, so the result is bit-identical.
    (Every federated method has a fold; one without would receive every update at the end.)
    `after_local(client, model)` sees each client's model right after its local training
    (training.local_diagnostics); it must not change the model.
    With `vectorised=True` every participant trains at once (fedskew.engine.vectorised; the
    caller checked that the method and model allow it), then the updates are folded in the
    same order.
    """
    stream = algorithm.begin_aggregate(global_state, [c.num_samples for c in clients])
    # fedskew's Dropout draws each client's masks from the client's own generator. A foreign dropout
    # layer draws from the global generator: seed it per client so results do not depend on the order
    # clients train in. A model without such layers draws nothing there, and skipping the call changes
    # no number (it costs a stack-trace capture per client on a CUDA build of torch).
    own_dropout = not vectorised and bool(dropout_layers(model))  # (the vectorised path draws them itself)
    seed_per_client = not vectorised and has_foreign_dropout(model)
    updates, traffic = [], {"down_weights": 0, "down_payload": 0, "up_weights": 0, "up_payload": 0}
    global_bytes = tensor_bytes(global_state)  # what each participant downloads
    if vectorised:
        trained = train_clients_vectorised(algorithm, model, global_state, clients, x, y,
                                           lambda client, loss, steps: nonfinite_loss(run_id, client, loss, steps))
    else:
        trained, slots = None, state_slots(model)
    for position, client in enumerate(clients):
        traffic["down_weights"] += global_bytes
        traffic["down_payload"] += tensor_bytes(algorithm.download_payload(client))
        if trained is not None:
            update, trained[position] = trained[position], None
            if after_local is not None:
                model.load_state_dict(update.state)
        else:
            if seed_per_client:
                torch.manual_seed(client.seed)
            masks = masks_from(model, dropout_generator(client.seed, x.device)) if own_dropout \
                else contextlib.nullcontext()
            with masks:  # a fold reads the client's state once, right away: no copy of it is needed
                update = train_client(algorithm, model, global_state, x, y, client, run_id, augment,
                                      copy_state=stream is None, slots=slots)
        if after_local is not None:
            after_local(client, model)
        traffic["up_weights"] += tensor_bytes(update.state)
        traffic["up_payload"] += tensor_bytes(update.payload)
        if stream is not None:
            stream.fold(update)
            update.state, update.payload = {}, {}  # folded: drop this client's copy now
        updates.append(update)
    new_state = stream.finish(updates) if stream is not None else algorithm.aggregate(global_state, updates)
    exchange = algorithm.begin_exchange(new_state)
    if exchange is not None:
        new_state = second_exchange(exchange, model, new_state, clients, x, y, traffic)
    return RoundResult(new_state, {u.client_id: u.train_loss for u in updates},
                       {u.client_id: u.num_samples for u in updates}, traffic)


def second_exchange(exchange: Exchange, model: torch.nn.Module, state: dict, clients: list[ClientContext],
                    x: torch.Tensor, y: torch.Tensor, traffic: dict[str, int]) -> dict:
    """A method's second round trip (`FederatedAlgorithm.begin_exchange`): each participant receives
    `state` and answers with what it computes on its local set; both directions count as traffic."""
    model.load_state_dict(state)
    was_training = model.training
    model.eval()
    state_bytes = tensor_bytes(state)
    with torch.no_grad():
        for client in clients:
            traffic["down_weights"] += state_bytes
            indices = client.indices.to(x.device)
            message = exchange.client_message(model, client, x[indices], y[indices])
            traffic["up_payload"] += tensor_bytes(message)
            exchange.fold(client, message)
    model.train(was_training)
    return exchange.finish()


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
                row.update({f"test_{k}": v for k, v in metrics.items() if k != "per_class_acc"})
                row.update({f"test_acc_class{c}": v for c, v in enumerate(metrics["per_class_acc"])})
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


def summarise(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Final-round figures (what tables report) and the best round (labelled as such)."""
    evaluated = [row for row in history if "test_acc" in row]
    final = evaluated[-1]
    best = max(evaluated, key=lambda row: row["test_acc"])
    return {
        "status": "finished",
        "final_round": final["round"],
        "final_acc": final["test_acc"],
        "final_balanced_acc": final["test_balanced_acc"],
        "final_loss": final["test_loss"],
        "best_round": best["round"],
        "best_acc": best["test_acc"],
        "total_bytes_up": sum(row["bytes_up"] for row in history),
        "total_bytes_down": sum(row["bytes_down"] for row in history),
    }


def summarise_divergence(error: NonFiniteError) -> dict[str, Any]:
    """What a diverged run reports: no accuracy, the round it failed in, and why."""
    history = error.history or []
    return {
        "status": "diverged",
        "diverged_round": error.round,
        "error": str(error),
        "final_acc": None,
        "final_balanced_acc": None,
        "final_loss": None,
        "best_round": None,
        "best_acc": None,
        "total_bytes_up": sum(row["bytes_up"] for row in history),
        "total_bytes_down": sum(row["bytes_down"] for row in history),
    }
