"""Dense models in the vectorised path: their batched forward, and a step without autograd under an adjusted
cross entropy.

A dense model (Linear layers, elementwise activations, Flatten: logistic regression and MLPs) is a chain of
steps (`dense_chain`), and its forward for a stack of clients a chain of batched matrix products
(`dense_forward`): on a CPU, vmap's per-op dispatch costs several sequential client steps of such a model.

Why: on a CPU, a batched step of logistic regression for 10 clients is bound by the cost of
launching operations, not by arithmetic, and autograd's engine is the largest share of it
(about 50 µs a call, before its first node, on the 2-core development machine; one batched
step took about 400 µs through autograd and 220 µs in closed form). The speed target for
FedLC Table 4's rounds (vectorised ≤ 0.5 of the sequential floor, benchmarks/README.md) is out
of reach with autograd in every step.

When the closed form applies (`supports_closed_form`, checked by fedskew.engine.vectorised):
- the model is a chain of Linear layers and ReLU (Flatten and Identity pass through):
  logistic regression and the MLPs;
- the method's batched loss is the cross entropy of adjusted logits,
  z'_c = s_c·z_c + t_c with masked classes at −∞ (`FederatedAlgorithm.logit_adjustment`):
  FedAvg, FedLC, FedLogit, FedRS and the methods that keep their loss (FedProx, FedNova,
  FedOpt, FedEXP, FedLC+FedProx). The loss is still each method's own: the gradient is
  derived from the adjustment the method declares, the same one its batched loss applies.

The gradient of a client's mean loss, with w = 1 / (its real rows in the batch) on real rows
and 0 on padded ones: ∂/∂z'_c = w·(softmax(z')_c − [c = y]) (a masked class has softmax 0, so
gradient 0, as autograd gives through `masked_fill`), and ∂/∂z_c = s_c·∂/∂z'_c. Back through
the chain, activations kept as [C, features, B] as in the dense forward: a Linear layer
z = W h + b gives ∂W = G hᵀ, ∂b = Σ_rows G and passes Wᵀ G down; a ReLU passes G where its
input is positive and 0 elsewhere. These are autograd's own formulas, so the two paths
agree to round-off (tests/unit/test_vectorised.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.fl.losses import LogitAdjustment

_PASS_THROUGH = (nn.Identity,)
# Layers a dense model may hold besides nn.Linear: they act elementwise, so any layout suits them.
_ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)
# (client parameters, inputs, dropout masks) -> (features, logits), each with a leading client dimension
Forward = Callable[[list[torch.Tensor], torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


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


def dense_chain(model: nn.Module, names: list[str]) -> tuple[list, list] | None:
    """The body's and the head's dense steps (see `_dense_steps`), or None if the model is not dense."""
    position = {name: i for i, name in enumerate(names)}
    body = _dense_steps(model.body, "body", position)
    head = _dense_steps(model.head, "head", position) if body is not None else None
    return None if body is None or head is None else (body, head)


def dense_forward(model: nn.Module, names: list[str]) -> Forward | None:
    """The forward of a dense model (logistic regression, MLPs) as batched matrix products, or None.

    Activations are kept transposed, [C, features, B], so every layer is one `baddbmm(b, W, h)`
    with W [C, out, in], the orientation in which a CPU's batched GEMM is fastest for a narrow
    output (measured on the 2-core machine: 43 µs against 100–150 µs for [C, B, in] @ [C, in, out]
    at 10 × 128 × 60 → 10).
    """
    chain = dense_chain(model, names)
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


def supports_closed_form(steps: list) -> bool:
    """Whether a dense chain (`dense_chain`, body then head) has only layers whose gradient is written here."""
    return all(not isinstance(step, nn.Module) or isinstance(step, (nn.ReLU, *_PASS_THROUGH)) for step in steps)


def dense_step_forward(step: nn.Module | tuple, params: list[torch.Tensor], h: torch.Tensor,
                       bmm: Callable | None = None) -> torch.Tensor:
    """One step of a dense chain on activations [C, features, B]: a linear layer's batched
    `baddbmm(b, W, h)` (W [C, out, in]) or an elementwise module. The vectorised dense forward's
    layer and this module's forward; `bmm`, when given, computes the product (then the bias is added)."""
    if isinstance(step, nn.Module):
        return step(h)
    if bmm is not None:
        product = bmm(params[step[0]], h)
        return product if step[1] is None else product.add_(params[step[1]].unsqueeze(2))
    if step[1] is None:
        return torch.bmm(params[step[0]], h)
    return torch.baddbmm(params[step[1]].unsqueeze(2), params[step[0]], h)


def one_hot_targets(labels: torch.Tensor, weights: torch.Tensor, num_classes: int) -> torch.Tensor:
    """w·[c = y] for rows of labels [N, B] and weights [N, B]: [N, K, B] (0 on padded rows).

    Built for a block of steps at once: per step, the comparison alone cost about a third
    of the step's arithmetic (a broadcasting kernel on a small tensor).
    """
    classes = torch.arange(num_classes, device=labels.device).view(1, -1, 1)
    return (classes == labels.unsqueeze(1)) * weights.unsqueeze(1)


def closed_form_step(steps: list, params: list[torch.Tensor], inputs: torch.Tensor, labels: torch.Tensor,
                     weights: torch.Tensor, targets: torch.Tensor, adjustment: LogitAdjustment,
                     bmm: Callable = torch.bmm) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Each client's gradients of its mean loss (in the order of `params`) and its mean loss.

    `steps` the body's and the head's dense steps in order; `params` stacked [C, ...];
    `inputs` [C, B, ...]; `labels` [C, B] (IGNORE_INDEX on padded rows); `weights` [C, B];
    `targets` their `one_hot_targets`, [C, K, B]; `adjustment` per client and class, [C, K];
    `bmm` the batched product (fedskew.numerics.gemm.bmm for a model of portable layers, else torch's).
    """
    clients, batch = labels.shape
    h = inputs.reshape(clients, batch, -1).transpose(1, 2)  # [C, features, B]
    step_inputs, first_linear = [], None
    for position, step in enumerate(steps):
        step_inputs.append(h)
        if first_linear is None and not isinstance(step, nn.Module):
            first_linear = position
        h = dense_step_forward(step, params, h, None if bmm is torch.bmm else bmm)

    # h: the logits, [C, K, B]; the loss as F.cross_entropy computes it (padded rows: 0)
    log_p = torch.log_softmax(adjustment.apply(h, classes_last=False), dim=1)
    losses = (F.nll_loss(log_p, labels, reduction="none") * weights).sum(dim=1)
    g = log_p.exp_().mul_(weights.unsqueeze(1)).sub_(targets)  # ∂/∂z' = w·softmax(z') − w·[c = y]
    if adjustment.scale is not None:
        g = g.mul_(adjustment.scale.unsqueeze(2))  # ∂/∂z

    grads: list[torch.Tensor | None] = [None] * len(params)
    for position in range(len(steps) - 1, first_linear - 1, -1):
        step, step_input = steps[position], step_inputs[position]
        if isinstance(step, nn.ReLU):
            g = torch.where(step_input > 0, g, 0.0)
        elif isinstance(step, _PASS_THROUGH):
            continue
        else:
            weight, bias = step
            grads[weight] = bmm(g, step_input.transpose(1, 2))
            if bias is not None:
                grads[bias] = g.sum(dim=2)
            if position > first_linear:  # the first layer's input needs no gradient
                g = bmm(params[weight].transpose(1, 2), g)
    return grads, losses
