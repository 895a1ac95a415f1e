"""FedEXP (Jhunjhunwala et al., ICLR 2023): FedAvg with an adaptive, extrapolating server step size.

With client changes Δ_i = y_i − x and their average Δ̄ = Σ p_i Δ_i
(p_i = n_i / Σ_j n_j over the round's S clients):

    η_g = max(1, ½·Σ_i p_i‖Δ_i‖² / (‖Δ̄‖² + S·ε)),   x ← x + η_g·Δ̄

Which form of the denominator. The paper's Algorithm 1 writes, for M clients with
uniform weights, η_g = max(1, Σ_i‖Δ_i‖² / (2M(‖Δ̄‖² + ε))) = max(1, ½·mean‖Δ_i‖² /
(‖Δ̄‖² + ε)). The authors' code (github.com/Divyansh03/FedExP, main.py), which produced
the paper's results with ε = 1e-3, computes `0.5*grad_norm_avg/(grad_avg_norm +
S*epsilon)` with S the number of participating clients and sample-count weights p_i
normalised over them. We implement the code's form (docs/methods.md, "FedEXP's epsilon"):
ε = 1e-3 was chosen together with it, so reproducing the reported behaviour needs
it; it equals the paper's formula with ε_paper = S·ε. ε only matters when the
averaged change is tiny (near a stationary point), where it stops η_g from exploding.

Norms run over the trainable parameters only; buffers (BatchNorm statistics) are
averaged as in FedAvg, never extrapolated (η_g > 1 could make a running variance
negative).

The average of the last two iterates. FedEXP's iterates oscillate, and the paper (and
its code) evaluates x̄_t = (x_t + x_{t−1})/2 while training continues from x_t; the
first aggregated model is evaluated as is. With `average_last_two` (default on, as in
the paper) the fold returns x̄_t (what the engine evaluates, checkpoints and reports) and
keeps x_t in the algorithm's state, and `local_start` gives x_t as every client's
starting point, so clients train from x_t (the round's global model the client hooks
see, a composed method's teacher for one, stays x̄_t). Buffers of x̄_t are those of x_t.
The engine counts the model download at the size of the global state, which is also the
size of x_t. Turn it off (`average_last_two: false`) to evaluate the last iterate itself.

Not implemented (from the authors' code, not the paper's algorithm): their per-round
decay of the client learning rate and of ε (×0.998 and ×0.998²), and gradient
clipping; the engine has no schedules. The latest η_g is kept as `last_server_lr` and
logged as `method_server_lr` (`round_metrics`); it does not affect training and is not
checkpointed.
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


class _ExtrapolationFold(Fold):
    """What FedExP's server step needs, one client at a time, with Δ_i = y_i − x and p_i = n_i / Σ n_j:

    the FedAvg average (buffers keep it), m = Σ p_i Δ_i (float, the step's direction), Σ p_i‖Δ_i‖²
    and ‖Σ p_i Δ_i‖² (in float64, as the authors' code), then
    η_g = max(1, ½·Σ p_i‖Δ_i‖² / (‖Σ p_i Δ_i‖² + S·ε)) for S clients; `step(fold, average, updates)`
    makes the new global state.
    """

    def __init__(self, start: RoundStart, x: StateDict,
                 step: Callable[[_ExtrapolationFold, StateDict, list[ClientUpdate]], StateDict]) -> None:
        super().__init__(start)
        self.x, self.step = x, step  # x: where the clients started
        self.spread = 0
        self.mean = {key: torch.zeros_like(x[key]) for key in start.parameters}
        self.mean64: dict[str, Any] = {key: 0 for key in self.mean}  # summed like Python's sum(): from 0

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)
        p = update.num_samples / self.total
        delta = {key: client_update(update.state, self.x, key) for key in self.mean}
        self.spread += p * sum(float(t.double().square().sum()) for t in delta.values())
        for key, d in delta.items():
            self.mean[key].add_(d, alpha=p)
            self.mean64[key] = self.mean64[key] + p * d.double()

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.step(self, super().finish(updates), updates)

    def step_size(self, clients: int, epsilon: float) -> float:
        mean_sq = 0.0
        for key in self.mean:
            mean_sq += float(self.mean64[key].square().sum())
        denominator = mean_sq + clients * epsilon
        if denominator == 0.0:  # ε = 0 and every client returned the global model: plain FedAvg step
            return 1.0
        return max(1.0, 0.5 * self.spread / denominator)


class FedExp(FederatedAlgorithm):
    name = "fedexp"
    # ε = 1e-3: the authors' value for CIFAR-10/100 and CINIC-10 (docs/methods.md, "FedEXP's epsilon").
    hyperparameters = {"epsilon": Hyperparameter(1e-3, minimum=0), "average_last_two": Hyperparameter(True)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.hp["epsilon"] >= 0:
            raise ValueError(f"{self.name}: epsilon must be >= 0, got {self.hp['epsilon']}")
        self._iterate: StateDict | None = None  # x_t when the engine holds x̄_t; None before round 1
        self.last_server_lr: float | None = None

    @property
    def _averaging(self) -> bool:
        return bool(self.hp["average_last_two"])

    def local_start(self, global_state: StateDict) -> StateDict:
        """x_t, not the evaluated x̄_t."""
        return self._iterate if self._averaging and self._iterate is not None else global_state

    def begin_aggregate(self, start: RoundStart) -> Fold:
        previous = self._iterate if self._averaging else None
        return _ExtrapolationFold(start, self.local_start(start.global_state),
                                  lambda fold, average, updates: self._server_step(fold, average, previous, updates))

    def _server_step(self, fold: _ExtrapolationFold, out: StateDict, previous: StateDict | None,
                     updates: list[ClientUpdate]) -> StateDict:
        eta = fold.step_size(len(updates), self.hp["epsilon"])
        self.last_server_lr = eta
        for key, mean in fold.mean.items():
            out[key] = fold.x[key] + eta * mean
        if not self._averaging:
            return out
        self._iterate = out
        if previous is None:  # first aggregation: nothing to average with (as the authors' code)
            return out
        averaged = dict(out)
        for key in fold.mean:
            averaged[key] = (out[key] + previous[key]) / 2
        return averaged

    # ------------------------------------------------------------- persistent state
    def state_dict(self) -> dict[str, Any]:
        return {"iterate": dict(self._iterate)} if self._iterate is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"iterate"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        iterate = state.get("iterate")
        self._iterate = dict(iterate) if iterate is not None else None

    def round_metrics(self) -> dict[str, float]:
        return {} if self.last_server_lr is None else {"server_lr": float(self.last_server_lr)}
