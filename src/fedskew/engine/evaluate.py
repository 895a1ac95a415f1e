"""Evaluation of a model on a whole tensor set, in large batches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
             batch_size: int = 2048) -> dict:
    """Accuracy, balanced accuracy (mean recall over classes present in y), per-class accuracy, loss."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64)
    predictions = []
    for start in range(0, len(x), batch_size):
        logits = model(x[start:start + batch_size])
        loss_sum += F.cross_entropy(logits, y[start:start + batch_size], reduction="sum").double().cpu()
        predictions.append(logits.argmax(dim=1).cpu())
    model.train(was_training)
    pred = torch.cat(predictions)
    y = y.cpu()
    correct = (pred == y)
    support = torch.bincount(y, minlength=num_classes)
    hits = torch.bincount(y[correct], minlength=num_classes)
    per_class = [float(h) / float(s) if s > 0 else float("nan") for h, s in zip(hits, support)]
    present = [acc for acc, s in zip(per_class, support) if s > 0]
    return {
        "loss": float(loss_sum) / len(y),
        "acc": float(correct.double().mean()),
        "balanced_acc": sum(present) / len(present),
        "per_class_acc": per_class,
    }
