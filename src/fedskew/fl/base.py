"""The federated method API: a method is a subclass of FedAvg that overrides only what differs.

One round, as the engine (fedskew.engine.rounds) runs it; each hook has one job:

- `local_start(global_state)`   the state every client starts from (FedEXP: its last iterate)
- `download_payload(client)`    tensors sent with the model (SCAFFOLD's c), counted as traffic
- `begin_local(model, global_state, client)`
                                set up the client's scratch, `client.scratch` (FedProx's anchor, a teacher)
- `local_step(...)`             one minibatch step (FedSAM's two passes); by default forward, then
    `local_loss(...)`           the client objective (FedLC, FedRS, FedNTD, FedED, FL-FCR, MOON, ...),
    `after_backward(...)`       gradient changes before the optimiser steps (FedProx, SCAFFOLD, FedDyn)
- `end_local(model, client, num_steps)`
                                what the client keeps (its store entry: SCAFFOLD's c_i, MOON's previous
                                model) and what it uploads besides its model (statistics, Δc_i)
- `begin_aggregate(start)`      the round's `Fold`: the server update, fed one client update at a time
                                (FedNova, FedOpt, FedEXP, FedDyn, SCAFFOLD, FL-FCR); `aggregate` is derived
- `begin_exchange(state)`       an optional second round trip after aggregation (FL-FCR's CCVR reading)

Besides: `adapt_model` (architecture, once: MOON's projection head), `set_label_counts` (global class
counts, once), `round_metrics`, `state_dict` / `load_state_dict` (what is kept across rounds: server state
and per-client stores, saved in checkpoints), `evaluate_global`.

The vectorised path (fedskew.engine.vectorised) trains every participant at once and runs the batched
form of each client hook a method overrides: a method marked `@batched("<hook>")` next to the scalar one.

Combinations named in the papers (e.g. FedLC+FedProx) are subclasses of both parents: each parent
overrides different hooks, so the composition needs no new code. The engine contains no per-method branch.
docs/methods.md ("Writing a method") is the one-page guide.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, final

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.declarations import Hyperparameter, Switch, declared_hyperparameters
from fedskew.families import Family, Panel
from fedskew.fl.losses import LogitAdjustment
from fedskew.fl.server_math import RunningAverage, StateDict, client_update
from fedskew.numerics.adam import Adam
from fedskew.numerics.sgd import SGD, LocalOptimizer

__all__ = ["Algorithm", "ClientContext", "ClientUpdate", "Exchange", "FederatedAlgorithm", "Fold", "Hyperparameter",
           "Panel", "RoundResult", "RoundStart", "StateDict", "Switch", "TrainingSettings", "batched", "frozen_copy",
           "client_update", "local_optimizer", "trainable_parameters"]


@dataclass
class ClientContext:
    """What a client knows in one round. `label_counts` covers its whole local set (n_c).

    `scratch` is the method's working state for this client's local training (an anchor, a teacher, a
    correction): written by `begin_local`, read by the client hooks, gone with the context after the
    round. A composition's parents share it, so each names its keys after its method.
    """

    client_id: int
    round: int
    indices: torch.Tensor
    label_counts: torch.Tensor
    generator: torch.Generator
    seed: int = 0  # the (seed, round, client) seed the generator was made from; also seeds dropout
    scratch: dict[str, Any] = field(default_factory=dict, repr=False)

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


Method = TypeVar("Method", bound=Callable[..., Any])


def batched(hook: str) -> Callable[[Method], Method]:
    """Mark the decorated method as the batched form of the client hook `hook`, for the vectorised path.

    - "local_loss": `logit_adjustment(label_counts [C, K], dtype) -> LogitAdjustment`, when the loss is the
      cross entropy of adjusted logits (its gradient then has a closed form); or `local_loss` itself, when it
      reads only `client.label_counts` and uses ops `vmap` supports (the engine runs it per client).
    - "after_backward": `(params, grads, start)`, lists following `model.parameters()` with a leading client
      dimension (`start`: each client's parameters when its local training began); adjusts `grads` in place.

    The engine (fedskew.engine.vectorised.batched_form) looks the form up through the method's MRO and takes
    it only from the class that defines the scalar hook or a subclass of it: a class that overrides a scalar
    hook marks a batched form again, or its clients train one after another.
    """
    def mark(method: Method) -> Method:
        method.batched_form_of = hook  # type: ignore[attr-defined]
        return method
    return mark


@dataclass(frozen=True)
class RoundStart:
    """What the server knows when a round's aggregation begins (`FederatedAlgorithm.begin_aggregate`)."""

    global_state: StateDict
    num_samples: list[int]         # the participants' sizes, in the order their updates will come
    parameters: tuple[str, ...]    # state-dict keys of the model's trainable parameters; the rest are buffers


class Fold:
    """One round's aggregation, fed one client update at a time: FedAvg's average, weighted by sample counts.

    A method's fold extends it: `fold` calls `super().fold(update)` (buffers keep FedAvg's average) and adds
    its own sums of each client's update, `client_update` (Δ_i = y_i − x: the sign of every fold, stated there);
    `finish` starts from `super().finish(updates)` and replaces what the method updates. The engine drops each
    update's state and payload right after `fold`, so a round holds one model copy besides the global state,
    whatever the number of participants.
    """

    def __init__(self, start: RoundStart) -> None:
        self.start = start
        self.total = sum(start.num_samples)
        self.average = RunningAverage()

    def fold(self, update: ClientUpdate) -> None:
        """Take in one client's update."""
        self.average.add(update.state, update.num_samples / self.total)

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        """The new global state; `updates` keep every field but their (dropped) states and payloads."""
        return self.average.result()

    def run(self, updates: list[ClientUpdate]) -> StateDict:
        """Fold a whole round's updates in order and finish."""
        for update in updates:
            self.fold(update)
        return self.finish(updates)


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


class Algorithm:
    """What every method, federated or split-federated, shares: a name, hyperparameters with paper defaults,
    state kept across rounds, and how its model is evaluated. The class is the one source of what the method is
    (fedskew.declarations): validation, the listings, the figures' panels and docs/methods.md's table read these
    attributes, the built-in methods' through catalog.json (`python -m fedskew catalog --write`)."""

    name: ClassVar[str]
    family: ClassVar[Family]  # the engine runs the family's round
    # Each hyperparameter with its paper default, allowed values and paper status (a bare value is a
    # Hyperparameter with that default); params.yaml may override each one. A composition has its parents'.
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {}
    # The defaults, by name: what a run fills in for each hyperparameter params.yaml does not set (derived).
    defaults: ClassVar[dict[str, Any]] = {}
    # The panel the accuracy-curve figures draw the method in (a composition takes its first parent's).
    panel: ClassVar[Panel]
    # Why the method's update holds only for SGD's local steps, in a sentence that follows its name (then
    # `training.optimizer: adam` is refused for it); empty: any local optimiser.
    sgd_only: ClassVar[str] = ""
    # Options that 0 turns off, with the options they leave without effect (validation refuses those set).
    switches: ClassVar[tuple[Switch, ...]] = ()
    # The numerics version: raised when a change moves the bits this method computes (its fingerprint in
    # tests/fingerprints/ says so), which gives its runs new ids and so retrains them. It is the `version` a class
    # sets in its own body, 1 if it sets none, never its parent's (run ids read it from this file without
    # importing it: fedskew.discovery.declared_versions); a composition whose parent moves raises its own.
    version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A composition (class FedLCProx(FedLC, FedProx)) inherits the hyperparameters of all its parents."""
        super().__init_subclass__(**kwargs)
        cls.version = vars(cls).get("version", 1)  # its own, as fedskew.discovery reads it
        cls.hyperparameters = declared_hyperparameters(cls)
        cls.defaults = {key: declared.default for key, declared in cls.hyperparameters.items()}

    def __init__(self, settings: TrainingSettings, num_clients: int, num_classes: int,
                 **hyperparameters: float | bool):
        unknown = set(hyperparameters) - set(self.hyperparameters)
        if unknown:
            raise ValueError(f"{self.name}: unknown hyperparameters {sorted(unknown)}; "
                             f"known: {sorted(self.hyperparameters) or 'none'}")
        self.settings = settings
        self.num_clients = num_clients
        self.num_classes = num_classes
        self.hp = {**self.defaults, **hyperparameters}

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
    panel: ClassVar[Panel] = Panel.PLAIN
    family: ClassVar[Family] = Family.FEDERATED

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "aggregate" in vars(cls):  # one server hook: the aggregation is always its fold's
            raise TypeError(f"{cls.__name__} overrides aggregate; override begin_aggregate (its Fold) instead")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inference_models: dict[str, tuple[nn.Module, nn.Module]] = {}  # role -> (source model, copy)

    # ------------------------------------------------------------------- the model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """Change the architecture where the method's paper does (e.g. MOON's projection head).

        Called once, before the initial global model is taken from it.
        """
        return model

    # ------------------------------------------------------------ server, before local training
    def local_start(self, global_state: StateDict) -> StateDict:
        """The state every client of the round starts its local training from: the global model."""
        return global_state

    def download_payload(self, client: ClientContext) -> dict[str, Any]:
        """Tensors sent to a client besides the model (counted as traffic)."""
        return {}

    # ----------------------------------------------------------------- client side
    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        """Set up `client.scratch` for the client hooks; `model` holds the client's start, `global_state` is
        the round's global model. It must not change the model (`local_start` says where clients start)."""

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        """The client objective on one minibatch, averaged over it.

        `features` are the body's output (the head's input); `x` is the batch input, for
        methods that run another model on it (a frozen global teacher, a previous model).
        """
        return F.cross_entropy(logits, y)

    @batched("local_loss")
    def logit_adjustment(self, label_counts: torch.Tensor, dtype: torch.dtype) -> LogitAdjustment:
        """Per client and class, how the loss adjusts the logits before its cross entropy: the batched form of a
        `local_loss` of that form. `label_counts` [C, K]; tensors of `dtype` on its device. FedAvg: none."""
        return LogitAdjustment()

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        """Adjust the gradients between backward and the optimiser step."""

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

    def end_local(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        """After the client's `num_steps` local steps (`model` holds its trained state): update what the
        client keeps across rounds, and return what it uploads besides its model (counted as traffic)."""
        return {}

    # ----------------------------------------------------------------- server side
    def begin_aggregate(self, start: RoundStart) -> Fold:
        """The round's aggregation, fed one client update at a time: FedAvg's weighted average."""
        return Fold(start)

    @final
    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate],
                  parameters: Iterable[str]) -> StateDict:
        """The round's new global state from all its updates at once: the fold of `begin_aggregate` fed them in
        order, as the engine streams them (`parameters`: the state-dict keys of the trainable parameters)."""
        start = RoundStart(global_state, [u.num_samples for u in updates], tuple(parameters))
        return self.begin_aggregate(start).run(updates)

    def begin_exchange(self, state: StateDict) -> Exchange | None:
        """A second round trip after aggregation, or None (the default: one exchange a round).

        The engine sends `state` to every participant of the round (counted as traffic), lets each
        answer with `Exchange.client_message` computed on its own local set, folds the answers in
        client order and takes `Exchange.finish()` as the round's new global state.
        """
        return None

    # ------------------------------------------------------------------ helpers
    def inference_model(self, role: str, model: nn.Module, state: StateDict) -> nn.Module:
        """A frozen copy of `model` for `role` (a teacher, a previous model), loaded with `state`.

        One module per role, built at first use (again for another model) and re-loaded at every call, as
        the engine keeps one model object and re-loads it per client: put it in `client.scratch`, where the
        client's hooks find it, and call this once per client.
        """
        source, module = self._inference_models.get(role, (None, None))
        if source is not model:
            module = frozen_copy(model)
            self._inference_models[role] = (model, module)
        module.load_state_dict(state)
        return module


def trainable_parameters(model: nn.Module) -> tuple[str, ...]:
    """The state-dict keys of `model`'s trainable parameters (a tied weight under every name it has):
    `RoundStart.parameters`."""
    return tuple(name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` for inference only (a teacher, a previous model): eval mode, no gradients."""
    clone = copy.deepcopy(model)
    clone.eval()
    for param in clone.parameters():
        param.requires_grad_(False)
        param.grad = None
    return clone
