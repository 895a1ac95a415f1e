"""Evaluation of a model on a whole tensor set, in large batches: the value of every metric the registry
(fedskew.metrics) says evaluation returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew import metrics


@dataclass
class Predictions:
    """What every metric is computed from: the predicted and the true label of each test sample (on the CPU)
    and the summed cross-entropy loss."""

    predicted: torch.Tensor
    labels: torch.Tensor
    loss_sum: torch.Tensor   # float64, 0-dimensional
    num_classes: int

    @cached_property
    def correct(self) -> torch.Tensor:
        return self.predicted == self.labels

    @cached_property
    def support(self) -> torch.Tensor:
        """The number of samples of each class."""
        return torch.bincount(self.labels, minlength=self.num_classes)

    @cached_property
    def per_class_accuracy(self) -> list[float]:
        """Recall of each class; NaN for a class the labels do not hold."""
        hits = torch.bincount(self.labels[self.correct], minlength=self.num_classes)
        return [float(h) / float(s) if s > 0 else float("nan") for h, s in zip(hits, self.support)]


def _balanced_accuracy(p: Predictions) -> float:
    """Mean recall over the classes present in the labels."""
    present = [acc for acc, s in zip(p.per_class_accuracy, p.support) if s > 0]
    return sum(present) / len(present)


# Each evaluated metric of fedskew.metrics by name: its value from one evaluation's predictions.
COMPUTATIONS: dict[str, Callable[[Predictions], Any]] = {
    "loss": lambda p: float(p.loss_sum) / len(p.labels),
    "acc": lambda p: float(p.correct.double().mean()),
    "balanced_acc": _balanced_accuracy,
    "per_class_acc": lambda p: p.per_class_accuracy,
}


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
            batch_size: int = 2048) -> Predictions:
    """The model's predictions over (x, y), in batches, in eval mode (the model's mode is restored after)."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64)
    predictions = []
    for start in range(0, len(x), batch_size):
        logits = model(x[start:start + batch_size])
        loss_sum += F.cross_entropy(logits, y[start:start + batch_size], reduction="sum").double().cpu()
        predictions.append(logits.argmax(dim=1).cpu())
    model.train(was_training)
    return Predictions(torch.cat(predictions), y.cpu(), loss_sum, num_classes)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
             batch_size: int = 2048) -> dict[str, Any]:
    """Every evaluated metric of fedskew.metrics, by name (accuracy, balanced accuracy, per-class accuracy,
    loss, and any metric registered since)."""
    wanted = metrics.evaluated()
    missing = [m.name for m in wanted if m.name not in COMPUTATIONS]
    if missing:
        raise LookupError(f"fedskew.metrics registers {missing} but fedskew.engine.evaluate.COMPUTATIONS has no "
                          "computation for them: add one there")
    predictions = predict(model, x, y, num_classes, batch_size)
    return {m.name: COMPUTATIONS[m.name](predictions) for m in wanted}
