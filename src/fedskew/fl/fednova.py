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
training momentum. The momentum formula (fedskew.fl.server_math.normalizing_factor, which
SCAFFOLD shares) is exact for torch's SGD (v ← ρv + g, w ← w − ηv, no dampening).

Not in a_i (deviations, as in common ports): weight decay (treated as part of the
gradient) and the optional proximal term of the paper's FedNova+Prox variant.
Buffers (BatchNorm statistics) are not SGD iterates: they are averaged as in FedAvg.
With equal a_i the update is exactly FedAvg's weighted average. No server momentum
(the official code's `gmf`, default 0) and no state across rounds.
"""

from __future__ import annotations

import torch

from fedskew.fl.base import ClientUpdate, FederatedAlgorithm, Fold, RoundStart, StateDict
from fedskew.fl.server_math import normalizing_factor


class FedNova(FederatedAlgorithm):
    name = "fednova"
    sgd_only = "normalises each update by the number of SGD steps (and their momentum)"

    def begin_aggregate(self, start: RoundStart) -> Fold:
        return _NormalizedFold(start, self.settings.momentum)


class _NormalizedFold(Fold):
    """x − τ_eff Σ_i p_i d_i with d_i = (x − y_i) / a_i and τ_eff = Σ_i p_i a_i, one client at a time
    (buffers take FedAvg's average)."""

    def __init__(self, start: RoundStart, momentum: float) -> None:
        super().__init__(start)
        self.momentum = momentum
        self.tau_eff = 0
        self.direction = {key: torch.zeros_like(start.global_state[key]) for key in start.parameters}

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)
        p = update.num_samples / self.total
        a_i = normalizing_factor(update.num_steps, self.momentum)
        self.tau_eff += p * a_i
        for key, direction in self.direction.items():
            direction.add_(self.start.global_state[key] - update.state[key], alpha=p / a_i)  # p_i·d_i

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        out = super().finish(updates)
        for key, direction in self.direction.items():
            out[key] = self.start.global_state[key] - self.tau_eff * direction
        return out
