"""Vectorised local training, `training.execution`: whether a round's participants train at once.

The sequential path (`rounds.train_client`) trains one client after another on one model; the vectorised
path (fedskew.engine.stacked) stacks every participant's parameters along a leading client dimension and
lets all clients take their t-th SGD step together, with the same minibatches. The two paths compute the
same function with differently batched kernels, so results agree to float round-off, not bit for bit
(tested for every method that vectorises).

What can run vectorised (`vectorisation_blocker` says why not, and the engine falls back to the
sequential path and logs it):
- the model: every parameter in `body` or `head`; dropout only as fedskew's `Dropout`, whose
  masks each client draws from its own generator (the stacked path draws them in advance, in the
  order and shapes the sequential path draws them; a plain `nn.Dropout` draws from torch's global
  generator); no batch normalisation (its batch statistics would include the padded rows, and it
  updates buffers);
- no augmentation (it draws from each client's generator between batches);
- the method: each client hook it overrides has a batched form (`fedskew.fl.base.batched`, resolved
  by `fedskew.engine.batched_forms.batched_form`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedskew.engine.batched_forms import batched_form, defining_class
from fedskew.fl.base import FederatedAlgorithm
from fedskew.models.dropout import has_foreign_dropout
from fedskew.sfl.base import SplitAlgorithm
from fedskew.sfl.parts import stacked_blocker

EXECUTIONS = ("auto", "sequential", "vectorised")

# auto on a CPU: a batched step of a dense model costs about 1.2 sequential client steps of
# logistic regression on the 2-core development machine (benchmarks/synthetic_round.py,
# Synthetic(1,1): vectorised ÷ sequential 0.98 at parallelism 1.6, 0.70 at 2.3, 0.55 at 3.2,
# 0.48 at 4.1), so vectorising pays from about 2.
AUTO_MIN_PARALLELISM = 2.0
# The client hooks local training calls; a method that overrides one needs its batched form.
LOCAL_HOOKS = ("local_step", "local_loss", "after_backward", "end_local")


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
        owner = defining_class(type(algorithm), hook)
        if owner is not FederatedAlgorithm and batched_form(algorithm, hook) is None:
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
