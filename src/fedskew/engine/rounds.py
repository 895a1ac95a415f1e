"""One round of a federated method: every participant's local training from the global model, then the
method's aggregation (and, for a method that asks, a second exchange); the NaN guard every round passes.

One model object is re-loaded from state for every client; data stays in one set of tensors and a client
is a set of indices into it. Split methods run their own round (fedskew.sfl); both return a RoundResult.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from fedskew.engine.sampling import dropout_generator
from fedskew.engine.stacked import train_clients_vectorised
from fedskew.fl.base import (
    ClientContext,
    ClientUpdate,
    Exchange,
    FederatedAlgorithm,
    RoundResult,
    RoundStart,
    local_optimizer,
    trainable_parameters,
)
from fedskew.fl.traffic import Traffic
from fedskew.models.dropout import dropout_layers, has_foreign_dropout, masks_from

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class NonFiniteError(RuntimeError):
    """A loss or the aggregated model became NaN/Inf; the message names run, round and client.

    `round` and `history` (the rounds completed before it) let the caller record the
    divergence as a result (training.on_divergence: record).
    """

    round: int | None = None
    history: list[dict[str, Any]] | None = None


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
    """Local training of one client from the round's start (`local_start` of the global model); its update.

    `augment(x_batch, generator)` (training.augmentation) transforms each training batch,
    drawing from the client's own generator. With ``copy_state=False`` the update's state
    holds the model's own tensors, valid only until the model is trained again: for a
    caller that folds it into an average at once. `slots` (`state_slots(model)`) saves
    looking the model's tensors up for every client. The client's scratch is emptied once
    `end_local` has run, so a round never holds more than one client's.
    """
    settings = algorithm.settings
    start = algorithm.local_start(global_state)
    if slots is None:
        model.load_state_dict(start)
    else:
        with torch.no_grad():
            for key, tensor in slots:
                tensor.copy_(start[key])
    model.train()
    optimizer = local_optimizer(model.parameters(), settings)
    algorithm.begin_local(model, global_state, client)
    n, steps = client.num_samples, 0
    loss_sum = torch.zeros((), device=x.device)
    for _ in range(settings.local_epochs):
        order = client.indices[torch.randperm(n, generator=client.generator)].to(x.device)
        for first in range(0, n, settings.batch_size):
            batch = order[first:first + settings.batch_size]
            inputs = x[batch] if augment is None else augment(x[batch], client.generator)
            loss_sum += algorithm.local_step(model, optimizer, inputs, y[batch], client)
            steps += 1
    mean_loss = float(loss_sum) / max(steps, 1)  # one device sync per client, not per step
    if not math.isfinite(mean_loss):
        raise nonfinite_loss(run_id, client, mean_loss, steps)
    state = {key: value.detach().clone() if copy_state else value.detach()
             for key, value in (slots if slots is not None else model.state_dict().items())}
    payload = algorithm.end_local(model, client, steps)
    client.scratch.clear()
    return ClientUpdate(client.client_id, n, state, steps, mean_loss, payload)


def _sequential_trainer(algorithm: FederatedAlgorithm, model: torch.nn.Module, global_state: dict,
                        x: torch.Tensor, y: torch.Tensor, run_id: str,
                        augment: Augment | None) -> Callable[[ClientContext], ClientUpdate]:
    """Trains one client after another on `model`: `train_client`, with each client's dropout drawn as its own."""
    # fedskew's Dropout draws each client's masks from the client's own generator. A foreign dropout
    # layer draws from the global generator: seed it per client so results do not depend on the order
    # clients train in. A model without such layers draws nothing there, and skipping the call changes
    # no number (it costs a stack-trace capture per client on a CUDA build of torch).
    own_dropout, seed_per_client = bool(dropout_layers(model)), has_foreign_dropout(model)
    slots = state_slots(model)

    def train(client: ClientContext) -> ClientUpdate:
        if seed_per_client:
            torch.manual_seed(client.seed)
        masks = masks_from(model, dropout_generator(client.seed, x.device)) if own_dropout \
            else contextlib.nullcontext()
        with masks:  # the fold reads the client's state once, right away: no copy of it is needed
            return train_client(algorithm, model, global_state, x, y, client, run_id, augment,
                                copy_state=False, slots=slots)

    return train


def federated_round(algorithm: FederatedAlgorithm, model: torch.nn.Module, global_state: dict,
                    clients: list[ClientContext], x: torch.Tensor, y: torch.Tensor, run_id: str,
                    augment: Augment | None = None,
                    after_local: Callable[[ClientContext, torch.nn.Module], None] | None = None,
                    vectorised: bool = False) -> RoundResult:
    """Local training of every participant from the global model, then the method's aggregation.

    Each client's update is folded into the method's `Fold` (`begin_aggregate`) as soon as it is
    trained and its state and payload are dropped, so a round holds one model copy besides the
    global state, whatever the number of participants.
    `after_local(client, model)` sees each client's model right after its local training
    (training.local_diagnostics); it must not change the model.
    With `vectorised=True` every participant trains at once (fedskew.engine.stacked; the caller
    checked with fedskew.engine.vectorised that the method and model allow it), then the updates
    are folded in the same order.
    """
    fold = algorithm.begin_aggregate(RoundStart(global_state, [c.num_samples for c in clients],
                                                trainable_parameters(model)))
    updates, traffic = [], Traffic(down=("weights", "payload"), up=("weights", "payload"))
    traffic.send_down("weights", global_state, copies=len(clients))  # every participant downloads the model
    if vectorised:
        trained = train_clients_vectorised(algorithm, model, global_state, clients, x, y,
                                           lambda client, loss, steps: nonfinite_loss(run_id, client, loss, steps))
    else:
        train = _sequential_trainer(algorithm, model, global_state, x, y, run_id, augment)
    for position, client in enumerate(clients):
        traffic.send_down("payload", algorithm.download_payload(client))
        if vectorised:
            update, trained[position] = trained[position], None
            if after_local is not None:
                model.load_state_dict(update.state)
        else:
            update = train(client)
        if after_local is not None:
            after_local(client, model)
        traffic.send_up("weights", update.state)
        traffic.send_up("payload", update.payload)
        fold.fold(update)
        update.state, update.payload = {}, {}  # folded: drop this client's copy now
        updates.append(update)
    new_state = fold.finish(updates)
    exchange = algorithm.begin_exchange(new_state)
    if exchange is not None:
        new_state = second_exchange(exchange, model, new_state, clients, x, y, traffic)
    return RoundResult(new_state, {u.client_id: u.train_loss for u in updates},
                       {u.client_id: u.num_samples for u in updates}, traffic.counts())


def second_exchange(exchange: Exchange, model: torch.nn.Module, state: dict, clients: list[ClientContext],
                    x: torch.Tensor, y: torch.Tensor, traffic: Traffic) -> dict:
    """A method's second round trip (`FederatedAlgorithm.begin_exchange`): each participant receives
    `state` and answers with what it computes on its local set; both directions count as traffic."""
    model.load_state_dict(state)
    was_training = model.training
    model.eval()
    traffic.send_down("weights", state, copies=len(clients))
    with torch.no_grad():
        for client in clients:
            indices = client.indices.to(x.device)
            message = traffic.send_up("payload", exchange.client_message(model, client, x[indices], y[indices]))
            exchange.fold(client, message)
    model.train(was_training)
    return exchange.finish()
