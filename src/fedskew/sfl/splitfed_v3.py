"""SplitFedV3 (Gawali et al., 2021, as SCALA's Tables 5–6 describe it).

Client parts are *personal*: each client keeps its own and they are never averaged nor
sent; the server keeps one copy of its part per participant during the round (as in
SplitFedV1) and averages the copies (|D_k|-weighted) at the end. A client that has
never taken part still holds the initial client part.

Evaluation (SCALA does not say how; its V3 numbers — 18 % on CIFAR10 with two classes
per client — fit this protocol): every client's personalised model (its own client part
+ the averaged server part) is evaluated on the global test set and the metrics are
averaged over all clients with equal weight (`test_acc` etc.). `method_personal_acc`
adds what a personalised model is for: each client's per-class test accuracy weighted
by its own label distribution, averaged over clients.

The personal parts are this method's state (checkpointed): one client part per
registered client, which is what V3 is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedskew.fl.base import RoundResult, StateDict
from fedskew.metrics import mean_of_evaluations
from fedskew.sfl.base import SplitAlgorithm, SplitRound
from fedskew.sfl.vanilla import train_with_server_copies


class SplitFedV3(SplitAlgorithm):
    name = "splitfed_v3"
    vectorised_clients = True  # the personal client parts may train stacked (training.execution)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._personal: dict[int, StateDict] = {}
        self._label_counts: torch.Tensor | None = None
        self._view = None
        self._metrics: dict[str, float] = {}

    def set_label_counts(self, label_counts: torch.Tensor) -> None:
        self._label_counts = label_counts  # for the personalised accuracy only

    def run_round(self, rnd: SplitRound) -> RoundResult:
        self._view = rnd.view
        initial = rnd.view.client_state(rnd.global_state)
        # Each client trains the part it holds; nothing of the client side crosses the network.
        parts = self.client_parts(rnd, held=[self._personal.get(c.client_id, initial) for c in rnd.clients])
        servers = [self.server_part(rnd) for _ in rnd.clients]
        loss_sums = train_with_server_copies(rnd, parts, servers, self.minibatches(rnd), self.hp["local_iterations"])
        for client, state in zip(rnd.clients, parts.states()):
            self._personal[client.client_id] = state
        # the global client part stays the initial one, which a client that has never trained holds
        return self.result(rnd, initial, rnd.average([s.detached_state() for s in servers]), loss_sums)

    def evaluate_global(self, model: nn.Module, global_state: StateDict,
                        evaluate: Callable[[nn.Module], dict]) -> dict:
        if self._view is None:  # before any round: every client holds the initial model
            return super().evaluate_global(model, global_state, evaluate)
        initial = self._view.client_state(global_state)
        server = self._view.server_state(global_state)
        results = []
        for client_id in range(self.num_clients):
            model.load_state_dict(self._view.full_state(self._personal.get(client_id, initial), server))
            results.append(evaluate(model))
        mean = mean_of_evaluations(results)   # every metric of fedskew.metrics, averaged over the clients
        self._metrics = {"personal_acc": self._personal_accuracy(results)}
        return mean

    def _personal_accuracy(self, results: list[dict]) -> float:
        """Mean over clients of Σ_c p_k(c)·acc_k(c): test accuracy under the client's own label mix."""
        scores = []
        for client_id, result in enumerate(results):
            counts = self._label_counts[client_id].double().cpu()
            accuracy = torch.tensor(result["per_class_acc"], dtype=torch.float64).nan_to_num(0.0)
            scores.append(float((counts / counts.sum()) @ accuracy))
        return sum(scores) / len(scores)

    def round_metrics(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, {}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"personal": {str(k): v for k, v in sorted(self._personal.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._personal = {int(k): v for k, v in state["personal"].items()}
