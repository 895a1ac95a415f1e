"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation, L_i(θ) − ⟨g_i, θ⟩ + (α/2)‖θ − θ_s‖², server state h.

Client i, starting from the server model θ_s, minimises
    L_i(θ) − ⟨g_i, θ⟩ + (α/2)‖θ − θ_s‖²
implemented as gradient terms added in `after_backward`: ∇ = ∇L_i − g_i + α(θ − θ_s).
After local training (θ_i): g_i ← g_i − α(θ_i − θ_s)   (the paper's ∇L_i(θ_i^t) state).
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

from fedskew.fl.base import ClientContext, ClientUpdate, FederatedAlgorithm, StateDict, weighted_average


class FedDyn(FederatedAlgorithm):
    name = "feddyn"
    # The paper searches α ∈ {0.1, 0.01, 0.001}; 0.01 is its usual choice (METHODS.md: 0.01–0.1).
    hyperparameters = {"alpha": 0.01}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.hp["alpha"] > 0:
            raise ValueError(f"{self.name}: alpha must be > 0 (θ_s uses h/α), got {self.hp['alpha']}")
        self._client_grads: dict[int, StateDict] = {}  # g_i, only for clients that trained once
        self._h: StateDict = {}                        # empty until the first aggregation

    # ----------------------------------------------------------------- client side
    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        self._names = [name for name, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self._anchor = {name: params[name].detach().clone() for name in self._names}
        stored = self._client_grads.get(client.client_id)
        self._linear = (stored if stored is not None
                        else {name: torch.zeros_like(self._anchor[name]) for name in self._names})

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        super().after_backward(model, client)
        alpha = self.hp["alpha"]
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name in self._names:
                param = params[name]
                extra = (param - self._anchor[name]).mul_(alpha).sub_(self._linear[name])
                if param.grad is None:
                    param.grad = extra
                else:
                    param.grad.add_(extra)

    def client_payload(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        # The client's own state update at the end of local training (nothing extra is uploaded).
        payload = super().client_payload(model, client, num_steps)
        alpha = self.hp["alpha"]
        params = dict(model.named_parameters())
        with torch.no_grad():
            self._client_grads[client.client_id] = {
                name: self._linear[name] - alpha * (params[name].detach() - self._anchor[name])
                for name in self._names}
        return payload

    # ----------------------------------------------------------------- server side
    def aggregate(self, global_state: StateDict, updates: list[ClientUpdate]) -> StateDict:
        # Buffers (and anything else not trained) as in FedAvg; parameters replaced below.
        out = weighted_average([u.state for u in updates], [u.num_samples for u in updates])
        alpha, m, k = self.hp["alpha"], self.num_clients, len(updates)
        for name in self._names:
            mean = torch.zeros_like(global_state[name])
            for update in updates:
                mean.add_(update.state[name], alpha=1.0 / k)
            h = self._h.get(name)
            if h is None:
                h = torch.zeros_like(global_state[name])
            drift = torch.zeros_like(h)
            for update in updates:
                drift.add_(update.state[name] - global_state[name])
            h = h - (alpha / m) * drift
            self._h[name] = h
            out[name] = mean - h / alpha
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
