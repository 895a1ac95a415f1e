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

from fedskew.fl.base import AverageFold, ClientContext, ClientUpdate, FederatedAlgorithm, RoundAggregate, StateDict


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
        return RoundAggregate.run(self.begin_aggregate(global_state, [u.num_samples for u in updates]), updates)

    def begin_aggregate(self, global_state: StateDict, num_samples: list[int]) -> RoundAggregate:
        # Buffers (and anything else not trained) as in FedAvg; parameters replaced in _server_step.
        return _DynFold(self, global_state, num_samples)

    def _server_step(self, global_state: StateDict, out: StateDict, mean: StateDict, drift: StateDict) -> StateDict:
        alpha, m = self.hp["alpha"], self.num_clients
        for name in self._names:
            h = self._h.get(name)
            if h is None:
                h = torch.zeros_like(global_state[name])
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


class _DynFold(RoundAggregate):
    """The participants' plain mean and their summed drift Σ_i (θ_i − θ) per parameter, one client
    at a time (buffers take FedAvg's average); FedDyn's server step then updates h."""

    def __init__(self, method: FedDyn, global_state: StateDict, num_samples: list[int]) -> None:
        self.method, self.global_state = method, global_state
        self.average = AverageFold(num_samples)
        self.k = len(num_samples)
        self.mean: StateDict | None = None  # the parameter names are known once a client has trained
        self.drift: StateDict = {}

    def fold(self, update: ClientUpdate) -> None:
        self.average.fold(update)
        if self.mean is None:
            self.mean = {name: torch.zeros_like(self.global_state[name]) for name in self.method._names}
            self.drift = {name: torch.zeros_like(self.global_state[name]) for name in self.method._names}
        for name in self.mean:
            self.mean[name].add_(update.state[name], alpha=1.0 / self.k)
            self.drift[name].add_(update.state[name] - self.global_state[name])

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        return self.method._server_step(self.global_state, self.average.finish(updates), self.mean, self.drift)
