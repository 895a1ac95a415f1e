"""Which batched form of each client hook a method has (fedskew.fl.base.batched), and the batched loss the
vectorised path (fedskew.engine.stacked) builds from it.

A method marks a batched form `@batched("<hook>")` next to the scalar hook; `batched_form` finds it through
the method's MRO. For `local_loss` the form is a `logit_adjustment` (the loss is the cross entropy of the
adjusted logits: its per-row form is built here, and for a dense model of Linear and ReLU layers its gradient
has a closed form, fedskew.engine.closed_form) or `local_loss` itself (run per client under `vmap`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import vmap

from fedskew.engine.closed_form import dense_chain, supports_closed_form
from fedskew.fl.base import FederatedAlgorithm
from fedskew.fl.losses import batched_cross_entropy


def defining_class(klass: type, attribute: str) -> type:
    """The class of `klass`'s MRO whose body defines `attribute`."""
    return next(base for base in klass.__mro__ if attribute in vars(base))


def batched_form(algorithm: FederatedAlgorithm, hook: str) -> str | None:
    """The name of the method's batched form of `hook` (marked `@batched(hook)`, fedskew.fl.base.batched), or None.

    The nearest marked method in the MRO counts only if the class that defines it under that name is the
    class defining the scalar hook or a subclass of it: an override of the scalar hook alone has no
    batched form, while a subclass that overrides the batched form itself keeps it.
    """
    klass = type(algorithm)
    scalar = defining_class(klass, hook)
    for base in klass.__mro__:
        for name, value in vars(base).items():
            if getattr(value, "batched_form_of", None) == hook:
                return name if issubclass(defining_class(klass, name), scalar) else None
    return None


@dataclass
class BatchedClient:
    """What a vectorised `local_loss` may read of its client: the label counts (one row per client under vmap)."""

    label_counts: torch.Tensor


def loss_is_adjusted_cross_entropy(algorithm: FederatedAlgorithm) -> bool:
    """Whether the method's batched loss is the cross entropy of its `logit_adjustment`'s logits (the other
    batched form of `local_loss` is `local_loss` itself, under vmap)."""
    return batched_form(algorithm, "local_loss") not in (None, "local_loss")


# (logits, features, labels, label_counts, row weights) -> (the objective to differentiate, each client's loss)
_Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                      tuple[torch.Tensor, torch.Tensor]]


def adjusted_objective(algorithm: FederatedAlgorithm) -> _Objective:
    """Each client's mean loss from the cross entropy of the method's adjusted logits, row by row.

    `weights` is 1 / (the client's real rows in this batch) on real rows and 0 on padded
    ones, so a client's weighted sum is its mean loss, as F.cross_entropy's mean over one
    client's batch; the sum over clients is differentiated (each client's parameters
    receive only their own rows' gradients).
    """
    adjustment_of = getattr(algorithm, batched_form(algorithm, "local_loss"))

    def objective(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, label_counts: torch.Tensor,
                  weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        adjustment = adjustment_of(label_counts, logits.dtype).to(logits.device)
        weighted = batched_cross_entropy(adjustment.apply(logits), labels) * weights
        return weighted.sum(), weighted.detach().sum(dim=1)

    return objective


def vmapped_objective(algorithm: FederatedAlgorithm) -> _Objective:
    """A method's `local_loss` per client under `vmap` (a loss marked as its own batched form)."""

    def loss(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
             label_counts: torch.Tensor) -> torch.Tensor:
        return algorithm.local_loss(logits, features, labels, BatchedClient(label_counts))

    per_client = vmap(loss)

    def objective(logits: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, label_counts: torch.Tensor,
                  weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = per_client(logits, features, labels, label_counts)
        return means.sum(), means.detach()

    return objective


def closed_form_steps(algorithm: FederatedAlgorithm, model: nn.Module, names: list[str]) -> list | None:
    """The model's dense steps, body then head, where its gradients can be taken in closed form
    (fedskew.engine.closed_form: a chain of Linear and ReLU under an adjusted cross entropy), else None."""
    if not loss_is_adjusted_cross_entropy(algorithm):
        return None
    chain = dense_chain(model, names)
    steps = None if chain is None else chain[0] + chain[1]
    return steps if steps is not None and supports_closed_form(steps) else None
