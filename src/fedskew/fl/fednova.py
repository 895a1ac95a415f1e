"""FedNova (Wang et al., NeurIPS 2020): normalised averaging, x ← x − (Σ p_i a_i)·Σ p_i (x − y_i)/a_i.

Clients that take more local steps move further; FedAvg's plain average then weights
their objectives more ("objective inconsistency"). FedNova divides each client's
change by a_i = ‖a_i‖₁ of its local aggregation vector, then rescales the averaged
normalised change by the effective number of steps τ_eff = Σ p_i a_i:

    plain SGD:       a_i = τ_i
    SGD, momentum ρ: a_i = (τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)) / (1 − ρ)
    d_i = (x − y_i)/a_i,   x ← x − τ_eff·Σ p_i d_i,   p_i = n_i / Σ_j n_j (round's clients)

τ_i is ClientUpdate.num_steps (local epochs × batches: clients of different sizes take
different numbers of steps, which is exactly what FedNova corrects); ρ is the
training momentum. The momentum formula is exact for torch's SGD (v ← ρv + g,
w ← w − ηv, no dampening): step k's gradient is applied with total weight
η·(1 − ρ^(τ−k))/(1 − ρ), and these weights sum to η·a_i.

Not in a_i (deviations, as in common ports): weight decay (treated as part of the
gradient) and the optional proximal term of the paper's FedNova+Prox variant.
Buffers (BatchNorm statistics) are not SGD iterates: they are averaged as in FedAvg.
With equal a_i the update is exactly FedAvg's weighted average. No server momentum
(the official code's `gmf`, default 0) and no state across rounds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedskew.fl.base import AverageFold, ClientUpdate, RoundAggregate, StateDict
from fedskew.fl.fedopt import ParameterAwareAlgorithm


def normalizing_factor(num_steps: int, momentum: float) -> float:
    """a_i = ‖a_i‖₁ for τ = num_steps local SGD steps with heavy-ball momentum ρ."""
    if num_steps < 1:
        raise ValueError(f"fednova: a client took {num_steps} local steps; at least one is needed")
    tau, rho = float(num_steps), float(momentum)
    if rho == 0.0:
        return tau
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


class FedNova(ParameterAwareAlgorithm):
    name = "fednova"
    hyperparameters: dict[str, float] = {}

    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        return RoundAggregate.run(self.begin_aggregate(global_state, [u.num_samples for u in updates]), updates)

    def begin_aggregate(self, global_state: StateDict, num_samples: list[int]) -> RoundAggregate:
        return _NormalizedFold(global_state, num_samples, self.parameter_keys, self.settings.momentum)


class _NormalizedFold(RoundAggregate):
    """x − τ_eff Σ_i p_i d_i with d_i = (x − y_i) / a_i and τ_eff = Σ_i p_i a_i, one client at a time
    (buffers take FedAvg's average)."""

    def __init__(self, global_state: StateDict, num_samples: list[int], keys: Callable[[], tuple[str, ...]],
                 momentum: float) -> None:
        self.global_state, self.keys, self.momentum = global_state, keys, momentum
        self.average = AverageFold(num_samples)
        self.total = float(sum(num_samples))
        self.tau_eff = 0
        self.direction: StateDict | None = None  # the parameter names are known once a client has trained

    def fold(self, update: ClientUpdate) -> None:
        self.average.fold(update)
        if self.direction is None:
            self.direction = {key: torch.zeros_like(self.global_state[key]) for key in self.keys()}
        p = update.num_samples / self.total
        a_i = normalizing_factor(update.num_steps, self.momentum)
        self.tau_eff += p * a_i
        for key, direction in self.direction.items():
            direction.add_(self.global_state[key] - update.state[key], alpha=p / a_i)  # p_i·d_i

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        out = self.average.finish(updates)
        for key, direction in self.direction.items():
            out[key] = self.global_state[key] - self.tau_eff * direction
        return out
