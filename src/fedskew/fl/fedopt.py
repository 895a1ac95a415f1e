"""FedOpt (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): FedAdam, FedYogi, FedAdagrad.

Clients run plain local SGD as in FedAvg; the server treats the averaged model change
as a pseudo-gradient and applies an adaptive optimiser to it (Reddi et al., Algorithm 2;
fedskew.fl.server_math.adaptive_server_step and the three second-moment rules):

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

from fedskew.fl.base import (
    ClientUpdate,
    FederatedAlgorithm,
    Fold,
    Hyperparameter,
    RoundStart,
    StateDict,
    client_update,
)
from fedskew.fl.server_math import (
    adagrad_second_moment,
    adam_second_moment,
    adaptive_server_step,
    yogi_second_moment,
)


def SERVER_LR(default: float) -> Hyperparameter:
    return Hyperparameter(default, exclusive_minimum=0)


def BETA(default: float) -> Hyperparameter:
    return Hyperparameter(default, minimum=0, exclusive_maximum=1)


TAU = Hyperparameter(1e-3, exclusive_minimum=0)  # the adaptivity: v starts at τ²


class _ServerOptimizer(FederatedAlgorithm):
    """FedOpt's server step, shared by its three methods (not one itself: it has no `name`); each defines
    the second-moment rule `second_moment`."""

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

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define its second-moment update")

    def begin_aggregate(self, start: RoundStart) -> Fold:
        return _PseudoGradientFold(start, self._server_step)

    def _server_step(self, start: RoundStart, out: StateDict, delta: StateDict) -> StateDict:
        """Buffers keep FedAvg's average (`out`); parameters take the server optimiser's step."""
        out.update(adaptive_server_step(start.global_state, delta, self._m, self._v, self.hp["server_lr"],
                                        self.hp["beta1"], self.hp["tau"], self.second_moment))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"m": dict(self._m), "v": dict(self._v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"m", "v"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        self._m = dict(state.get("m", {}))
        self._v = dict(state.get("v", {}))


class _PseudoGradientFold(Fold):
    """FedAvg's average and the pseudo-gradient Δ = Σ_i p_i (y_i − x) over the parameters, p_i = n_i / Σ_j n_j,
    summed one client at a time in the round's order; `step(start, average, Δ)` makes the new global state."""

    def __init__(self, start: RoundStart, step: Callable[[RoundStart, StateDict, StateDict], StateDict]) -> None:
        super().__init__(start)
        self.step = step
        self.delta = {key: torch.zeros_like(start.global_state[key]) for key in start.parameters}

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)
        p = update.num_samples / self.total
        for key, acc in self.delta.items():
            acc.add_(client_update(update.state, self.start.global_state, key), alpha=p)

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.step(self.start, super().finish(updates), self.delta)


# Defaults (docs/methods.md, "FedOpt's defaults"). β1 = 0.9, β2 = 0.99, τ = 1e-3 as in Reddi's
# experiments. The server
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
    hyperparameters = {"server_lr": SERVER_LR(0.01), "beta1": BETA(0.9), "beta2": BETA(0.99), "tau": TAU}

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return adam_second_moment(v, delta_sq, self.hp["beta2"])


class FedYogi(_ServerOptimizer):
    """Server Yogi: v ← v − (1 − β2)·Δ²·sign(v − Δ²) (additive, so v cannot blow up like Adam's)."""

    name = "fedyogi"
    hyperparameters = {"server_lr": SERVER_LR(0.01), "beta1": BETA(0.9), "beta2": BETA(0.99), "tau": TAU}

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return yogi_second_moment(v, delta_sq, self.hp["beta2"])


class FedAdagrad(_ServerOptimizer):
    """Server Adagrad (with Reddi's β1 momentum on m): v ← v + Δ².

    β2 plays no role in Adagrad, so it is not a hyperparameter here (an unused knob in
    params.yaml would be silently ignored; the base rejects it instead).
    """

    name = "fedadagrad"
    hyperparameters = {"server_lr": SERVER_LR(0.1), "beta1": BETA(0.9), "tau": TAU}

    def second_moment(self, v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
        return adagrad_second_moment(v, delta_sq)
