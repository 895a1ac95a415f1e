"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct client drift (option II).

Each local step uses the corrected gradient g + c − c_i (server control variate c,
client control variate c_i), added in `after_backward` before the optimiser step.
After K local steps with learning rate η the client sets (option II)

    c_i⁺ = c_i − c + (x − y)/(K·η)

keeps it, and uploads Δc_i = c_i⁺ − c_i with its model (counted as communication);
the server sends c with the model. Server step with N = all clients (not only the
round's):

    x ← Σ_i p_i y_i   (sample-weighted, global learning rate 1, as FedAvg here)
    c ← c + Σ_{i in round} Δc_i / N

All control variates start at zero (NIID-Bench's code starts them at random values, a defect of
that code, not a reading of the paper: docs/methods.md, "SCAFFOLD's starting control variates").
c and every client's c_i (stored only for clients that trained once,
absent = zero) are in `state_dict`, so a resumed run continues bit-identically.

Where each piece lives: the client's x, c_i and c − c_i for its local steps are its scratch
(`begin_local`); its new c_i is computed at the end of its local training (`end_local`),
kept in the per-client store and Δc_i uploaded. The server step streams (`begin_aggregate`):
each participant's model and Δc_i are folded into two running sums (the weighted average,
and c + Σ Δc_i / N) as soon as it has trained, and the engine then drops them, so a round
holds one model and one Δc_i at a time besides the sums, however many clients take part.
The per-client c_i are the method's state and stay.

Choices and deviations:
- Only trainable parameters have control variates; buffers (BatchNorm statistics) are
  averaged as in FedAvg. A parameter without a gradient in a step gets no correction
  in that step (as FedProx here).
- Momentum. Option II is written for plain SGD, where x − y = η·Σ_k (corrected
  gradient_k) and (x − y)/(K·η) is their mean. The engine's SGD may use heavy-ball
  momentum ρ (the corrected gradient goes through the momentum buffer like any
  gradient); then x − y = η·Σ_k w_k·(corrected gradient_k) with Σ_k w_k =
  a(K, ρ) = (K − ρ(1 − ρ^K)/(1 − ρ))/(1 − ρ) (FedNova's normaliser,
  fedskew.fl.server_math.normalizing_factor), so we divide by
  η·a(K, ρ) instead of K·η. For ρ = 0 this is exactly the paper's K·η; for ρ > 0 the
  literal K·η overestimates c_i by up to 1/(1 − ρ) (10× at ρ = 0.9), and on digits
  with ρ = 0.9 that feedback made training diverge. Weight decay is treated as part
  of the gradient. (NIID-Bench instead subtracts η(c − c_i) after each optimiser step,
  outside momentum; for plain SGD all these forms agree.)
- No global learning rate η_g: the model update is the sample-weighted average, i.e.
  η_g = 1 (as NIID-Bench and the FedExP authors' SCAFFOLD baseline use); the paper's
  uniform mean over the sampled clients is replaced by the sample-weighted one every
  method here uses (identical for equal client sizes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedskew.fl.base import ClientContext, ClientUpdate, FederatedAlgorithm, Fold, Panel, RoundStart, StateDict
from fedskew.fl.server_math import normalizing_factor


class Scaffold(FederatedAlgorithm):
    name = "scaffold"
    panel = Panel.DRIFT
    sgd_only = "corrects each step by control variates scaled by SGD's step count and learning rate"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._c: StateDict = {}                        # server control variate c
        self._client_c: dict[int, StateDict] = {}      # c_i, only for clients that trained once
        # Tensors are replaced, never updated in place, so a returned state_dict stays a snapshot.

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
        return {name: p for name, p in model.named_parameters() if p.requires_grad}

    def _ensure_c(self, model: nn.Module) -> None:
        params = self._trainable(model)
        if not self._c:
            self._c = {name: torch.zeros_like(p, memory_format=torch.contiguous_format).detach()
                       for name, p in params.items()}
        elif set(self._c) != set(params):
            raise ValueError(f"{self.name}: control variates cover {sorted(self._c)}, "
                             f"the model's trainable parameters are {sorted(params)}")
        if params:
            # adapt_model runs before the engine moves the model to its device: follow it (once).
            device = next(iter(params.values())).device
            if next(iter(self._c.values())).device != device:
                self._c = {name: c.to(device) for name, c in self._c.items()}
                self._client_c = {cid: {name: t.to(device) for name, t in ci.items()}
                                  for cid, ci in self._client_c.items()}

    def client_control(self, client_id: int) -> StateDict:
        """c_i of a client (zeros if it never trained)."""
        stored = self._client_c.get(client_id)
        return stored if stored is not None else {name: torch.zeros_like(c) for name, c in self._c.items()}

    # ----------------------------------------------------------------- the model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        model = super().adapt_model(model)
        self._ensure_c(model)  # so the very first download already carries c (zeros)
        return model

    # ----------------------------------------------------------------- client side
    def download_payload(self, client: ClientContext) -> dict[str, Any]:
        return {**super().download_payload(client), "c": self._c}

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        self._ensure_c(model)
        params = self._trainable(model)
        ci = self.client_control(client.client_id)
        client.scratch["scaffold_x"] = {name: global_state[name] for name in params}  # the round's global model
        client.scratch["scaffold_ci"] = ci
        client.scratch["scaffold_correction"] = {name: self._c[name] - ci[name] for name in params}

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        super().after_backward(model, client)
        correction = client.scratch["scaffold_correction"]
        with torch.no_grad():
            for name, param in self._trainable(model).items():
                if param.grad is not None:
                    param.grad.add_(correction[name])  # g + c − c_i

    def end_local(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        """c_i⁺ kept in the store; Δc_i = c_i⁺ − c_i uploaded."""
        payload = super().end_local(model, client, num_steps)
        params = self._trainable(model)
        x, ci = client.scratch["scaffold_x"], client.scratch["scaffold_ci"]
        if num_steps > 0:
            # K·η, generalised to momentum ρ as η·a(K, ρ) (FedNova's a_i; = K for ρ = 0): the
            # total weight the optimiser gave the K corrected gradients. See the module docstring.
            scale = 1.0 / (normalizing_factor(num_steps, self.settings.momentum) * self.settings.lr)
            with torch.no_grad():
                new_ci = {name: ci[name] - self._c[name] + (x[name] - p.detach()) * scale
                          for name, p in params.items()}
        else:  # no step taken: nothing learned about the client's gradient
            new_ci = dict(ci)
        self._client_c[client.client_id] = new_ci
        payload["delta_c"] = {name: new_ci[name] - ci[name] for name in params}
        return payload

    # ----------------------------------------------------------------- server side
    def begin_aggregate(self, start: RoundStart) -> Fold:
        return _ControlFold(self, start)

    # ------------------------------------------------------------- persistent state
    def state_dict(self) -> dict[str, Any]:
        return {"c": dict(self._c), "client_c": {cid: dict(ci) for cid, ci in self._client_c.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = set(state) - {"c", "client_c"}
        if unknown:
            raise ValueError(f"{self.name}: unexpected checkpoint state {sorted(unknown)}")
        self._c = dict(state.get("c", {}))
        self._client_c = {int(cid): dict(ci) for cid, ci in state.get("client_c", {}).items()}


class _ControlFold(Fold):
    """FedAvg's weighted average of the models and c ← c + Σ_i Δc_i / N, one client at a time."""

    def __init__(self, method: Scaffold, start: RoundStart) -> None:
        super().__init__(start)
        self.method = method
        self.step = 1.0 / float(method.num_clients)  # N = all clients, not the round's
        self.c: StateDict | None = None

    def fold(self, update: ClientUpdate) -> None:
        super().fold(update)
        if self.c is None:
            # A copy: the round's later clients still train with the old c. Taken at the first
            # fold, when begin_local has moved c to the model's device.
            self.c = {name: c.clone() for name, c in self.method._c.items()}
        delta = update.payload["delta_c"]
        for name, acc in self.c.items():
            acc.add_(delta[name], alpha=self.step)

    def finish(self, updates: list[ClientUpdate]) -> StateDict:
        if self.c is not None:
            self.method._c = self.c  # replaced, not updated in place (a returned state_dict stays a snapshot)
        return super().finish(updates)
