"""Per-class accuracy of the local models before and after local training (training.local_diagnostics).

The label-skew papers argue with this measurement (FedLC Fig. 2, FedED Fig. 1 and 4): a
client's model, starting from the global model, gains accuracy on the classes the client
holds many of and loses it on the classes it holds few or none of. At every evaluated
round, for each participant:

* before: the per-class test accuracy of the global model it starts from (the same for
  every client, as FedLC notes);
* after: the per-class test accuracy of its model after local training;

each averaged over the client's majority, minority and missing classes, then over the
participants that have classes of that kind. FedLC splits classes into majority
(n_j >> n_r), minority (n_r > 0) and missing (n_s = 0) without a threshold; fedskew calls a
present class a minority class when the client holds fewer of it than its share under an
even split, n_c < n_k / C (a choice the papers leave open).

History columns: ``local_before_<group>`` and ``local_after_<group>`` for the groups below,
at evaluated rounds.
Federated methods only: split methods have no local model of the whole network.
"""

from __future__ import annotations

import math

import torch

from fedskew.engine.evaluate import evaluate
from fedskew.fl.base import ClientContext

GROUPS = ("majority", "minority", "missing")


def class_groups(label_counts: torch.Tensor) -> dict[str, list[int]]:
    """A client's classes by how many of its samples carry them (see the module docstring)."""
    counts = label_counts.tolist()
    share = sum(counts) / len(counts)
    return {
        "majority": [c for c, n in enumerate(counts) if n >= share and n > 0],
        "minority": [c for c, n in enumerate(counts) if 0 < n < share],
        "missing": [c for c, n in enumerate(counts) if n == 0],
    }


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]  # a class absent from the test set has no accuracy
    return sum(finite) / len(finite) if finite else math.nan


class LocalDiagnostics:
    """Collects one round's before/after per-class accuracies and turns them into history columns."""

    def __init__(self, x_test: torch.Tensor, y_test: torch.Tensor, num_classes: int) -> None:
        self.x_test, self.y_test, self.num_classes = x_test, y_test, num_classes
        self.before: list[float] = []
        self.after: list[tuple[dict[str, list[int]], list[float]]] = []

    def _per_class(self, model: torch.nn.Module) -> list[float]:
        return evaluate(model, self.x_test, self.y_test, self.num_classes)["per_class_acc"]

    def begin_round(self, model: torch.nn.Module, global_state: dict) -> None:
        model.load_state_dict(global_state)
        self.before, self.after = self._per_class(model), []

    def after_local(self, client: ClientContext, model: torch.nn.Module) -> None:
        """Called with the client's model right after its local training."""
        self.after.append((class_groups(client.label_counts), self._per_class(model)))

    def row(self) -> dict[str, float]:
        """The round's columns; a group no participant has (e.g. no missing classes under IID) is left out."""
        out = {}
        for group in GROUPS:
            clients = [(classes[group], after) for classes, after in self.after if classes[group]]
            before = _mean([_mean([self.before[c] for c in classes]) for classes, _ in clients])
            after = _mean([_mean([accuracy[c] for c in classes]) for classes, accuracy in clients])
            if not math.isnan(before):
                out[f"local_before_{group}"], out[f"local_after_{group}"] = before, after
        return out
