"""The round's participants trained as one stack (`training.execution: vectorised`, chosen by
fedskew.engine.vectorised).

Every participant's parameters are stacked along a leading client dimension and all clients take their
t-th SGD step together: one batched forward, the method's loss for all clients, one backward, one SGD
update of the stacked tensors (`fedskew.numerics.sgd.sgd_update`).

- The forward of a dense model (Linear layers, elementwise activations, Flatten: logistic
  regression and MLPs) is a chain of batched matrix products (`closed_form.dense_forward`);
  any other model runs its own forward per client under `torch.func.vmap` with `functional_call`.
- The loss is the method's batched form of `local_loss` (`batched_form`): the cross entropy of
  its `logit_adjustment`'s logits, row by row, each client's rows averaged over its real rows; or,
  for a `local_loss` marked as its own batched form, `local_loss` under `vmap`. On a CPU, vmap's
  per-op dispatch costs several sequential steps of a small model; the batched forms cut a
  10-client step of logistic regression from 1.3 ms to about 0.4 ms.
- Where the model is a chain of Linear layers and ReLU and the loss the cross entropy of adjusted
  logits (FedAvg, FedLC, FedLogit, FedRS and the methods keeping their loss), the gradients are
  taken in closed form, without autograd (fedskew.engine.closed_form): about 0.2 ms for that step.

Same minibatches as the sequential path: each client draws its permutation for every epoch from
its own generator, in the same order, and cuts it into the same batches. Clients hold different
numbers of samples, so batches are padded to the batch size: padded rows carry the label -100,
which `F.cross_entropy` ignores, and weight 0, so a client's loss is the mean over its real rows
exactly as in the sequential path. Clients are sorted by their number of steps (most first); at
step t only the clients with more than t steps take part, a prefix of the stack, so a finished
client is neither computed nor updated. Every client starts from `local_start`; `begin_local` does
not run here, since the batched forms receive what they need (each client's start) as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedskew.engine.batched_forms import (
    adjusted_objective,
    batched_form,
    closed_form_steps,
    defining_class,
    loss_is_adjusted_cross_entropy,
    vmapped_objective,
)
from fedskew.engine.closed_form import Forward, closed_form_step, dense_forward, one_hot_targets
from fedskew.engine.sampling import dropout_generator
from fedskew.fl.base import ClientContext, ClientUpdate, FederatedAlgorithm, StateDict, TrainingSettings
from fedskew.fl.losses import IGNORE_INDEX
from fedskew.models.dropout import Dropout, draw_mask, dropout_plan, given_masks
from fedskew.numerics import gemm
from fedskew.numerics.sgd import sgd_update

GATHER_BYTES = 64 * 2**20  # the most input data gathered ahead of the steps that train on it


# --- the forward of a stack of clients -------------------------------------------------------------------

def _vmapped_forward(model: nn.Module, names: list[str], dropouts: list[Dropout]) -> Forward:
    """Any other model: its own forward per client under `vmap`, with `functional_call`; dropout layer i
    applies the client's slice of masks[i]."""
    body_and_head = _BodyAndHead(model)
    buffers = dict(model.named_buffers())

    def forward(client_params: list[torch.Tensor], inputs: torch.Tensor, masks: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        with given_masks(dropouts, masks):
            return functional_call(body_and_head, (dict(zip(names, client_params)), buffers), (inputs,))

    return vmap(forward)


class _BodyAndHead(nn.Module):
    """The model's forward returning the features too (a method's loss may use them); same parameter names."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body, self.head = model.body, model.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return features, self.head(features)


# --- what every step trains ------------------------------------------------------------------------------

def _fill_client_batches(row: torch.Tensor, client: ClientContext, epochs: int, batch_size: int) -> None:
    """Write the client's minibatch indices into `row` (its steps' batches back to back, each of `batch_size`).

    The same permutations, drawn from the client's generator in the same order, and the
    same batches as `rounds.train_client`; an epoch's last batch is padded (the row
    was filled with -1).
    """
    n = client.num_samples
    per_epoch = math.ceil(n / batch_size) * batch_size
    for epoch in range(epochs):
        torch.index_select(client.indices, 0, torch.randperm(n, generator=client.generator),
                           out=row[epoch * per_epoch:epoch * per_epoch + n])


@dataclass
class _Schedule:
    """The round's steps. The stack's rows are the clients sorted by their number of steps, most first, so
    that at step t the clients still training are a prefix of the stack."""

    order: list[int]        # the stack's rows, as positions in the round's clients
    steps: list[int]        # each client's number of steps, by position in the round's clients
    active_at: list[int]    # how many clients train at each step
    batches: torch.Tensor   # the batches of every step, step after step: [Σ_t active_at[t], batch], -1 padded


def _schedule(clients: list[ClientContext], epochs: int, batch_size: int) -> _Schedule:
    steps = [epochs * math.ceil(c.num_samples / batch_size) for c in clients]
    order = sorted(range(len(clients)), key=lambda i: -steps[i])
    sorted_steps = [steps[i] for i in order]
    max_steps = sorted_steps[0] if sorted_steps else 0
    by_client = torch.full((len(clients), max_steps * batch_size), -1, dtype=torch.int64)
    for row, i in enumerate(order):
        _fill_client_batches(by_client[row], clients[i], epochs, batch_size)
    active_at = [sum(1 for s in sorted_steps if s > step) for step in range(max_steps)]
    training = torch.arange(len(clients)).unsqueeze(0) < torch.tensor(active_at, dtype=torch.int64).unsqueeze(1)
    batches = by_client.view(len(clients), max_steps, batch_size).transpose(0, 1)[training]
    return _Schedule(order, steps, active_at, batches)


@dataclass
class _Rows:
    """The schedule's batches on the device: sample indices (0 on padded rows), labels (IGNORE_INDEX there,
    which the loss ignores) and each row's weight, 1 / (its client's real rows in the batch), 0 on padding."""

    indices: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


def _rows(batches: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> _Rows:
    batches = batches.to(y.device)
    real = batches >= 0
    indices = batches.clamp_min(0)
    labels = y.index_select(0, indices.view(-1)).view_as(batches).masked_fill_(~real, IGNORE_INDEX)
    weights = real.to(dtype)
    weights /= weights.sum(dim=1, keepdim=True)
    return _Rows(indices, labels, weights)


@dataclass
class _DropoutDraws:
    """Each client's dropout masks, drawn from its own generator for its real rows (counted on the CPU, so that
    drawing them costs no device sync)."""

    plan: list[tuple[Dropout, tuple[int, ...]]]
    generators: list[torch.Generator]   # by the stack's rows
    real_rows: list[int]                # by the schedule's batches
    batch_size: int

    def masks(self, active: int, batch: slice, device: torch.device) -> list[torch.Tensor]:
        """One step's masks, [clients, batch_size, *features] per layer, in the order the sequential path
        draws them: client by client, layer by layer in forward order. Padded rows keep every unit."""
        per_layer: list[list[torch.Tensor]] = [[] for _ in self.plan]
        for generator, rows in zip(self.generators[:active], self.real_rows[batch]):
            for masks, (layer, features) in zip(per_layer, self.plan):
                mask = draw_mask(layer.p, (rows, *features), generator, device)
                if rows < self.batch_size:
                    mask = torch.cat([mask, mask.new_ones((self.batch_size - rows, *features))])
                masks.append(mask)
        return [torch.stack(masks) for masks in per_layer]


def _dropout_draws(model: nn.Module, x: torch.Tensor, clients: list[ClientContext], schedule: _Schedule,
                   batch_size: int) -> _DropoutDraws | None:
    plan = dropout_plan(model, x[:1]) if any(isinstance(m, Dropout) for m in model.modules()) else []
    if not plan:
        return None
    return _DropoutDraws(plan, [dropout_generator(clients[i].seed, x.device) for i in schedule.order],
                         (schedule.batches >= 0).sum(dim=1).tolist(), batch_size)


# --- the stack and its steps -----------------------------------------------------------------------------

@dataclass
class _Stack:
    """The clients' parameters stacked in the schedule's order, with what their SGD steps keep."""

    params: list[torch.Tensor]
    momentum: list[torch.Tensor | None]
    start: list[torch.Tensor]       # each client's parameters when its training began, for a batched after_backward
    counts: torch.Tensor            # label counts [clients, K]
    loss: torch.Tensor              # each client's summed training loss

    def head(self, active: int) -> _Stack:
        """Views of the first `active` clients' (the ones still training)."""
        return _Stack([p[:active] for p in self.params], [m[:active] if m is not None else None for m in self.momentum],
                      [s[:active] for s in self.start], self.counts[:active], self.loss[:active])


def _stack(start: StateDict, names: list[str], clients: list[ClientContext], order: list[int], momentum: float,
           keep_start: bool, device: torch.device) -> _Stack:
    params = [start[name].detach().expand(len(clients), *start[name].shape).clone() for name in names]
    return _Stack(params, [torch.zeros_like(p) for p in params] if momentum != 0 else [None] * len(params),
                  [p.clone() for p in params] if keep_start else [],
                  torch.stack([clients[i].label_counts for i in order]), torch.zeros(len(clients), device=device))


class _ClosedFormStep:
    """A step's gradients in closed form, without autograd (fedskew.engine.closed_form), on the adjusted
    logits of the method's `logit_adjustment`; each row's one-hot target is gathered with its inputs."""

    def __init__(self, algorithm: FederatedAlgorithm, model: nn.Module, steps: list, stack: _Stack) -> None:
        adjustment_of = getattr(algorithm, batched_form(algorithm, "local_loss"))
        self.steps, self.num_classes = steps, stack.counts.shape[1]
        self.adjustment = adjustment_of(stack.counts, stack.params[0].dtype).to(stack.loss.device)
        self.product = gemm.bmm if gemm.uses_portable_layers(model) else torch.bmm  # the model's kernel recipe
        self.now = self.adjustment

    def target_bytes(self, x: torch.Tensor) -> int:
        return self.num_classes * x.element_size()

    def targets(self, rows: _Rows, block: slice) -> torch.Tensor:
        return one_hot_targets(rows.labels[block], rows.weights[block], self.num_classes)

    def narrow(self, active: int) -> None:
        self.now = self.adjustment.head(active)

    def __call__(self, stack: _Stack, inputs: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                 targets: torch.Tensor | None, masks: list[torch.Tensor]):
        grads, losses = closed_form_step(self.steps, stack.params, inputs, labels, weights, targets, self.now,
                                         self.product)
        return stack.params, grads, losses


class _AutogradStep:
    """A step through autograd: the batched forward, the method's batched loss, one backward."""

    def __init__(self, algorithm: FederatedAlgorithm, model: nn.Module, names: list[str],
                 dropout: _DropoutDraws | None) -> None:
        dropouts = [layer for layer, _ in dropout.plan] if dropout is not None else []
        self.forward = dense_forward(model, names) or _vmapped_forward(model, names, dropouts)
        self.objective = (adjusted_objective(algorithm) if loss_is_adjusted_cross_entropy(algorithm)
                          else vmapped_objective(algorithm))

    def target_bytes(self, x: torch.Tensor) -> int:
        return 0

    def targets(self, rows: _Rows, block: slice) -> None:
        return None

    def narrow(self, active: int) -> None:
        pass

    def __call__(self, stack: _Stack, inputs: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                 targets: torch.Tensor | None, masks: list[torch.Tensor]):
        live = [p.detach().requires_grad_(True) for p in stack.params]
        features, logits = self.forward(live, inputs, masks)
        total, losses = self.objective(logits, features, labels, stack.counts, weights)
        return live, list(torch.autograd.grad(total, live, allow_unused=True)), losses


# --- the round -------------------------------------------------------------------------------------------

def _train_steps(step: _ClosedFormStep | _AutogradStep, schedule: _Schedule, rows: _Rows, x: torch.Tensor,
                 stack: _Stack, dropout: _DropoutDraws | None, after_backward: Callable | None,
                 settings: TrainingSettings) -> None:
    """Every step of the round. The inputs of many steps are gathered at once (one indexing op instead of one
    per step), a block of at most GATHER_BYTES at a time, with the rows' one-hot targets where the step needs
    them."""
    batch_size = settings.batch_size
    row_bytes = batch_size * (x[:1].nbytes + step.target_bytes(x))
    steps_per_block = max(1, GATHER_BYTES // max(1, len(schedule.order) * row_bytes))
    active, first = -1, 0
    for t, training in enumerate(schedule.active_at):
        if t % steps_per_block == 0:
            block_first = first
            block = slice(first, first + sum(schedule.active_at[t:t + steps_per_block]))
            inputs = x.index_select(0, rows.indices[block].view(-1)).view(-1, batch_size, *x.shape[1:])
            targets = step.targets(rows, block)
        if training != active:  # some clients' local training is over: views of the rest
            active, now = training, stack.head(training)
            step.narrow(active)
        batch = slice(first, first + active)
        in_block = slice(first - block_first, first - block_first + active)
        first += active
        masks = dropout.masks(active, batch, x.device) if dropout is not None else []
        live, grads, losses = step(now, inputs[in_block], rows.labels[batch], rows.weights[batch],
                                   None if targets is None else targets[in_block], masks)
        if after_backward is not None:
            after_backward(live, grads, now.start)
        sgd_update(now.params, grads, now.momentum,
                   lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
        now.loss += losses


def _updates(clients: list[ClientContext], schedule: _Schedule, stack: _Stack, start: StateDict, names: list[str],
             nonfinite: Callable[[ClientContext, float, int], Exception]) -> list[ClientUpdate]:
    """Each client's update, in the order of `clients`; what the model holds besides parameters (buffers)
    stays the start's. The payload is empty: a vectorised method's `end_local` is FedAvg's (the blocker)."""
    kept = {key: value.detach().clone() for key, value in start.items() if key not in names}
    losses_by_row = stack.loss.tolist()  # one device sync per round
    updates: list[ClientUpdate | None] = [None] * len(clients)
    for row, i in enumerate(schedule.order):
        client, steps = clients[i], schedule.steps[i]
        mean_loss = losses_by_row[row] / max(steps, 1)
        if not math.isfinite(mean_loss):
            raise nonfinite(client, mean_loss, steps)
        trained = {name: stack.params[j][row] for j, name in enumerate(names)}
        state = {key: trained[key] if key in trained else kept[key] for key in start}
        updates[i] = ClientUpdate(client.client_id, client.num_samples, state, steps, mean_loss)
    return updates  # type: ignore[return-value]


def train_clients_vectorised(algorithm: FederatedAlgorithm, model: nn.Module, global_state: StateDict,
                             clients: list[ClientContext], x: torch.Tensor, y: torch.Tensor,
                             nonfinite: Callable[[ClientContext, float, int], Exception]) -> list[ClientUpdate]:
    """Local training of every participant at once, from the round's `local_start`; the updates in the order
    of `clients`.

    `nonfinite(client, mean_loss, steps)` builds the error raised for a non-finite loss
    (the engine's message, naming run, round and client).
    """
    settings = algorithm.settings
    names = [name for name, _ in model.named_parameters()]
    start = algorithm.local_start(global_state)
    schedule = _schedule(clients, settings.local_epochs, settings.batch_size)
    model.train()
    dropout = _dropout_draws(model, x, clients, schedule, settings.batch_size)
    rows = _rows(schedule.batches, y, x.dtype)
    after_backward = None
    if defining_class(type(algorithm), "after_backward") is not FederatedAlgorithm:
        after_backward = getattr(algorithm, batched_form(algorithm, "after_backward"))
    stack = _stack(start, names, clients, schedule.order, settings.momentum, after_backward is not None, x.device)
    steps = closed_form_steps(algorithm, model, names)
    step = (_ClosedFormStep(algorithm, model, steps, stack) if steps is not None
            else _AutogradStep(algorithm, model, names, dropout))
    _train_steps(step, schedule, rows, x, stack, dropout, after_backward, settings)
    return _updates(clients, schedule, stack, start, names, nonfinite)
