"""Per-client outcomes (fedskew.client_outcomes): each client's view of the global model, its worst 10 % and
spread, by hand; runs without an evaluation, diverged ones, classes the test set lacks; and the suite tables'
new columns, from hand-made run files over real partitions."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedskew import client_outcomes as co
from fedskew import paths
from fedskew.config import load_params
from fedskew.report.tables import table_values, write_tables
from fedskew.runfiles import write_run_files

# Three classes with test accuracies 0.9, 0.5 and 0.2, four clients.
PER_CLASS = [0.9, 0.5, 0.2]
COUNTS = [[10, 0, 0],   # one class: it sees that class's accuracy, 0.9
          [5, 5, 0],    # (0.9 + 0.5) / 2 = 0.7
          [1, 1, 2],    # (0.9 + 0.5 + 2 · 0.2) / 4 = 0.45
          [0, 0, 7]]    # 0.2


def row(round_: int, per_class: list[float]) -> dict:
    return {"round": round_, "test_acc": 0.5, **{f"test_acc_class{c}": a for c, a in enumerate(per_class)}}


def test_each_client_sees_the_per_class_accuracies_weighed_by_its_label_proportions() -> None:
    assert co.client_accuracies(PER_CLASS, COUNTS) == pytest.approx([0.9, 0.7, 0.45, 0.2], abs=1e-15)
    found = co.row_outcomes(row(7, PER_CLASS), COUNTS)
    assert found.round == 7 and found.clients == 4
    assert found.mean == pytest.approx((0.9 + 0.7 + 0.45 + 0.2) / 4, abs=1e-15)   # 0.5625, each client weighs 1
    assert found.worst10 == pytest.approx(0.2, abs=1e-15)   # ⌈4/10⌉ = 1 client: the worst one
    deviations = [0.3375, 0.1375, -0.1125, -0.3625]
    assert found.spread == pytest.approx(math.sqrt(sum(d * d for d in deviations) / 4), abs=1e-15)   # ddof = 0
    assert found.values() == {"mean_acc": found.mean, "worst10_acc": found.worst10, "spread_acc": found.spread}


def test_a_client_holding_one_class_sees_exactly_that_classs_accuracy() -> None:
    assert co.client_accuracies([0.25, 0.75], [[0, 40]]) == [0.75]
    alone = co.row_outcomes(row(1, [0.25, 0.75]), [[0, 40]])
    assert (alone.mean, alone.worst10, alone.spread, alone.clients) == (0.75, 0.75, 0.0, 1)


@pytest.mark.parametrize(("clients", "worst"), [(1, 1), (9, 1), (10, 1), (11, 2), (20, 2), (21, 3), (30, 3),
                                                (100, 10)])
def test_the_worst_10_percent_is_the_mean_of_the_ceil_k_over_10_lowest(clients: int, worst: int) -> None:
    accuracies = [(k + 1) / 1000 for k in reversed(range(clients))]   # 30: 30 · 0.1 is 3.0000000000000004
    mean, worst10, spread = co.summarise(accuracies)
    assert worst10 == pytest.approx(sum((k + 1) / 1000 for k in range(worst)) / worst, abs=1e-15)
    assert mean == pytest.approx(np.mean(accuracies), abs=1e-15)
    assert spread == pytest.approx(np.std(accuracies, ddof=0), abs=1e-15)


def test_spread_and_worst_10_percent_on_a_hand_example_of_twelve_clients() -> None:
    accuracies = [0.2, 0.4] + [0.6] * 10   # ⌈12/10⌉ = 2 worst: (0.2 + 0.4) / 2
    mean, worst10, spread = co.summarise(accuracies)
    assert mean == pytest.approx(6.6 / 12) and worst10 == pytest.approx(0.3)
    assert spread == pytest.approx(math.sqrt((0.35 ** 2 + 0.15 ** 2 + 10 * 0.05 ** 2) / 12))
    with pytest.raises(ValueError, match="no client"):
        co.summarise([])


def test_a_class_the_test_set_lacks_is_left_out_and_its_only_holders_with_it() -> None:
    per_class = [0.9, math.nan, 0.2]   # no test sample of class 1: evaluate records NaN; (0.9 + 3 · 0.2) / 4
    assert co.client_accuracies(per_class, [[5, 5, 0], [0, 3, 0], [1, 0, 3]]) == pytest.approx([0.9, 0.375])
    assert co.row_outcomes(row(2, per_class), [[0, 3, 0]]) is None   # nobody measured: no outcome
    assert co.row_outcomes(row(2, PER_CLASS), [[0, 0, 0], *COUNTS]).clients == 4   # an empty client is no client


def test_rows_without_an_evaluation_have_no_outcome() -> None:
    history = [{"round": 1, "train_loss": 2.0}, row(2, PER_CLASS), {"round": 3, "train_loss": float("nan")},
               {"round": 4, "test_acc_class0": 0.5}]   # one per-class column, against the partition's three classes
    assert [o.round for o in co.history_outcomes(history[:3], COUNTS)] == [2]
    assert co.history_outcomes([], COUNTS) == []
    assert co.per_class_accuracies({"round": 5, "test_acc_class1": 0.3}) is None   # class 0 missing: no row
    with pytest.raises(ValueError, match="client 0 of the partition has 3 classes, the history 1"):
        co.history_outcomes(history[3:], COUNTS)


def test_names_keys_and_the_partition_summary_path(tmp_path: Path) -> None:
    assert co.summary_keys() == ["final_clients_mean_acc", "final_clients_worst10_acc", "final_clients_spread_acc"]
    assert [co.mlflow_key(n) for n in co.NAMES] == ["clients/mean_acc", "clients/worst10_acc", "clients/spread_acc"]
    assert [co.BETTER[n].value for n in co.NAMES] == ["higher", "higher", "lower"]
    assert co.partition_summary(tmp_path, "digits", "q2", 3) == tmp_path / "data/partitions/digits/q2/seed3.json"
    with pytest.raises(co.MissingPartitionError, match=r"snakemake --cores all .*seed3.json"):
        co.read_label_counts(co.partition_summary(tmp_path, "digits", "q2", 3))


# --- a tiny suite's runs, written by hand over the real partitions of the `project` fixture ---

def per_class_of(cfg, round_: int) -> list[float]:
    """Ten per-class accuracies that differ by class, seed, method and round."""
    shift = 0.02 * cfg.seed + (0.1 if cfg.method == "fedlc" else 0.0) + 0.01 * round_
    return [min(1.0, 0.3 + 0.06 * c + shift) for c in range(10)]


def write_tiny_runs(params, diverged=(), unevaluated=()) -> None:
    for cfg in params.runs(["tiny"]):
        key = (cfg.partition, cfg.method, cfg.seed)
        if key in diverged:
            write_run_files(cfg, [{"round": 1, "train_loss": float("nan")}],
                            {"status": "diverged", "final_acc": None, "final_loss": None})
            continue
        if key in unevaluated:   # a run from before per-class accuracies were recorded
            history = [{"round": r, "test_acc": 0.5, "test_loss": 1.0} for r in (2, 4)]
        else:
            history = [{"round": r, "test_acc": 0.5, "test_loss": 1.0, **row(r, per_class_of(cfg, r))}
                       for r in (2, 4)]
        write_run_files(cfg, history, {"status": "finished", "final_round": 4, "final_acc": 0.5, "final_loss": 1.0})


def expected(cfg, root: Path) -> tuple[float, float, float]:
    """The final round's outcomes computed independently, with numpy, from the partition's summary."""
    counts = np.array(json.loads((root / cfg.path(paths.PARTITION_JSON)).read_text())["label_counts"], float)
    acc = counts @ np.array(per_class_of(cfg, 4)) / counts.sum(axis=1)
    return acc.mean(), np.sort(acc)[: math.ceil(len(acc) / 10)].mean(), acc.std(ddof=0)


def test_the_suite_tables_gain_the_final_rounds_per_client_outcomes(project: Path) -> None:
    params = load_params(project / "params.yaml")
    write_tiny_runs(params, diverged={("q2", "fedlc", 1)})
    written = write_tables(params, "tiny", project)
    rows = list(csv.DictReader(written["csv"].read_text().splitlines()))
    header = written["csv"].read_text().splitlines()[0].split(",")
    new = [f"{key}_{stat}" for key in co.summary_keys() for stat in ("mean", "std")]
    assert header[-6:] == new and header[-8:-6] == ["seeds", "diverged"]   # after every column there was
    assert header[3:5] == [f"{table_values()[0]}_mean", f"{table_values()[0]}_std"]
    flat = json.loads(written["json"].read_text())
    for grid in rows:
        cfgs = [c for c in params.runs(["tiny"]) if (c.partition, c.method) == (grid["partition"], grid["method"])
                and not (c.partition, c.method, c.seed) == ("q2", "fedlc", 1)]
        seeds = np.array([expected(c, project) for c in cfgs])   # seeds x (mean, worst10, spread)
        for i, key in enumerate(co.summary_keys()):
            assert float(grid[f"{key}_mean"]) == pytest.approx(seeds[:, i].mean(), abs=1e-6)
            point = flat[f"digits/{grid['partition']}/{grid['method']}"]
            assert point[f"{key}_mean"] == pytest.approx(seeds[:, i].mean(), abs=1e-6)
            if len(cfgs) == 2:
                assert float(grid[f"{key}_std"]) == pytest.approx(seeds[:, i].std(ddof=1), abs=1e-6)
            else:   # the diverged seed is counted apart: one seed, no std
                assert grid[f"{key}_std"] == "" and point[f"{key}_std"] is None
    md, tex = written["md"].read_text(), written["tex"].read_text()
    mean, worst, spread = expected(params.run("tiny", "digits", "dir0.5", "fedavg", 0), project)
    assert "Per-client test accuracy at the final round (%)" in md
    grid_md = md.split("Per-client test accuracy")[1].split("Protocol:")[0]
    fedavg = next(line for line in grid_md.splitlines() if line.startswith("| fedavg |"))
    assert fedavg.count(" / ") == 4 and fedavg.count(" ± ") == 6   # two settings, three values each
    lone = next(line for line in grid_md.splitlines() if line.startswith("| fedlc |")).split(" | ")[2]
    assert lone.count("± n/a") == 3   # q2/fedlc: one seed left
    assert tex.count(r"\begin{tabular}") == 2 and "per-client test accuracy at the final round" in tex
    assert mean >= worst and spread >= 0


def test_a_seed_without_per_class_accuracies_leaves_its_grid_point_without_outcomes(project: Path) -> None:
    params = load_params(project / "params.yaml")
    write_tiny_runs(params, unevaluated={("dir0.5", "fedavg", 1)})
    written = write_tables(params, "tiny", project)
    rows = {(r["partition"], r["method"]): r for r in csv.DictReader(written["csv"].read_text().splitlines())}
    assert rows[("dir0.5", "fedavg")]["final_clients_mean_acc_mean"] == ""   # not a mean over fewer seeds
    assert rows[("dir0.5", "fedavg")]["seeds"] == "2" and rows[("dir0.5", "fedlc")]["final_clients_mean_acc_mean"]
    grid_md = written["md"].read_text().split("Per-client test accuracy")[1]
    assert next(line for line in grid_md.splitlines() if line.startswith("| fedavg |")).split(" | ")[1] == "n/a"


def test_final_outcomes_of_a_diverged_run_are_none_and_a_missing_partition_is_named(project: Path) -> None:
    params = load_params(project / "params.yaml")
    write_tiny_runs(params, diverged={("q2", "fedlc", 1)})
    assert co.final_outcomes(params.run("tiny", "digits", "q2", "fedlc", 1)) is None
    assert co.final_values(params.run("tiny", "digits", "q2", "fedlc", 1)) == dict.fromkeys(co.summary_keys())
    cfg = params.run("tiny", "digits", "q2", "fedavg", 0)
    rounds = co.round_outcomes(cfg)
    assert [o.round for o in rounds] == [2, 4] and co.final_outcomes(cfg) == rounds[-1]
    (project / cfg.path(paths.PARTITION_JSON)).unlink()
    with pytest.raises(co.MissingPartitionError) as missing:
        write_tables(params, "tiny", project)
    assert "1 of the 4 partition summaries" in str(missing.value)
    assert f"snakemake --cores all {cfg.path(paths.PARTITION_JSON)}" in str(missing.value)
