"""What a run reports: the evaluation's entries of a history row, and the final figures of a finished or a
diverged run (what config tables and MLflow read)."""

from __future__ import annotations

from typing import Any

from fedskew.engine.rounds import NonFiniteError


def evaluation_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """The history row's entries of one evaluation (fedskew.engine.evaluate): `test_<metric>`, and the accuracy of
    each class as `test_acc_class<c>`."""
    row = {f"test_{k}": v for k, v in metrics.items() if k != "per_class_acc"}
    row.update({f"test_acc_class{c}": v for c, v in enumerate(metrics["per_class_acc"])})
    return row


def summarise(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Final-round figures (what tables report) and the best round (labelled as such)."""
    evaluated = [row for row in history if "test_acc" in row]
    final = evaluated[-1]
    best = max(evaluated, key=lambda row: row["test_acc"])
    return {
        "status": "finished",
        "final_round": final["round"],
        "final_acc": final["test_acc"],
        "final_balanced_acc": final["test_balanced_acc"],
        "final_loss": final["test_loss"],
        "best_round": best["round"],
        "best_acc": best["test_acc"],
        "total_bytes_up": sum(row["bytes_up"] for row in history),
        "total_bytes_down": sum(row["bytes_down"] for row in history),
    }


def summarise_divergence(error: NonFiniteError) -> dict[str, Any]:
    """What a diverged run reports: no accuracy, the round it failed in, and why."""
    history = error.history or []
    return {
        "status": "diverged",
        "diverged_round": error.round,
        "error": str(error),
        "final_acc": None,
        "final_balanced_acc": None,
        "final_loss": None,
        "best_round": None,
        "best_acc": None,
        "total_bytes_up": sum(row["bytes_up"] for row in history),
        "total_bytes_down": sum(row["bytes_down"] for row in history),
    }
