"""The hook interface every federated method implements.

A method overrides only what differs from FedAvg:

- `adapt_model`       architecture changes a paper makes (MOON's projection head)
- `local_loss`        the client objective (FedLC, FedRS, FedNTD, FedED, FL-FCR, ...)
- `begin_local` / `after_backward` / `local_step`
                      client-side state and optimiser changes (FedProx, SCAFFOLD,
                      FedSAM, FedDyn, MOON, ...)
- `client_payload`    extra tensors a client uploads (control variates, statistics)
- `aggregate`         the server update (FedNova, FedOpt, FedEXP, FedDyn, ...)
- `begin_exchange`    a second round trip after aggregation: every participant receives the
                      new model and answers with what it computes on its data (CCVR's way of
                      gathering FL-FCR's feature statistics)
- `round_metrics`     numbers a method reports each round (logged with the history)
- `state_dict` / `load_state_dict`
                      state kept across rounds, saved in checkpoints

Combinations named in the papers (e.g. FedLC+FedProx) are subclasses of both parents:
each parent overrides different hooks, so the composition needs no new code.
The engine (fedskew.engine) owns the loop and contains no per-method branches.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.fl.losses import LogitAdjustment, batched_cross_entropy
from fedskew.numerics.adam import Adam
from fedskew.numerics.sgd import SGD, LocalOptimizer

StateDict = dict[str, torch.Tensor]


@dataclass
class ClientContext:
    """What a client knows in one round. `label_counts` covers its whole local set (n_c)."""

    client_id: int
    round: int
    indices: torch.Tensor
    label_counts: torch.Tensor
    generator: torch.Generator
    seed: int = 0  # the (seed, round, client) seed the generator was made from; also seeds dropout

    @property
    def num_samples(self) -> int:
        return int(self.indices.numel())


@dataclass
class ClientUpdate:
    """What a client sends back after local training."""

    client_id: int
    num_samples: int
    state: StateDict
    num_steps: int
    train_loss: float
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundResult:
    """What one round of any method produces, for the engine to check, log and checkpoint.

    `traffic` counts bytes by direction and kind, keys "up_<kind>" / "down_<kind>"
    (kinds: weights, payload, activations, labels, gradients).
    """

    global_state: StateDict
    client_losses: dict[int, float]   # mean training loss per participant (the NaN guard names the client)
    client_samples: dict[int, int]    # |D_k| per participant (weights the round's training loss)
    traffic: dict[str, int]


@dataclass(frozen=True)
class TrainingSettings:
    """The local-training settings every method receives (from params.yaml `training`)."""

    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    optimizer: str = "sgd"  # "sgd" or "adam" (training.optimizer)


def local_optimizer(params: Iterable[torch.Tensor], settings: TrainingSettings) -> LocalOptimizer:
    """The optimiser of one client's (or one part's) local training, made anew for each client and round."""
    if settings.optimizer == "adam":
        return Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
    if settings.optimizer != "sgd":
        raise ValueError(f"training.optimizer must be sgd or adam, got {settings.optimizer!r}")
    return SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)


class Algorithm:
    """What every method, federated or split-federated, shares: a name, hyperparameters with
    paper defaults, state kept across rounds, and how its model is evaluated."""

    name: ClassVar[str]
    family: ClassVar[str]  # "federated" or "split": the engine runs the family's round
    # Hyperparameters with the paper defaults; params.yaml may override each one.
    hyperparameters: ClassVar[dict[str, float | bool]] = {}
    # Where the paper stands on each hyperparameter the paper leaves open (shown by `fedskew methods`).
    paper_status: ClassVar[dict[str, str]] = {}
    # The numerics version: raised when a change moves the bits this method computes (its fingerprint in
    # tests/fingerprints/ says so), which gives its runs new ids and so retrains them. It is the `version` a class
    # sets in its own body, 1 if it sets none, never its parent's (run ids read it from this file without
    # importing it: fedskew.discovery.declared_versions); a composition whose parent moves raises its own.
    version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A composition (class FedLCProx(FedLC, FedProx)) inherits the hyperparameters of all its parents."""
        super().__init_subclass__(**kwargs)
        cls.version = vars(cls).get("version", 1)  # its own, as fedskew.discovery reads it
        merged: dict[str, float | bool] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("hyperparameters", {}))
        cls.hyperparameters = merged

    def __init__(self, settings: TrainingSettings, num_clients: int, num_classes: int,
                 **hyperparameters: float | bool):
        unknown = set(hyperparameters) - set(self.hyperparameters)
        if unknown:
            raise ValueError(f"{self.name}: unknown hyperparameters {sorted(unknown)}; "
                             f"known: {sorted(self.hyperparameters) or 'none'}")
        self.settings = settings
        self.num_clients = num_clients
        self.num_classes = num_classes
        self.hp = {**self.hyperparameters, **hyperparameters}

    def set_label_counts(self, label_counts: torch.Tensor) -> None:
        """Every client's label counts [num_clients, C], given once before training.

        Only for methods whose papers use global class statistics (FL-FCR's N_c); a
        method that uses them must say so, since real clients would have to share them.
        """

    def evaluate_global(self, model: nn.Module, global_state: StateDict,
                        evaluate: Callable[[nn.Module], dict]) -> dict:
        """Test metrics of the trained model: by default the global model's.

        A method whose result is not one global model (SplitFedV3's personal client
        parts) says here how it is evaluated.
        """
        model.load_state_dict(global_state)
        return evaluate(model)

    def round_metrics(self) -> dict[str, float]:
        """Method-specific numbers of the last round (e.g. FedEXP's server step), logged per round."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State kept across rounds; saved in checkpoints for bit-identical resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.name} keeps no state, but the checkpoint holds {sorted(state)}")


class FederatedAlgorithm(Algorithm):
    """FedAvg (McMahan et al., 2017); the base every other federated method refines."""

    name: ClassVar[str] = "fedavg"
    family: ClassVar[str] = "federated"
    # The client-side hooks this class defines that the vectorised path can run
    # (fedskew.engine.vectorised, training.execution), checked against the class that defines
    # each hook, so a subclass overriding a hook must declare it again:
    #   "local_loss"      reads only `client.label_counts`, uses ops `vmap` supports, and averages
    #                     over the batch with F.cross_entropy (padded rows have label -100, ignored);
    #                     a `batched_local_loss` (or `batched_logit_adjustment`) in the same class is
    #                     used instead of `vmap` (faster; the adjustment lets dense models skip autograd);
    #   "after_backward"  has a `vectorised_after_backward` in the same class.
    vectorised_hooks: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------- the model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Change the architecture where the method's paper does (e.g. MOON's projection head).

        Called once, before the initial global model is taken from it.
        """
        return model

    # ----------------------------------------------------------------- client side
    def make_optimizer(self, model: nn.Module) -> LocalOptimizer:
        return local_optimizer(model.parameters(), self.settings)

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        """Called after the client loaded the global model, before its first step."""

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        """The client objective on one minibatch.

        `features` are the body's output (the head's input); `x` is the batch input, for
        methods that run another model on it (a frozen global teacher, a previous model).
        """
        return F.cross_entropy(logits, y)

    def batched_local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                           label_counts: torch.Tensor) -> torch.Tensor:
        """`local_loss` of a stack of clients at once, row by row, for the vectorised path.

        `logits` [C, B, K], `features` [C, B, F], labels `y` [C, B] with -100 on padded rows,
        `label_counts` [C, K]. Returns each row's loss [C, B], 0 on padded rows; the engine
        averages each client's real rows, as `local_loss`'s F.cross_entropy averages its batch.
        Used only where the class defining it (or the `batched_logit_adjustment` it uses) also
        defines (or inherits unchanged) `local_loss`; otherwise the vectorised path runs
        `local_loss` per client under `vmap`. This one is the cross entropy of the logits as
        `batched_logit_adjustment` adjusts them; a method whose loss has that form overrides
        only the adjustment, and the vectorised path then needs no autograd
        (fedskew.engine.closed_form).
        """
        adjustment = self.batched_logit_adjustment(label_counts, logits.dtype).to(logits.device)
        return batched_cross_entropy(adjustment.apply(logits), y)

    def batched_logit_adjustment(self, label_counts: torch.Tensor, dtype: torch.dtype) -> LogitAdjustment:
        """Per client and class, how `batched_local_loss` adjusts the logits before its cross entropy.

        `label_counts` [C, K]; tensors of `dtype` on its device. FedAvg: none (plain cross entropy).
        """
        return LogitAdjustment()

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        """Adjust gradients between backward and the optimiser step."""

    def vectorised_after_backward(self, params: list[torch.Tensor], grads: list[torch.Tensor | None],
                                  start: list[torch.Tensor]) -> None:
        """`after_backward` for stacked clients (vectorised path): adjust `grads` in place.

        Each list follows `model.parameters()`; every tensor has a leading client dimension.
        `start` holds each client's parameters when its local training began.
        """

    def local_step(self, model: nn.Module, optimizer: LocalOptimizer, x: torch.Tensor,
                   y: torch.Tensor, client: ClientContext) -> torch.Tensor:
        """One minibatch step; returns the (detached) loss."""
        optimizer.zero_grad(set_to_none=True)
        features = model.body(x)
        loss = self.local_loss(model.head(features), features, y, client, x=x)
        loss.backward()
        self.after_backward(model, client)
        optimizer.step()
        return loss.detach()

    def client_payload(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        """Tensors uploaded besides the model state (counted as communication)."""
        return {}

    def download_payload(self, client: ClientContext) -> dict[str, Any]:
        """Tensors sent to a client besides the global model (counted as communication)."""
        return {}

    # ----------------------------------------------------------------- server side
    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        return weighted_average([u.state for u in updates], [u.num_samples for u in updates])

    def begin_aggregate(self, global_state: StateDict, num_samples: list[int]) -> RoundAggregate | None:
        """The round's aggregation fed one update at a time, or None to receive every update at once.

        `num_samples` lists the participants' sizes in the order their updates will come.
        FedAvg's weighted average streams; a method that overrides `aggregate` streams only
        if it also overrides this hook (and then computes `aggregate` through it, so the two
        paths are one). The engine drops each update's state as soon as it is folded, so a
        round holds one model copy besides the global state, whatever the participants.
        """
        if type(self).aggregate is FederatedAlgorithm.aggregate:
            return AverageFold(num_samples)
        return None

    def begin_exchange(self, state: StateDict) -> Exchange | None:
        """A second round trip after aggregation, or None (the default: one exchange a round).

        The engine sends `state` to every participant of the round (counted as traffic), lets each
        answer with `Exchange.client_message` computed on its own local set, folds the answers in
        client order and takes `Exchange.finish()` as the round's new global state.
        """
        return None


class Exchange(abc.ABC):
    """One round's second exchange (`FederatedAlgorithm.begin_exchange`)."""

    @abc.abstractmethod
    def client_message(self, model: nn.Module, client: ClientContext, x: torch.Tensor,
                       y: torch.Tensor) -> dict[str, Any]:
        """On the client: what it uploads, computed with `model` (holding the aggregated state, in eval
        mode) on its local set `x`, `y`. It must not change the model."""

    @abc.abstractmethod
    def fold(self, client: ClientContext, message: dict[str, Any]) -> None:
        """On the server: take in one client's message."""

    @abc.abstractmethod
    def finish(self) -> StateDict:
        """The round's new global state."""


class RoundAggregate(abc.ABC):
    """One round's aggregation, folded one client update at a time."""

    @abc.abstractmethod
    def fold(self, update: ClientUpdate) -> None:
        """Take in one client's update (its state and payload are dropped right after)."""

    @abc.abstractmethod
    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        """The new global state; `updates` keep every field but their (dropped) states and payloads."""

    @classmethod
    def run(cls, aggregate: RoundAggregate, updates: list[ClientUpdate]) -> StateDict:
        """Feed a whole round's updates (for `aggregate` computed through a stream)."""
        for update in updates:
            aggregate.fold(update)
        return aggregate.finish(updates)


class AverageFold(RoundAggregate):
    """`weighted_average` by sample counts, streamed: same order, same weights, bit-identical."""

    def __init__(self, num_samples: list[int]) -> None:
        self.total = sum(num_samples)
        self.average: StateDict = {}

    def fold(self, update: ClientUpdate) -> None:
        weight = update.num_samples / self.total
        for key, value in update.state.items():
            if key not in self.average:
                self.average[key] = torch.zeros_like(value) if value.is_floating_point() else value.clone()
            if value.is_floating_point():
                self.average[key].add_(value, alpha=weight)
            else:  # integer buffers (BatchNorm's num_batches_tracked) take the maximum
                torch.maximum(self.average[key], value, out=self.average[key])

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.average



def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` for inference only (a teacher, a previous model): eval mode, no gradients.

    Methods keep one such module and re-load it per client, never one per client.
    """
    clone = copy.deepcopy(model)
    clone.eval()
    for param in clone.parameters():
        param.requires_grad_(False)
        param.grad = None
    return clone


def weighted_average(states: list[StateDict], weights: list[float]) -> StateDict:
    """Average parameters and floating buffers (BatchNorm statistics) by `weights`.

    Integer buffers (BatchNorm's num_batches_tracked) cannot be averaged meaningfully;
    they take the maximum over clients.
    """
    total = float(sum(weights))
    out: StateDict = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            acc = torch.zeros_like(first)
            for state, weight in zip(states, weights):
                acc.add_(state[key], alpha=weight / total)
            out[key] = acc
        else:
            out[key] = torch.stack([state[key] for state in states]).amax(dim=0)
    return out
