"""A suite's table: accuracy and traffic are means over the seeds that finished."""

from __future__ import annotations

import pandas as pd

from fedskew.report.tables import statistics_over_seeds, wide_table


def _run(seed: int, status: str, acc: float | None, mb: float) -> dict:
    return {"dataset": "mnist", "partition": "dir0.5", "method": "feded", "seed": seed, "status": status,
            "final_acc": acc, "final_balanced_acc": acc, "best_acc": acc,
            "total_bytes_up": mb * 1e6, "total_bytes_down": mb * 1e6}


def test_a_diverged_seed_counts_apart_in_accuracy_and_in_traffic() -> None:
    runs = pd.DataFrame([_run(0, "finished", 0.9, 400.0), _run(1, "finished", 0.8, 400.0),
                         _run(2, "diverged", None, 64.0)])   # it stopped in round 8 of 50
    summary = statistics_over_seeds(runs)
    assert summary.loc[0, "seeds"] == 2 and summary.loc[0, "diverged"] == 1
    assert abs(summary.loc[0, "final_acc_mean"] - 0.85) < 1e-12
    assert wide_table(summary, traffic=True).loc["feded", "mnist / dir0.5"] == "400.00 / 400.00"
    assert wide_table(summary).loc["feded", "mnist / dir0.5"] == "85.00 ± 7.07 (n=2; 1 diverged)"


def test_a_setting_whose_seeds_all_diverged_has_no_traffic_either() -> None:
    summary = statistics_over_seeds(pd.DataFrame([_run(s, "diverged", None, 50.0 + s) for s in range(3)]))
    assert wide_table(summary, traffic=True).loc["feded", "mnist / dir0.5"] == "n/a"
    assert wide_table(summary).loc["feded", "mnist / dir0.5"] == "diverged (3/3 seeds)"
