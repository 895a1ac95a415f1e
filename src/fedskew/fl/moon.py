"""MOON (Li, He & Song, CVPR 2021): model-contrastive learning between local, global and previous models.

Local training under label skew drifts the representation away from the global one.
MOON pulls the local representation z of each sample towards the global model's z_g
and pushes it from the client's previous local model's z_prev:

    L = CE(head(z), y) + μ·ℓ_con,
    ℓ_con = −log( e^{cos(z, z_g)/T} / (e^{cos(z, z_g)/T} + e^{cos(z, z_prev)/T}) )

(mean over the batch). T = 0.5 as in the paper and code. μ = 5, the paper's tuned value
for CIFAR-10 (it reports μ = 1 for CIFAR-100 and Tiny-ImageNet; the code's argparse
default is 1): most datasets of this benchmark have 10 classes; define a named method
with `mu: 1` for CIFAR-100.

Architecture (`adapt_model`): as MOON's ModelFedCon, a projection head is inserted
between the body and the classifier, body → Linear(d, d) → ReLU → Linear(d, proj_dim)
→ head, proj_dim = 256 (the code's `out_dim`). The projection stages are appended to
`model.body`, so `features` (= model.body(x)) is the projection output that both the
contrastive loss and the classifier consume, and the projection is aggregated like
every other parameter. The head is replaced by Linear(proj_dim, C).

State: the global model is ONE frozen module re-loaded per client; the previous local
model is ONE frozen module loaded per client from a store of state dicts, one per
client that has trained (kept on the CPU, saved in `state_dict()` for resume): each client
puts its trained model there at the end of its local training (`end_local`; it is not
uploaded). Memory cost: one full model state per client that has trained, plus the
initial model (below): for m clients and P parameters about (m + 1)·4P bytes of host
memory, and in every checkpoint.

Previous model of a client that has not trained yet: the initial model (the global
model of round 1). In round 1 that is the global model itself, so cos(z, z_prev) =
cos(z, z_g) and ∂ℓ_con/∂z = 0 (ℓ_con = log 2, a constant): the round-1 update is CE
alone, as in both references. (QinbinLi/MOON's pool of previous models is empty in
round 1, leaving only the positive logit, so ℓ_con ≡ 0; the FedDecorr authors' port
starts every client's previous model as a copy of the initial model, as we do.) A
client first sampled later under partial participation is pushed away from the
initial model, like in the FedDecorr port (QinbinLi/MOON uses that client's own,
separately initialised network there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, Panel, StateDict, Switch


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """MOON's ℓ_con: cross entropy of [cos(z, z_g), cos(z, z_prev)] / T with target 0, mean over rows."""
    z, z_global, z_previous = z.flatten(1), z_global.flatten(1), z_previous.flatten(1)
    similarities = torch.stack([F.cosine_similarity(z, z_global, dim=1),
                                F.cosine_similarity(z, z_previous, dim=1)], dim=1) / temperature
    target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(similarities, target)


def _cpu_copy(state: StateDict) -> StateDict:
    return {key: value.detach().to("cpu", copy=True) for key, value in state.items()}


class MOON(FederatedAlgorithm):
    name = "moon"
    # Paper: T = 0.5; μ = 5 for CIFAR-10 (1 for CIFAR-100/Tiny-ImageNet); projection output 256.
    panel = Panel.DRIFT
    hyperparameters = {"mu": Hyperparameter(5.0, minimum=0), "temperature": Hyperparameter(0.5, exclusive_minimum=0),
                       # a features × proj_dim projection
                       "proj_dim": Hyperparameter(256, minimum=1, maximum=65536)}
    switches = (Switch("mu", "no contrastive term", ("temperature",)),)  # proj_dim still shapes the model

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        proj_dim = self.hp["proj_dim"]
        if proj_dim != int(proj_dim) or proj_dim < 1:
            raise ValueError(f"moon: proj_dim must be a positive integer, got {proj_dim!r}")
        if self.hp["temperature"] <= 0:
            raise ValueError(f"moon: temperature must be > 0, got {self.hp['temperature']!r}")
        # client id -> its last local model (CPU); the initial model stands in before a client trains
        self._previous_states: dict[int, StateDict] = {}
        self._initial_state: StateDict | None = None

    # ------------------------------------------------------------------- the model
    def adapt_model(self, model: nn.Module) -> nn.Module:
        """body → Linear(d, d) → ReLU → Linear(d, proj_dim) → head(proj_dim → C), as MOON's ModelFedCon."""
        d, num_classes, proj_dim = model.head.in_features, model.head.out_features, int(self.hp["proj_dim"])
        model.body.add_module("proj1", nn.Linear(d, d))
        model.body.add_module("proj_relu", nn.ReLU())
        model.body.add_module("proj2", nn.Linear(d, proj_dim))
        model.head = nn.Linear(proj_dim, num_classes)
        return model

    # ----------------------------------------------------------------- client side
    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        if self._initial_state is None:
            # The first local phase of a run is in round 1, whose global model is the initial
            # model; a resumed run gets it back from the checkpoint instead.
            self._initial_state = _cpu_copy(global_state)
        previous = self._previous_states.get(client.client_id, self._initial_state)
        client.scratch["moon_global"] = self.inference_model("global", model, global_state)
        client.scratch["moon_previous"] = self.inference_model("previous", model, previous)

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        if x is None or "moon_global" not in client.scratch:
            raise RuntimeError("moon: local_loss needs the batch input x and begin_local before it "
                               "(the global and previous models run on x)")
        with torch.no_grad():
            z_global = client.scratch["moon_global"].body(x)
            z_previous = client.scratch["moon_previous"].body(x)
        contrastive = model_contrastive_loss(features, z_global, z_previous, self.hp["temperature"])
        return F.cross_entropy(logits, y) + self.hp["mu"] * contrastive

    def end_local(self, model: nn.Module, client: ClientContext, num_steps: int) -> dict[str, Any]:
        """The client keeps its trained model as its next "previous" model (not uploaded)."""
        self._previous_states[client.client_id] = _cpu_copy(model.state_dict())
        return super().end_local(model, client, num_steps)

    # ------------------------------------------------------------- persistent state
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "initial_state": self._initial_state,
                "previous_states": dict(self._previous_states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        initial = state.pop("initial_state", None)
        previous = state.pop("previous_states", {})
        super().load_state_dict(state)
        self._initial_state = None if initial is None else _cpu_copy(initial)
        self._previous_states = {int(cid): _cpu_copy(s) for cid, s in previous.items()}
