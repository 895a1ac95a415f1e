"""What a run reports: the evaluation's entries of a history row, and the summary of a finished or a diverged
run (metrics.json, which the tables and MLflow read). Both follow the metrics registry (fedskew.metrics)."""

from __future__ import annotations

from typing import Any

from fedskew import metrics
from fedskew.engine.rounds import NonFiniteError
from fedskew.metrics import Statistic


def evaluation_row(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The history row's entries of one evaluation (fedskew.engine.evaluate): each evaluated metric's column
    (`test_acc`, ...), a per-class one's column per class (`test_acc_class<c>`), in the registry's order."""
    registered = metrics.evaluated()
    unknown = sorted(set(evaluation) - {m.name for m in registered})
    missing = [m.name for m in registered if m.name not in evaluation]
    if unknown or missing:
        raise KeyError(f"an evaluation must hold every evaluated metric of fedskew.metrics and nothing else: "
                       f"missing {missing}, not registered {unknown}")
    row: dict[str, Any] = {}
    for entry in registered:
        row.update(entry.history_values(evaluation[entry.name]))
    return row


def _summary(history: list[dict[str, Any]], final: dict[str, Any] | None, best: dict[str, Any] | None,
             evaluated: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary values in metrics.json's order: the final-round ones, the best round, the best-round ones,
    the run totals. `final` and `best` are None for a run that diverged (no number but its traffic)."""
    out: dict[str, Any] = {m.key(Statistic.FINAL): None if final is None else final[m.column]
                           for m in metrics.summarised(Statistic.FINAL)}
    out["best_round"] = None if best is None else best["round"]
    for entry in metrics.summarised(Statistic.BEST):
        out[entry.key(Statistic.BEST)] = (None if best is None else
                                          entry.better.best(evaluated, key=lambda row: row[entry.column])[entry.column])
    out.update({m.key(Statistic.TOTAL): sum(row[m.column] for row in history)
                for m in metrics.summarised(Statistic.TOTAL)})
    return out


def summarise_finished_run(history: list[dict[str, Any]]) -> dict[str, Any]:
    """A finished run's summary: the final-round values (what tables report), the best round of the reported
    metric and each metric's best value (labelled as such), and the totals over the run."""
    reported = metrics.reported()
    evaluated = [row for row in history if reported.column in row]
    best = reported.better.best(evaluated, key=lambda row: row[reported.column])
    return {"status": "finished", "final_round": evaluated[-1]["round"],
            **_summary(history, evaluated[-1], best, evaluated)}


def summarise_divergence(error: NonFiniteError) -> dict[str, Any]:
    """What a diverged run reports: no accuracy, the round it failed in, and why."""
    history = error.history or []
    return {"status": "diverged", "diverged_round": error.round, "error": str(error),
            **_summary(history, None, None, [])}
