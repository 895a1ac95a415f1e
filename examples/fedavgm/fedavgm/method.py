"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification", arXiv:1909.06335, 2019).

Each round the server averages the clients' updates, Δ = Σ_i p_i Δ_i with Δ_i = y_i − x (the client's trained
state minus the global one, the sign of every fold: fedskew.fl.base.client_update) and p_i = n_i / Σ_j n_j over
the round's clients, and steps along its velocity v, which it keeps across rounds:

    v ← β·v + Δ        (v = Δ in the first round)
    x ← x + η·v

Hsu et al. write it with the pseudo-gradient Δw = −Δ: v ← βv + Δw, w ← w − v, so η = 1 there. With β = 0 and
η = 1 a round is FedAvg's average up to rounding (x + Σ_i p_i (y_i − x) is not computed as Σ_i p_i y_i). Only
the trainable parameters take the step; buffers (BatchNorm statistics) keep FedAvg's average, as in fedskew's
FedOpt.

v is the method's state across rounds: `state_dict` returns it, the engine saves it in every checkpoint (the
payload's `algorithm_state`) and gives it back to `load_state_dict` when a run resumes, so that the resumed run
continues bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from fedskew.fl.base import ClientUpdate, Fold, Hyperparameter, RoundStart, StateDict, client_update
from fedskew.fl.fedavg import FedAvg


class FedAvgM(FedAvg):
    # No docstring of its own: `python -m fedskew methods` prints the module's first paragraph, the citation.
    name = "fedavgm"  # the entry point's name in pyproject.toml: what params.yaml and experiments call it
    hyperparameters = {
        "server_lr": Hyperparameter(1.0, exclusive_minimum=0, status="the paper's w ← w − v is η = 1"),
        "server_momentum": Hyperparameter(0.9, minimum=0, exclusive_maximum=1,
                                          status="paper silent: Hsu et al. sweep β with the clients' learning "
                                                 "rate; 0.9 is the usual heavy-ball value"),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.velocity: StateDict = {}  # v by parameter name; empty until the first round's aggregation

    # Only the server differs from FedAvg: the clients train as FedAvg's, so the vectorised path trains them at once.
    def begin_aggregate(self, start: RoundStart) -> Fold:
        return MomentumFold(self, start)

    # ------------------------------------------------------------- what lasts across rounds
    def state_dict(self) -> dict[str, Any]:
        # Tensors in plain dicts: a checkpoint is read back with torch's weights-only loader.
        return {"velocity": dict(self.velocity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"velocity"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        velocity = state.get("velocity", {})
        if not isinstance(velocity, dict) or not all(isinstance(v, torch.Tensor) for v in velocity.values()):
            raise ValueError(f"{self.name}: the checkpoint's velocity is not a mapping of parameter names to tensors")
        self.velocity = dict(velocity)


class MomentumFold(Fold):
    """FedAvg's average (the buffers keep it) and the mean update Δ = Σ_i p_i Δ_i over the parameters, summed one
    client at a time; `finish` takes the server's momentum step and keeps the new velocity."""

    def __init__(self, method: FedAvgM, start: RoundStart) -> None:
        super().__init__(start)
        self.method = method
        self.mean_update = {key: torch.zeros_like(start.global_state[key]) for key in start.parameters}

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)                    # buffers keep FedAvg's average
        p = update.num_samples / self.total     # p_i = n_i / Σ_j n_j over the round's clients
        for key, mean in self.mean_update.items():
            mean.add_(client_update(update.state, self.start.global_state, key), alpha=p)  # Σ_i p_i Δ_i

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        out = super().finish(updates)           # FedAvg's average: the parameters are replaced below
        beta, lr = self.method.hp["server_momentum"], self.method.hp["server_lr"]
        velocity = {}
        for key, delta in self.mean_update.items():
            previous = self.method.velocity.get(key)
            # A checkpoint is read onto the CPU; `.to` brings its velocity to the model's device (a no-op there).
            velocity[key] = delta if previous is None else beta * previous.to(delta.device) + delta
            out[key] = self.start.global_state[key] + lr * velocity[key]
        self.method.velocity = velocity         # replaced, never changed in place: a state_dict stays a snapshot
        return out
