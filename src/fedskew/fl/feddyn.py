"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation, L_i(θ) − ⟨g_i, θ⟩ + (α/2)‖θ − θ_s‖², server state h.

Client i, starting from the server model θ_s, minimises
    L_i(θ) − ⟨g_i, θ⟩ + (α/2)‖θ − θ_s‖²
implemented as gradient terms added in `after_backward`: ∇ = ∇L_i − g_i + α(θ − θ_s)
(θ_s and g_i are the client's scratch for its local steps).
After local training (θ_i, `end_local`): g_i ← g_i − α(θ_i − θ_s)   (the paper's ∇L_i(θ_i^t)
state, kept in the per-client store; nothing extra is uploaded).
Server, with m = all clients (not only the sampled ones):
    h   ← h − (α/m)·Σ_{i sampled}(θ_i − θ_s)
    θ_s ← (1/|P|)·Σ_{i sampled} θ_i − h/α
The mean over the sampled clients is unweighted, as in the paper's Algorithm 1 (FedAvg
weights by sample count; FedDyn does not). Buffers (BatchNorm statistics) are not
parameters of the objective: they are averaged by sample count as in FedAvg (integer
buffers take the maximum). g_i starts at zero for every client and h at zero; both are
saved in `state_dict` so a resumed run continues bit-identically.

Parameters that do not require gradients are left out of every term. A trainable
parameter without a data gradient in a step still gets the regulariser's gradient
(the objective depends on it).
"""

from typing import Any

import torch
from torch import nn

from fedskew.fl.base import (
    ClientContext,
    ClientUpdate,
    FederatedAlgorithm,
    Fold,
    Hyperparameter,
    Panel,
    RoundStart,
    StateDict,
    client_update,
)


class FedDyn(FederatedAlgorithm):
    name = "feddyn"
    # The paper searches α ∈ {0.1, 0.01, 0.001}; 0.01 is its usual choice; public code uses 0.01–0.1
    # (docs/methods.md, "FedDyn's alpha").
    panel = Panel.DRIFT
    hyperparameters = {"alpha": Hyperparameter(0.01, exclusive_minimum=0)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.hp["alpha"] > 0:
            raise ValueError(f"{self.name}: alpha must be > 0 (θ_s uses h/α), got {self.hp['alpha']}")
        self._client_grads: dict[int, StateDict] = {}  # g_i, only for clients that trained once
        self._h: StateDict = {}                        # empty until the first aggregation

    # ----------------------------------------------------------------- client side
    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        anchor = {name: p.detach().clone() for name, p in params.items()}  # θ_s
        stored = self._client_grads.get(client.client_id)
        client.scratch["feddyn_anchor"] = anchor
        client.scratch["feddyn_linear"] = (stored if stored is not None
                                           else {name: torch.zeros_like(t) for name, t in anchor.items()})  # g_i

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        super().after_backward(model, client)
        alpha, params = self.hp["alpha"], dict(model.named_parameters())
        anchor, linear = client.scratch["feddyn_anchor"], client.scratch["feddyn_linear"]
        with torch.no_grad():
            for name, theta_s in anchor.items():
                param = params[name]
                extra = (param - theta_s).mul_(alpha).sub_(linear[name])
                if param.grad is None:
                    param.grad = extra
                else:
                    param.grad.add_(extra)

    def end_local(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        payload = super().end_local(model, client, num_steps)
        alpha, params = self.hp["alpha"], dict(model.named_parameters())
        anchor, linear = client.scratch["feddyn_anchor"], client.scratch["feddyn_linear"]
        with torch.no_grad():
            self._client_grads[client.client_id] = {
                name: linear[name] - alpha * (params[name].detach() - theta_s) for name, theta_s in anchor.items()}
        return payload

    # ----------------------------------------------------------------- server side
    def begin_aggregate(self, start: RoundStart) -> Fold:
        # Buffers (and anything else not trained) as in FedAvg; parameters replaced in _server_step.
        return _DynFold(self, start)

    def _server_step(self, start: RoundStart, out: StateDict, mean: StateDict, drift: StateDict) -> StateDict:
        alpha, m = self.hp["alpha"], self.num_clients
        for name in start.parameters:
            h = self._h.get(name)
            if h is None:
                h = torch.zeros_like(start.global_state[name])
            h = h - (alpha / m) * drift[name]
            self._h[name] = h
            out[name] = mean[name] - h / alpha
        return out

    # ------------------------------------------------------------- persistent state
    def state_dict(self) -> dict[str, Any]:
        return {
            "h": {name: t.clone() for name, t in self._h.items()},
            "client_grads": {cid: {name: t.clone() for name, t in grads.items()}
                             for cid, grads in self._client_grads.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"h", "client_grads"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        self._h = {name: t.clone() for name, t in state.get("h", {}).items()}
        self._client_grads = {int(cid): {name: t.clone() for name, t in grads.items()}
                              for cid, grads in state.get("client_grads", {}).items()}


class _DynFold(Fold):
    """The participants' plain mean and their summed drift Σ_i (θ_i − θ) per parameter, one client
    at a time (buffers take FedAvg's average); FedDyn's server step then updates h."""

    def __init__(self, method: FedDyn, start: RoundStart) -> None:
        super().__init__(start)
        self.method = method
        self.k = len(start.num_samples)
        self.mean = {name: torch.zeros_like(start.global_state[name]) for name in start.parameters}
        self.drift = {name: torch.zeros_like(start.global_state[name]) for name in start.parameters}

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)
        for name in self.mean:
            self.mean[name].add_(update.state[name], alpha=1.0 / self.k)
            self.drift[name].add_(client_update(update.state, self.start.global_state, name))

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.method._server_step(self.start, super().finish(updates), self.mean, self.drift)
