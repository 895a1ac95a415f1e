"""The server's arithmetic that several methods share: a client's update and its sign, averaging states,
FedNova's normalising factor, FedOpt's adaptive server step.

Written once here so that a method's file holds only what is its own: FedAvg's average is every fold's
(fedskew.fl.base.Fold) and the split methods' (fedskew.sfl), SCAFFOLD divides by FedNova's factor, and the
three FedOpt methods differ only in the second-moment rule they hand `adaptive_server_step`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedskew.numerics import exact_math

StateDict = dict[str, torch.Tensor]


class RunningAverage:
    """Σ_i w_i·state_i over states added one at a time, by key.

    Floating entries (parameters, BatchNorm statistics) are summed with their weights; integer
    entries (BatchNorm's num_batches_tracked) cannot be averaged meaningfully and take the
    maximum. A state's tensors are read once, in `add`, so the caller may drop them right after.
    """

    def __init__(self) -> None:
        self.sum: StateDict = {}

    def add(self, state: StateDict, weight: float) -> None:
        for key, value in state.items():
            if key not in self.sum:
                self.sum[key] = torch.zeros_like(value) if value.is_floating_point() else value.clone()
            if value.is_floating_point():
                self.sum[key].add_(value, alpha=weight)
            else:
                torch.maximum(self.sum[key], value, out=self.sum[key])

    def result(self) -> StateDict:
        return self.sum


def client_update(trained: StateDict, start: StateDict, key: str) -> torch.Tensor:
    """A client's update of one state-dict entry, Δ_i = y_i − x: its trained value minus the value its local
    training started from (the round's global state, or the method's `local_start`).

    The one sign of the folds' sums (fedskew.fl.base.Fold): the mean update Σ_i p_i Δ_i points where the
    clients moved, x + Σ_i p_i Δ_i is FedAvg's average up to rounding, and FedOpt's and FedEXP's server steps
    add a multiple of it. FedNova alone keeps a gradient's sign: its d_i = (x − y_i)/a_i is −Δ_i/a_i, and its
    step x − τ_eff·Σ_i p_i d_i subtracts it.
    """
    return trained[key] - start[key]


def weighted_average(states: list[StateDict], weights: list[float]) -> StateDict:
    """The states averaged by `weights` (normalised to sum 1); integer entries take the maximum."""
    total = float(sum(weights))
    average = RunningAverage()
    for state, weight in zip(states, weights):
        average.add(state, weight / total)
    return average.result()


def normalizing_factor(num_steps: int, momentum: float) -> float:
    """FedNova's a_i = ‖a_i‖₁ for τ = num_steps local SGD steps with heavy-ball momentum ρ.

    Step k's gradient is applied with total weight η·(1 − ρ^(τ−k))/(1 − ρ) (torch's SGD: v ← ρv + g,
    w ← w − ηv, no dampening), and these weights sum to η·a_i: τ for ρ = 0.
    """
    if num_steps < 1:
        raise ValueError(f"fednova: a client took {num_steps} local steps; at least one is needed")
    tau, rho = float(num_steps), float(momentum)
    if rho == 0.0:
        return tau
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


# --- FedOpt's server optimisers (Reddi et al., ICLR 2021, Algorithm 2) -----------------------------------
# The second-moment rules: the one line that tells FedAdam, FedYogi and FedAdagrad apart.

def adam_second_moment(v: torch.Tensor, delta_sq: torch.Tensor, beta2: float) -> torch.Tensor:
    """v ← β2·v + (1 − β2)·Δ²."""
    return beta2 * v + (1 - beta2) * delta_sq


def yogi_second_moment(v: torch.Tensor, delta_sq: torch.Tensor, beta2: float) -> torch.Tensor:
    """v ← v − (1 − β2)·Δ²·sign(v − Δ²): additive, so v cannot blow up like Adam's."""
    return v - (1 - beta2) * delta_sq * torch.sign(v - delta_sq)


def adagrad_second_moment(v: torch.Tensor, delta_sq: torch.Tensor) -> torch.Tensor:
    """v ← v + Δ²."""
    return v + delta_sq


def adaptive_server_step(x: StateDict, delta: StateDict, m: StateDict, v: StateDict, lr: float, beta1: float,
                         tau: float, second_moment: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                         ) -> StateDict:
    """x + η·m / (√v + τ) for each key of the pseudo-gradient `delta`, after m ← β1·m + (1 − β1)·Δ and
    v ← second_moment(v, Δ²); returns the new values by key.

    `m` and `v` are the server optimiser's state, updated here: m starts at 0 and v at τ² (Algorithm 2
    requires v_{-1} ≥ τ², and τ² is the smallest value it allows); no bias correction, as in Algorithm 2.
    Their entries are replaced by new tensors, never changed in place, so a state_dict taken earlier stays
    a snapshot.
    """
    out: StateDict = {}
    for key, d in delta.items():
        m_key = m[key] if key in m else torch.zeros_like(d)
        v_key = v[key] if key in v else torch.full_like(d, tau * tau)
        m[key] = beta1 * m_key + (1 - beta1) * d
        v[key] = second_moment(v_key, d * d)
        out[key] = x[key] + lr * m[key] / (exact_math.sqrt(v[key]) + tau)
    return out
