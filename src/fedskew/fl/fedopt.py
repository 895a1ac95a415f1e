"""FedOpt (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): FedAdam, FedYogi, FedAdagrad.

Clients run plain local SGD as in FedAvg; the server treats the averaged model change
as a pseudo-gradient and applies an adaptive optimiser to it (Reddi et al., Algorithm 2):

    Δ   = Σ_i p_i (y_i − x),  p_i = n_i / Σ_j n_j over the round's clients
    m   ← β1·m + (1 − β1)·Δ
    v   ← v + Δ²                                   (FedAdagrad)
    v   ← v − (1 − β2)·Δ²·sign(v − Δ²)             (FedYogi)
    v   ← β2·v + (1 − β2)·Δ²                       (FedAdam)
    x   ← x + η·m / (√v + τ)

Choices (each also noted where it is made):

- Δ is weighted by sample count (as FedAvg is here); Algorithm 2 writes the unweighted
  mean over the sampled clients. With equal client sizes the two coincide.
- No bias correction of m and v, as in Reddi's Algorithm 2.
- m starts at 0 and v at τ²: Algorithm 2 requires v_{-1} ≥ τ², and τ² is the smallest
  value it allows (Flower and the FedExP authors' code start v at 0; after one round the
  difference is at most τ² = 1e-6 in v).
- Only trainable parameters get the server optimiser. Buffers (BatchNorm running
  statistics) are not gradients of anything: they are averaged as in FedAvg (integer
  buffers such as num_batches_tracked take the maximum), so a BN model stays valid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedskew.fl.base import (
    AverageFold,
    ClientContext,
    ClientUpdate,
    FederatedAlgorithm,
    RoundAggregate,
    StateDict,
)
from fedskew.numerics import exact_math


class ParameterAwareAlgorithm(FederatedAlgorithm):
    """Base for server-side methods that treat parameters and buffers differently.

    `aggregate` only sees state dicts, which mix parameters with buffers. The names of
    the model's floating-point parameters are taken from the model in `adapt_model`
    (called once by the engine, also on resume) and again in `begin_local` (for callers
    that skip adapt_model). Not registered: it sets no `name` of its own.
    """

    _parameter_keys: tuple[str, ...] | None = None

    def adapt_model(self, model: nn.Module) -> nn.Module:
        model = super().adapt_model(model)
        self._remember_parameters(model)
        return model

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        self._remember_parameters(model)

    def _remember_parameters(self, model: nn.Module) -> None:
        # remove_duplicate=False: a tied weight appears under every name the state dict uses.
        self._parameter_keys = tuple(name for name, p in model.named_parameters(remove_duplicate=False)
                                     if p.is_floating_point())

    def parameter_keys(self) -> tuple[str, ...]:
        if self._parameter_keys is None:
            raise RuntimeError(f"{self.name}: the model's parameter names are unknown; "
                               "adapt_model (or begin_local) must see the model before aggregate")
        return self._parameter_keys


def sample_weights(updates: list[ClientUpdate]) -> list[float]:
    """p_i = n_i / Σ_j n_j over the round's clients."""
    total = float(sum(u.num_samples for u in updates))
    return [u.num_samples / total for u in updates]


class PseudoGradientFold(RoundAggregate):
    """FedAvg's average (buffers keep it) and the pseudo-gradient Δ = Σ_i p_i (y_i − x) over the
    parameters, p_i = n_i / Σ_j n_j, summed one client at a time in the round's order;
    `step(average, Δ)` makes the new global state."""

    def __init__(self, global_state: StateDict, num_samples: list[int], keys: Callable[[], tuple[str, ...]],
                 step: Callable[[StateDict, StateDict], StateDict]) -> None:
        self.global_state, self.keys, self.step = global_state, keys, step
        self.average = AverageFold(num_samples)
        self.total = float(sum(num_samples))
        self.delta: StateDict | None = None  # the parameter names are known once a client has trained

    def fold(self, update: ClientUpdate) -> None:
        self.average.fold(update)
        if self.delta is None:
            self.delta = {key: torch.zeros_like(self.global_state[key]) for key in self.keys()}
        p = update.num_samples / self.total
        for key, acc in self.delta.items():
            acc.add_(update.state[key] - self.global_state[key], alpha=p)

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.step(self.average.finish(updates), self.delta)


class _ServerOptimizer(ParameterAwareAlgorithm):
    """Shared FedOpt server step; subclasses define the second-moment update `_update_v`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.hp["server_lr"] > 0:
            raise ValueError(f"{self.name}: server_lr must be > 0, got {self.hp['server_lr']}")
        if not self.hp["tau"] > 0:
            raise ValueError(f"{self.name}: tau must be > 0 (it keeps √v + τ away from 0), got {self.hp['tau']}")
        for beta in ("beta1", "beta2"):
            if beta in self.hp and not 0 <= self.hp[beta] < 1:
                raise ValueError(f"{self.name}: {beta} must be in [0, 1), got {self.hp[beta]}")
        self._m: StateDict = {}  # empty until the first aggregation
        self._v: StateDict = {}

    def _update_v(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        """The second-moment rule: the one line that tells Adam, Yogi and Adagrad apart (each defines it)."""
        raise NotImplementedError(f"{type(self).__name__} must define its second-moment update")

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        return RoundAggregate.run(self.begin_aggregate(global_state, [u.num_samples for u in updates]), updates)

    def begin_aggregate(self, global_state: StateDict, num_samples: list[int]) -> RoundAggregate:
        # Buffers as in FedAvg; parameters replaced by the server optimiser's step.
        return PseudoGradientFold(global_state, num_samples, self.parameter_keys,
                                  lambda average, delta: self._server_step(global_state, average, delta))

    def _server_step(self, global_state: StateDict, out: StateDict, delta: StateDict) -> StateDict:
        lr, beta1, tau = self.hp["server_lr"], self.hp["beta1"], self.hp["tau"]
        for key in self.parameter_keys():
            d = delta[key]
            m = self._m[key] if key in self._m else torch.zeros_like(d)
            v = self._v[key] if key in self._v else torch.full_like(d, tau * tau)  # v_{-1} = τ² (docstring)
            # New tensors each round (no in-place updates): a returned state_dict stays a snapshot.
            m = beta1 * m + (1 - beta1) * d
            v = self._update_v(v, d * d)
            self._m[key], self._v[key] = m, v
            out[key] = global_state[key] + lr * m / (exact_math.sqrt(v) + tau)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"m": dict(self._m), "v": dict(self._v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"m", "v"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        self._m = dict(state.get("m", {}))
        self._v = dict(state.get("v", {}))


# Defaults. β1 = 0.9, β2 = 0.99, τ = 1e-3 as in Reddi's experiments (METHODS.md). The server
# learning rate η is tuned per task in Reddi et al. (log10 grid) and the FedLC paper does
# not report its choice. FedAdam/FedYogi: η = 0.01, the default of Flower's reference
# FedYogi (η = 1e-2 with τ = 1e-3 and client lr 10^-1.5, a CIFAR-10 setting); Adam and
# Yogi take nearly the same steps while v is small, so they share it. FedAdagrad: η = 0.1,
# the FedExP authors' FedAdagrad baseline on CIFAR-10/100 (github.com/Divyansh03/FedExP);
# Adagrad's v only grows, so its steps shrink like 1/√t and it needs a larger η (on the
# tiny digits test 0.01 reached 0.48 accuracy in 10 rounds, 0.1 reached 0.92).

class FedAdam(_ServerOptimizer):
    """Server Adam without bias correction: v ← β2·v + (1 − β2)·Δ²."""

    name = "fedadam"
    hyperparameters = {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}

    def _update_v(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        beta2 = self.hp["beta2"]
        return beta2 * v + (1 - beta2) * delta_sq


class FedYogi(_ServerOptimizer):
    """Server Yogi: v ← v − (1 − β2)·Δ²·sign(v − Δ²) (additive, so v cannot blow up like Adam's)."""

    name = "fedyogi"
    hyperparameters = {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}

    def _update_v(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.hp["beta2"]) * delta_sq * torch.sign(v - delta_sq)


class FedAdagrad(_ServerOptimizer):
    """Server Adagrad (with Reddi's β1 momentum on m): v ← v + Δ².

    β2 plays no role in Adagrad, so it is not a hyperparameter here (an unused knob in
    params.yaml would be silently ignored; the base rejects it instead).
    """

    name = "fedadagrad"
    hyperparameters = {"server_lr": 0.1, "beta1": 0.9, "tau": 1e-3}

    def _update_v(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return v + delta_sq
