"""Vectorised local training: a round's participants trained at once (`training.execution`).

The sequential path (`simulation.train_client`) trains one client after another on one
model. Here every participant's parameters are stacked along a leading client dimension
and all clients take their t-th SGD step together: one `vmap`-ed forward
(`torch.func.functional_call` per client), the method's loss `vmap`-ed over clients, one
backward for all, one SGD update of the stacked tensors (`fedskew.sgd.sgd_update`).

Same minibatches as the sequential path: each client draws its permutation for every
epoch from its own generator, in the same order, and cuts it into the same batches.
Clients hold different numbers of samples, so batches are padded to the batch size:
padded rows carry the label -100, which `F.cross_entropy` ignores, so a client's loss is
the mean over its real rows exactly as in the sequential path. Clients are sorted by their
number of steps (most first); at step t only the clients with more than t steps take part,
a prefix of the stack, so a finished client is neither computed nor updated.

The two paths compute the same function with differently batched kernels, so results
agree to float round-off, not bit for bit (tested for every method that vectorises).

What can run here (`vectorisation_blocker` says why not, and the engine falls back to the
sequential path and logs it):
- the model: every parameter in `body` or `head`; no dropout (it draws from torch's global
  generator, per client in the sequential path) and no batch normalisation (its batch
  statistics would include the padded rows, and it updates buffers);
- no augmentation (it draws from each client's generator between batches);
- the method: each client-side hook it overrides must be declared vectorisable by the
  class that defines it (`FederatedAlgorithm.vectorised_hooks`). `begin_local` always runs,
  per client on the real model before training, as in the sequential path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedskew.fl.base import ClientContext, ClientUpdate, FederatedAlgorithm, StateDict
from fedskew.sgd import sgd_update

EXECUTIONS = ("auto", "sequential", "vectorised")
IGNORE = -100  # F.cross_entropy's default ignore_index: the label of a padded row

# The hooks local training calls; a method that overrides one must declare it vectorisable.
# (begin_local is not listed: the vectorised path runs it per client, as the sequential path does.)
# auto on a CPU: a batched step of a dense model cost about 3-4 sequential client steps on the
# 2-core development machine (benchmarks/synthetic_round.py: vectorised/sequential 1.5 at
# parallelism 2.5, 0.5 at 13.6), so vectorising pays from about 4.
AUTO_MIN_PARALLELISM = 4.0
LOCAL_HOOKS = ("make_optimizer", "local_step", "local_loss", "after_backward", "client_payload")


@dataclass
class BatchedClient:
    """What a vectorised `local_loss` may read of its client: the label counts (one row per client under vmap)."""

    label_counts: torch.Tensor


def vectorisation_blocker(algorithm: FederatedAlgorithm, model: nn.Module, augmented: bool) -> str | None:
    """Why this method/model/augmentation cannot train vectorised, or None if it can."""
    if augmented:
        return "training.augmentation draws from each client's generator between batches"
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            return "the model has dropout, which draws from torch's global generator"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return "the model has batch normalisation, whose batch statistics would include padded rows"
    if not all(p.requires_grad for p in model.parameters()):
        return "the model has frozen parameters"
    outside = [name for name, _ in model.named_parameters() if not name.startswith(("body.", "head."))]
    if outside:
        return f"the model has parameters outside body and head ({outside[0]}, ...)"
    for hook in LOCAL_HOOKS:
        owner = next(klass for klass in type(algorithm).__mro__ if hook in vars(klass))
        if owner is not FederatedAlgorithm and hook not in vars(owner).get("vectorised_hooks", ()):
            return f"{algorithm.name}'s {hook} ({owner.__name__}) has no vectorised form"
    return None


def round_parallelism(schedule: list, sizes: list[int], epochs: int, batch_size: int) -> float:
    """Mean over rounds of (the participants' local steps in total) / (the longest participant's steps).

    All clients step together, so a vectorised round takes as many batched steps as its
    longest client: this is how many sequential steps one batched step replaces.
    """
    steps = [epochs * math.ceil(n / batch_size) for n in sizes]
    ratios = [sum(steps[c] for c in clients) / max(1, max(steps[c] for c in clients))
              for clients in schedule if len(clients)]
    return sum(ratios) / len(ratios) if ratios else 0.0


def choose_execution(setting: str, algorithm: FederatedAlgorithm, model: nn.Module, augmented: bool,
                     device: torch.device, parallelism: float = float("inf")) -> tuple[bool, str]:
    """(vectorise?, why) for `training.execution`.

    `vectorised` trains the round's clients at once wherever the method and model allow.
    `auto` does where it pays: on a GPU; on a CPU only for models without convolutions
    (logistic regression, MLPs: a CNN's per-client cost is compute, not overhead) and when
    the rounds' `parallelism` (see `round_parallelism`) is at least AUTO_MIN_PARALLELISM.
    Either falls back to the sequential path, with the reason, when it cannot or does not pay.
    """
    if setting not in EXECUTIONS:
        raise ValueError(f"training.execution must be one of {EXECUTIONS}, got {setting!r}")
    if setting == "sequential":
        return False, "training.execution is sequential"
    blocker = vectorisation_blocker(algorithm, model, augmented)
    if blocker is not None:
        return False, f"{blocker}; the clients train one after another"
    if setting == "auto" and device.type != "cuda":
        if any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
            return False, "training.execution is auto and a convolutional model on a CPU gains nothing from it"
        if parallelism < AUTO_MIN_PARALLELISM:
            return False, (f"training.execution is auto and a batched step would replace only {parallelism:.1f} "
                           f"sequential steps on average (vectorising pays from {AUTO_MIN_PARALLELISM} on a CPU)")
    return True, f"training.execution is {setting}: the round's clients train at once"


class _BodyAndHead(nn.Module):
    """The model's forward returning the features too (a method's loss may use them); same parameter names."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body, self.head = model.body, model.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return features, self.head(features)


def _client_batches(client: ClientContext, epochs: int, batch_size: int) -> torch.Tensor:
    """[steps, batch_size] sample indices of the client's minibatches, padded with -1.

    The same permutations, drawn from the client's generator in the same order, and the
    same batches as `simulation.train_client`.
    """
    n = client.num_samples
    per_epoch = math.ceil(n / batch_size)
    padded = torch.full((epochs, per_epoch * batch_size), -1, dtype=torch.int64)
    for epoch in range(epochs):
        padded[epoch, :n] = client.indices[torch.randperm(n, generator=client.generator)]
    return padded.view(epochs * per_epoch, batch_size)


def train_clients_vectorised(algorithm: FederatedAlgorithm, model: nn.Module, global_state: StateDict,
                             clients: list[ClientContext], x: torch.Tensor, y: torch.Tensor,
                             nonfinite: Callable[[ClientContext, float, int], Exception]) -> list[ClientUpdate]:
    """Local training of every participant at once; the updates in the order of `clients`.

    `nonfinite(client, mean_loss, steps)` builds the error raised for a non-finite loss
    (the engine's message, naming run, round and client).
    """
    settings = algorithm.settings
    names = [name for name, _ in model.named_parameters()]
    keys = list(model.state_dict())
    buffers = dict(model.named_buffers())

    # begin_local per client on the real model, as the sequential path runs it; what it
    # leaves in the model is the client's starting point (FedEXP starts from its iterate).
    # Without a begin_local of its own, every client starts from the global model.
    model.load_state_dict(global_state)
    kept = {key: value.detach().clone() for key, value in model.state_dict().items() if key not in names}
    if type(algorithm).begin_local is FederatedAlgorithm.begin_local:
        starts = None
    else:
        starts = []
        for client in clients:
            model.load_state_dict(global_state)
            algorithm.begin_local(model, global_state, client)
            starts.append([p.detach().clone() for p in model.parameters()])
    batches = [_client_batches(c, settings.local_epochs, settings.batch_size) for c in clients]
    steps = [len(b) for b in batches]
    # most steps first: at step t the clients still training are a prefix of the stack
    order = sorted(range(len(clients)), key=lambda i: -steps[i])
    sorted_steps = [steps[i] for i in order]
    max_steps = sorted_steps[0] if sorted_steps else 0
    index = torch.full((len(clients), max_steps, settings.batch_size), -1, dtype=torch.int64)
    for row, i in enumerate(order):
        index[row, :steps[i]] = batches[i]
    index = index.to(x.device)
    rows = index.clamp_min(0)
    labels = torch.where(index >= 0, y[rows], IGNORE)  # a padded row's label is ignored by the loss
    if starts is None:
        params = [global_state[name].detach().expand(len(clients), *global_state[name].shape).clone()
                  for name in names]
    else:
        params = [torch.stack([starts[i][j] for i in order]) for j in range(len(names))]
    # each client's starting point, for a method whose gradients depend on it (FedProx's anchor)
    needs_start = type(algorithm).vectorised_after_backward is not FederatedAlgorithm.vectorised_after_backward
    start = [p.clone() for p in params] if needs_start else []
    counts = torch.stack([clients[i].label_counts for i in order])
    momentum = [torch.zeros_like(p) for p in params] if settings.momentum != 0 else [None] * len(params)
    loss_sum = torch.zeros(len(clients), device=x.device)

    body_and_head = _BodyAndHead(model)

    def forward(client_params: list[torch.Tensor], inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return functional_call(body_and_head, (dict(zip(names, client_params)), buffers), (inputs,))

    def loss(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, label_counts: torch.Tensor,
             inputs: torch.Tensor) -> torch.Tensor:
        return algorithm.local_loss(logits, features, labels, BatchedClient(label_counts), x=inputs)

    batched_forward, batched_loss = vmap(forward), vmap(loss)
    active = len(clients)
    for step in range(max_steps):
        while sorted_steps[active - 1] <= step:  # clients whose local training is over
            active -= 1
        inputs = x[rows[:active, step]]
        live = [p[:active].detach().requires_grad_(True) for p in params]
        features, logits = batched_forward(live, inputs)
        losses = batched_loss(logits, features, labels[:active, step], counts[:active], inputs)
        grads = list(torch.autograd.grad(losses.sum(), live, allow_unused=True))
        if needs_start:
            algorithm.vectorised_after_backward(live, grads, [s[:active] for s in start])
        sgd_update([p[:active] for p in params], grads, [m[:active] if m is not None else None for m in momentum],
                   lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
        loss_sum[:active] += losses.detach()

    losses_by_row = loss_sum.tolist()  # one device sync per round
    updates: list[ClientUpdate | None] = [None] * len(clients)
    for row, i in enumerate(order):
        client = clients[i]
        mean_loss = losses_by_row[row] / max(steps[i], 1)
        if not math.isfinite(mean_loss):
            raise nonfinite(client, mean_loss, steps[i])
        trained = {name: params[j][row] for j, name in enumerate(names)}
        state = {key: trained[key] if key in trained else kept[key] for key in keys}
        updates[i] = ClientUpdate(client.client_id, client.num_samples, state, steps[i], mean_loss,
                                  algorithm.client_payload(model, client, steps[i]))
    return updates  # type: ignore[return-value]
