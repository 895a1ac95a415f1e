"""Vectorised local training: a round's participants trained at once (`training.execution`).

The sequential path (`rounds.train_client`) trains one client after another on one
model. Here every participant's parameters are stacked along a leading client dimension
and all clients take their t-th SGD step together: one batched forward, the method's loss
for all clients, one backward, one SGD update of the stacked tensors (`fedskew.numerics.sgd.sgd_update`).

- The forward of a dense model (Linear layers, elementwise activations, Flatten: logistic
  regression and MLPs) is a chain of batched matrix products (`_dense_forward`); any other
  model runs its own forward per client under `torch.func.vmap` with `functional_call`.
- The loss is the method's per-row `batched_local_loss`, each client's rows averaged over
  its real rows; a method without one of its own runs its `local_loss` under `vmap`.
  On a CPU, vmap's per-op dispatch cost several sequential steps of a small model; the
  batched forms cut a 10-client step of logistic regression from 1.3 ms to about 0.4 ms.
- Where the model is a chain of Linear layers and ReLU and the loss the cross entropy of
  adjusted logits (`batched_logit_adjustment`: FedAvg, FedLC, FedLogit, FedRS and the
  methods keeping their loss), the gradients are taken in closed form, without autograd
  (fedskew.engine.closed_form): about 0.2 ms for that step.

Same minibatches as the sequential path: each client draws its permutation for every
epoch from its own generator, in the same order, and cuts it into the same batches.
Clients hold different numbers of samples, so batches are padded to the batch size:
padded rows carry the label -100, which `F.cross_entropy` ignores, and weight 0, so a
client's loss is the mean over its real rows exactly as in the sequential path. Clients
are sorted by their number of steps (most first); at step t only the clients with more
than t steps take part, a prefix of the stack, so a finished client is neither computed
nor updated.

The two paths compute the same function with differently batched kernels, so results
agree to float round-off, not bit for bit (tested for every method that vectorises).

What can run here (`vectorisation_blocker` says why not, and the engine falls back to the
sequential path and logs it):
- the model: every parameter in `body` or `head`; dropout only as fedskew's `Dropout`, whose
  masks each client draws from its own generator: this path draws them in advance, per
  step, client and layer, in the order and shapes the sequential path draws them, so both
  paths apply the same masks (a plain `nn.Dropout` draws from torch's global generator);
  no batch normalisation (its batch statistics would include the padded rows, and it
  updates buffers);
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

from fedskew.numerics import gemm
from fedskew.engine.closed_form import (
    closed_form_step,
    dense_step_forward,
    one_hot_targets,
    supports_closed_form,
)
from fedskew.engine.sampling import dropout_generator
from fedskew.fl.base import ClientContext, ClientUpdate, FederatedAlgorithm, StateDict
from fedskew.fl.losses import IGNORE_INDEX
from fedskew.models.dropout import Dropout, draw_mask, dropout_plan, given_masks, has_foreign_dropout
from fedskew.sfl.base import SplitAlgorithm, stacked_blocker
from fedskew.numerics.sgd import sgd_update

EXECUTIONS = ("auto", "sequential", "vectorised")

# The hooks local training calls; a method that overrides one must declare it vectorisable.
# (begin_local is not listed: the vectorised path runs it per client, as the sequential path does.)
# auto on a CPU: a batched step of a dense model costs about 1.2 sequential client steps of
# logistic regression on the 2-core development machine (benchmarks/synthetic_round.py,
# Synthetic(1,1): vectorised ÷ sequential 0.98 at parallelism 1.6, 0.70 at 2.3, 0.55 at 3.2,
# 0.48 at 4.1), so vectorising pays from about 2.
AUTO_MIN_PARALLELISM = 2.0
GATHER_BYTES = 64 * 2**20  # the most input data gathered ahead of the steps that train on it
LOCAL_HOOKS = ("make_optimizer", "local_step", "local_loss", "after_backward", "client_payload")


@dataclass
class BatchedClient:
    """What a vectorised `local_loss` may read of its client: the label counts (one row per client under vmap)."""

    label_counts: torch.Tensor


def vectorisation_blocker(algorithm: FederatedAlgorithm, model: nn.Module, augmented: bool) -> str | None:
    """Why this method/model/augmentation cannot train vectorised, or None if it can."""
    if augmented:
        return "training.augmentation draws from each client's generator between batches"
    if algorithm.settings.optimizer != "sgd":
        return f"the vectorised clients step with SGD only (training.optimizer is {algorithm.settings.optimizer})"
    if has_foreign_dropout(model):
        return "the model has an nn.Dropout, which draws from torch's global generator (fedskew's Dropout does not)"
    for module in model.modules():
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


def choose_split_execution(setting: str, algorithm: SplitAlgorithm, client_part: nn.Module,
                           device: torch.device) -> tuple[bool, str]:
    """(stack the client parts?, why) for a split method under `training.execution` (see fedskew.sfl.base).

    `vectorised` stacks them wherever the method and its client part allow; `auto` only on a
    GPU (a client part is convolutional in every split suite, and on a CPU stacking a
    convolution gains nothing). The server side of a split round is never batched across
    clients: it is the method.
    """
    if setting not in EXECUTIONS:
        raise ValueError(f"training.execution must be one of {EXECUTIONS}, got {setting!r}")
    if setting == "sequential":
        return False, "training.execution is sequential"
    if not algorithm.vectorised_clients:
        return False, (f"{algorithm.name} trains its client parts against the server one after another; "
                       "its clients train one after another")
    if algorithm.settings.optimizer != "sgd":
        return False, (f"the stacked client parts step with SGD only (training.optimizer is "
                       f"{algorithm.settings.optimizer}); the clients train one after another")
    blocker = stacked_blocker(client_part)
    if blocker is not None:
        return False, f"{blocker}; the clients train one after another"
    if setting == "auto" and device.type != "cuda":
        return False, "training.execution is auto and stacking a split method's client parts pays on a GPU only"
    return True, f"training.execution is {setting}: the round's client parts train at once"


# Layers a dense model may hold besides nn.Linear: they act elementwise, so any layout suits them.
_ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)
# (client parameters, inputs, dropout masks) -> (features, logits), each with a leading client dimension
_Forward = Callable[[list[torch.Tensor], torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def _dense_steps(module: nn.Module, prefix: str, position: dict[str, int]) -> list | None:
    """`module` as a chain of steps, or None if it holds a layer other than Linear, Flatten or elementwise.

    A step is a linear layer's (weight, bias) indices into the parameter list (bias None
    without one) or an elementwise module. Flatten is no step: inputs are flattened first.
    """
    if isinstance(module, nn.Sequential):
        steps: list = []
        for name, child in module.named_children():
            inner = _dense_steps(child, f"{prefix}.{name}", position)
            if inner is None:
                return None
            steps += inner
        return steps
    if isinstance(module, nn.Linear):
        return [(position[f"{prefix}.weight"], position.get(f"{prefix}.bias"))]
    if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
        return []
    if isinstance(module, _ELEMENTWISE):
        return [module]
    return None


def _dense_chain(model: nn.Module, names: list[str]) -> tuple[list, list] | None:
    """The body's and the head's dense steps (see `_dense_steps`), or None if the model is not dense."""
    position = {name: i for i, name in enumerate(names)}
    body = _dense_steps(model.body, "body", position)
    head = _dense_steps(model.head, "head", position) if body is not None else None
    return None if body is None or head is None else (body, head)


def _dense_forward(model: nn.Module, names: list[str]) -> _Forward | None:
    """The forward of a dense model (logistic regression, MLPs) as batched matrix products, or None.

    Why not `vmap`: on a CPU, vmap's per-op dispatch costs several sequential client steps
    of a small model. Here activations are kept transposed, [C, features, B], so every layer
    is one `baddbmm(b, W, h)` with W [C, out, in], the orientation in which a CPU's batched
    GEMM is fastest for a narrow output (measured on the 2-core machine: 43 µs against
    100–150 µs for [C, B, in] @ [C, in, out] at 10 × 128 × 60 → 10).
    """
    chain = _dense_chain(model, names)
    if chain is None:
        return None
    body, head = chain

    def run(steps: list, params: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        for step in steps:
            h = dense_step_forward(step, params, h)
        return h

    def forward(params: list[torch.Tensor], inputs: torch.Tensor, masks: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:  # a dense chain has no dropout: masks is empty
        features = run(body, params, inputs.reshape(inputs.shape[0], inputs.shape[1], -1).transpose(1, 2))
        return features.transpose(1, 2), run(head, params, features).transpose(1, 2)

    return forward


def _vmapped_forward(model: nn.Module, names: list[str], dropouts: list[Dropout]) -> _Forward:
    """Any other model: its own forward per client under `vmap`, with `functional_call`; dropout layer i
    applies the client's slice of masks[i]."""
    body_and_head = _BodyAndHead(model)
    buffers = dict(model.named_buffers())

    def forward(client_params: list[torch.Tensor], inputs: torch.Tensor, masks: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        with given_masks(dropouts, masks):
            return functional_call(body_and_head, (dict(zip(names, client_params)), buffers), (inputs,))

    return vmap(forward)


def _step_masks(plan: list[tuple[Dropout, tuple[int, ...]]], generators: list[torch.Generator],
                real_rows: list[int], batch_size: int, device: torch.device) -> list[torch.Tensor]:
    """One step's dropout masks, [clients, batch_size, *features] per layer.

    Client by client, layer by layer in forward order, each mask of the client's real rows
    drawn from its generator: the draws the sequential path makes in that client's step.
    Padded rows keep every unit (their loss weight is 0).
    """
    per_layer: list[list[torch.Tensor]] = [[] for _ in plan]
    for generator, rows in zip(generators, real_rows):
        for masks, (layer, features) in zip(per_layer, plan):
            mask = draw_mask(layer.p, (rows, *features), generator, device)
            if rows < batch_size:
                mask = torch.cat([mask, mask.new_ones((batch_size - rows, *features))])
            masks.append(mask)
    return [torch.stack(masks) for masks in per_layer]


def _defining_class(klass: type, attribute: str) -> type:
    return next(base for base in klass.__mro__ if attribute in vars(base))


def _batched_loss_owner(klass: type) -> type:
    """The class whose batched loss the method's `batched_local_loss` is: the class defining it or,
    for the base's (the cross entropy of adjusted logits), the class defining the adjustment."""
    owner = _defining_class(klass, "batched_local_loss")
    return _defining_class(klass, "batched_logit_adjustment") if owner is FederatedAlgorithm else owner


def _has_batched_loss(algorithm: FederatedAlgorithm) -> bool:
    """Whether the method's `batched_local_loss` is that of its `local_loss` (not one a subclass overrode)."""
    klass = type(algorithm)
    return issubclass(_batched_loss_owner(klass), _defining_class(klass, "local_loss"))


def _loss_is_adjusted_cross_entropy(algorithm: FederatedAlgorithm) -> bool:
    """Whether the method's batched loss is the cross entropy of its `batched_logit_adjustment`'s logits."""
    return _has_batched_loss(algorithm) and _defining_class(type(algorithm), "batched_local_loss") is FederatedAlgorithm


# (logits, features, labels, label_counts, row weights) -> (the objective to differentiate, each client's loss)
_Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      tuple[torch.Tensor, torch.Tensor]]


def _batched_objective(algorithm: FederatedAlgorithm) -> _Objective:
    """Each client's mean loss from the method's per-row `batched_local_loss`.

    `weights` is 1 / (the client's real rows in this batch) on real rows and 0 on padded
    ones, so a client's weighted sum is its mean loss, as F.cross_entropy's mean over one
    client's batch; the sum over clients is differentiated (each client's parameters
    receive only their own rows' gradients).
    """

    def objective(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, label_counts: torch.Tensor,
                  weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weighted = algorithm.batched_local_loss(logits, features, labels, label_counts) * weights
        return weighted.sum(), weighted.detach().sum(dim=1)

    return objective


def _vmapped_objective(algorithm: FederatedAlgorithm) -> _Objective:
    """A method's `local_loss` per client under `vmap`, for a method without a `batched_local_loss` of its own."""

    def loss(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
             label_counts: torch.Tensor) -> torch.Tensor:
        return algorithm.local_loss(logits, features, labels, BatchedClient(label_counts))

    per_client = vmap(loss)

    def objective(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, label_counts: torch.Tensor,
                  weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = per_client(logits, features, labels, label_counts)
        return means.sum(), means.detach()

    return objective


def _closed_form_steps(algorithm: FederatedAlgorithm, model: nn.Module, names: list[str]) -> list | None:
    """The model's dense steps, body then head, where its gradients can be taken in closed form
    (fedskew.engine.closed_form: a chain of Linear and ReLU under an adjusted cross entropy), else None."""
    if not _loss_is_adjusted_cross_entropy(algorithm):
        return None
    chain = _dense_chain(model, names)
    steps = None if chain is None else chain[0] + chain[1]
    return steps if steps is not None and supports_closed_form(steps) else None


class _BodyAndHead(nn.Module):
    """The model's forward returning the features too (a method's loss may use them); same parameter names."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body, self.head = model.body, model.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return features, self.head(features)


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


def train_clients_vectorised(algorithm: FederatedAlgorithm, model: nn.Module, global_state: StateDict,
                             clients: list[ClientContext], x: torch.Tensor, y: torch.Tensor,
                             nonfinite: Callable[[ClientContext, float, int], Exception]) -> list[ClientUpdate]:
    """Local training of every participant at once; the updates in the order of `clients`.

    `nonfinite(client, mean_loss, steps)` builds the error raised for a non-finite loss
    (the engine's message, naming run, round and client).
    """
    settings = algorithm.settings
    batch_size = settings.batch_size
    names = [name for name, _ in model.named_parameters()]
    # what the model holds besides parameters (buffers) stays the global model's
    kept = {key: value.detach().clone() for key, value in global_state.items() if key not in names}

    # begin_local per client on the real model, as the sequential path runs it; what it
    # leaves in the model is the client's starting point (FedEXP starts from its iterate).
    # Without a begin_local of its own, every client starts from the global model.
    if type(algorithm).begin_local is FederatedAlgorithm.begin_local:
        starts = None
    else:
        starts = []
        for client in clients:
            model.load_state_dict(global_state)
            algorithm.begin_local(model, global_state, client)
            starts.append([p.detach().clone() for p in model.parameters()])
    steps = [settings.local_epochs * math.ceil(c.num_samples / batch_size) for c in clients]
    # most steps first: at step t the clients still training are a prefix of the stack
    order = sorted(range(len(clients)), key=lambda i: -steps[i])
    sorted_steps = [steps[i] for i in order]
    max_steps = sorted_steps[0] if sorted_steps else 0
    by_client = torch.full((len(clients), max_steps * batch_size), -1, dtype=torch.int64)
    for row, i in enumerate(order):
        _fill_client_batches(by_client[row], clients[i], settings.local_epochs, batch_size)
    # The batches every step trains, step after step: at step t, the batches of the clients
    # still training (a prefix of the stack), [sum over steps of the active clients, batch].
    active_at = [sum(1 for s in sorted_steps if s > step) for step in range(max_steps)]
    training = torch.arange(len(clients)).unsqueeze(0) < torch.tensor(active_at, dtype=torch.int64).unsqueeze(1)
    batches = by_client.view(len(clients), max_steps, batch_size).transpose(0, 1)[training]
    # dropout: each client's masks from its own generator, drawn for its real rows (counted here, on
    # the CPU, so that drawing them costs no device sync)
    model.train()
    plan = dropout_plan(model, x[:1]) if any(isinstance(m, Dropout) for m in model.modules()) else []
    dropouts = [layer for layer, _ in plan]
    generators = [dropout_generator(clients[i].seed, x.device) for i in order] if plan else []
    real_rows = (batches >= 0).sum(dim=1).tolist() if plan else []
    batches = batches.to(x.device)
    real = batches >= 0
    rows = batches.clamp_min(0)
    labels_all = y.index_select(0, rows.view(-1)).view_as(batches).masked_fill_(~real, IGNORE_INDEX)  # ignored
    weights_all = real.to(x.dtype)
    weights_all /= weights_all.sum(dim=1, keepdim=True)  # 1 / the client's real rows in that batch
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

    # a dense model under an adjusted cross entropy: gradients in closed form, no autograd (engine.closed_form)
    closed_form_steps = _closed_form_steps(algorithm, model, names)
    closed_form = closed_form_steps is not None
    if closed_form:
        adjustment = algorithm.batched_logit_adjustment(counts, params[0].dtype).to(x.device)
        product = gemm.bmm if gemm.uses_portable_layers(model) else torch.bmm  # the model's kernel recipe
    else:
        batched_forward = _dense_forward(model, names) or _vmapped_forward(model, names, dropouts)
        objective = _batched_objective(algorithm) if _has_batched_loss(algorithm) else _vmapped_objective(algorithm)
    # the inputs of many steps are gathered at once (one indexing op instead of one per step), a block
    # of at most GATHER_BYTES at a time; on the closed-form path with each row's weighted one-hot target
    row_bytes = batch_size * (x[:1].nbytes + (counts.shape[1] * x.element_size() if closed_form else 0))
    steps_per_block = max(1, GATHER_BYTES // max(1, len(clients) * row_bytes))
    active, first = -1, 0
    for step in range(max_steps):
        if step % steps_per_block == 0:
            block_first = first
            block_rows = slice(first, first + sum(active_at[step:step + steps_per_block]))
            block = x.index_select(0, rows[block_rows].view(-1)).view(-1, batch_size, *x.shape[1:])
            if closed_form:
                block_targets = one_hot_targets(labels_all[block_rows], weights_all[block_rows], counts.shape[1])
        if active_at[step] != active:  # some clients' local training is over: views of the rest
            active = active_at[step]
            params_now = [p[:active] for p in params]
            momentum_now = [m[:active] if m is not None else None for m in momentum]
            start_now = [s[:active] for s in start]
            counts_now, loss_now = counts[:active], loss_sum[:active]
            adjustment_now = adjustment.head(active) if closed_form else None
        batch = slice(first, first + active)
        in_block = slice(first - block_first, first - block_first + active)
        inputs = block[in_block]  # [active, batch_size, ...]
        first += active
        if closed_form:
            live = params_now
            grads, losses = closed_form_step(closed_form_steps, params_now, inputs, labels_all[batch],
                                             weights_all[batch], block_targets[in_block], adjustment_now, product)
        else:
            live = [p.detach().requires_grad_(True) for p in params_now]
            masks = _step_masks(plan, generators[:active], real_rows[batch], batch_size, x.device) if plan else []
            features, logits = batched_forward(live, inputs, masks)
            total, losses = objective(logits, features, labels_all[batch], counts_now, weights_all[batch])
            grads = list(torch.autograd.grad(total, live, allow_unused=True))
        if needs_start:
            algorithm.vectorised_after_backward(live, grads, start_now)
        sgd_update(params_now, grads, momentum_now,
                   lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
        loss_now += losses

    keys = list(global_state)
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
