"""Per-client outcomes: the global model's test accuracy as each client would see it, derived from a run's files.

Under label skew one global model serves clients whose label distributions differ. Client k, whose training
labels are in proportions p_k(c) (its row of the partition's `label_counts`, data/partitions/.../seed<k>.json),
would see the accuracy acc_k = Σ_c p_k(c) · acc_c, where acc_c is the test accuracy of class c that the run
records in history.csv (`test_acc_class<c>`, at each evaluated round). Per evaluated round:

- `mean`: the mean of acc_k over the clients, each client weighing the same (not by its size);
- `worst10`: the mean of the ⌈K/10⌉ lowest acc_k, the "worst 10 %" that q-FFL and Ditto report; with fewer
  than 10 clients it is the worst client;
- `spread`: the standard deviation of acc_k over the clients, ddof = 0 (the K clients are the whole
  federation, not a sample of one).

All three are fractions in [0, 1], like test_acc. A class the test set does not hold has no accuracy (NaN):
a client's proportions are then taken over the classes it holds that the test set measures, as balanced
accuracy leaves such a class out; a client holding no measured class, or no sample at all, is left out. Nothing
here changes a run's files: the values are derived, by the suite tables (fedskew.report.tables) and MLflow
(fedskew.tracking, section `clients/`). docs/results.md, "Per-client outcomes", says what they are not.

Torch-free: it reads the partition's JSON summary, never its arrays. The run-file readers (fedskew.runfiles,
which brings the configuration's modules) are imported where a run's files are read, so that the tracking
worker, which has the history rows already, starts without them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedskew import metrics, paths

if TYPE_CHECKING:
    from fedskew.config import RunConfig

WORST_SHARE = 10   # worst10: the mean of the ⌈K / WORST_SHARE⌉ lowest client accuracies
# The outcomes by name: MLflow logs `clients/<name>`, the tables' summary key is `final_clients_<name>`.
NAMES = ("mean_acc", "worst10_acc", "spread_acc")
# Which way each improves (a comparison's direction): a fairer model has a higher worst 10 % and a lower spread.
BETTER = {"mean_acc": metrics.Better.HIGHER, "worst10_acc": metrics.Better.HIGHER, "spread_acc": metrics.Better.LOWER}
MLFLOW_SECTION = "clients"


@dataclass(frozen=True)
class ClientOutcomes:
    """The per-client outcomes of one evaluated round (fractions), over `clients` measured clients."""

    round: int
    mean: float
    worst10: float
    spread: float
    clients: int

    def values(self) -> dict[str, float]:
        """`{name: value}` in NAMES' order."""
        return dict(zip(NAMES, (self.mean, self.worst10, self.spread)))


def summary_key(name: str) -> str:
    """The final-round value's key, as metrics.json names summary values: `final_clients_mean_acc`."""
    return f"final_clients_{name}"


def summary_keys() -> list[str]:
    return [summary_key(name) for name in NAMES]


def mlflow_key(name: str) -> str:
    """The MLflow metric of an outcome: `clients/mean_acc`."""
    return f"{MLFLOW_SECTION}/{name}"


def client_accuracies(per_class: Sequence[float], label_counts: Sequence[Sequence[int]]) -> list[float]:
    """acc_k = Σ_c n_k(c) · acc_c / Σ_c n_k(c) of each client that holds a class with a measured (finite)
    accuracy, in client order; the others are left out. A ValueError when the class counts disagree."""
    accuracies = []
    for k, counts in enumerate(label_counts):
        if len(counts) != len(per_class):
            raise ValueError(f"client {k} of the partition has {len(counts)} classes, the history {len(per_class)}")
        held = [(n, acc) for n, acc in zip(counts, per_class) if n > 0 and math.isfinite(acc)]
        total = sum(n for n, _ in held)
        if total:
            accuracies.append(sum(n * acc for n, acc in held) / total)
    return accuracies


def summarise(accuracies: Sequence[float]) -> tuple[float, float, float]:
    """(mean, worst10, spread) of the client accuracies: their mean, the mean of the ⌈K/10⌉ lowest, and their
    standard deviation with ddof = 0. A ValueError for no client."""
    if not accuracies:
        raise ValueError("no client to summarise")
    k = len(accuracies)
    mean = sum(accuracies) / k
    worst = sorted(accuracies)[: -(-k // WORST_SHARE)]
    spread = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / k)
    return mean, sum(worst) / len(worst), spread


def per_class_accuracies(row: Mapping[str, Any]) -> list[float] | None:
    """The per-class test accuracies of a history row, by class; None for a row without an evaluation."""
    entry = metrics.metric("per_class_acc")
    found = {int(key[len(entry.column):]): value for key, value in row.items() if entry.has_column(key)}
    if not found or sorted(found) != list(range(len(found))):
        return None
    try:
        return [float(found[c]) for c in range(len(found))]
    except (TypeError, ValueError):   # an empty or damaged cell: no evaluation to weigh
        return None


def row_outcomes(row: Mapping[str, Any], label_counts: Sequence[Sequence[int]]) -> ClientOutcomes | None:
    """The outcomes of one history row; None where the row holds no evaluation or no client is measured."""
    per_class = per_class_accuracies(row)
    if per_class is None:
        return None
    accuracies = client_accuracies(per_class, label_counts)
    if not accuracies:
        return None
    return ClientOutcomes(int(row["round"]), *summarise(accuracies), clients=len(accuracies))


def history_outcomes(history: Sequence[Mapping[str, Any]], label_counts: Sequence[Sequence[int]]) -> list[ClientOutcomes]:
    """The outcomes of every evaluated round of a history, in round order."""
    return [found for row in history if (found := row_outcomes(row, label_counts)) is not None]


def partition_summary(root: Path, dataset: str, partition: str, seed: int) -> Path:
    """The partition's JSON summary (fedskew.data.partitions.store), under the project folder `root`."""
    return Path(root) / paths.PARTITION_JSON.format(dataset=dataset, partition=partition, seed=seed)


class MissingPartitionError(FileNotFoundError):
    """A run's partition summary is not there (the message says how to draw it)."""


def read_label_counts(path: Path) -> list[list[int]]:
    """The per-client label counts of a partition summary; MissingPartitionError when it is absent."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise MissingPartitionError(
            f"{path} is missing: per-client outcomes weigh the classes by each client's label counts; draw the "
            f"partition with `snakemake --cores all {path}` (or `python -m fedskew partition`)") from None
    try:
        return [[int(n) for n in client] for client in json.loads(text)["label_counts"]]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} holds no readable label_counts ({type(error).__name__}: {error}): draw the "
                         f"partition again (`snakemake --cores all --forcerun partition {path}`)") from None


def require_partitions(runs: Iterable[RunConfig], root: Path = Path(".")) -> None:
    """A MissingPartitionError naming every partition summary of `runs` that is not under `root`, and the one
    command that draws them (Snakemake's partition jobs: only the datasets and partitions, no training)."""
    wanted = dict.fromkeys((cfg.dataset, cfg.partition, cfg.seed) for cfg in runs)
    missing = [path for keys in wanted if not (root / (path := paths.PARTITION_JSON.format(
        dataset=keys[0], partition=keys[1], seed=keys[2]))).exists()]
    if missing:
        raise MissingPartitionError(
            f"{len(missing)} of the {len(wanted)} partition summaries these runs trained on are missing under "
            f"{Path(root).resolve()} ({missing[0]}{', ...' if len(missing) > 1 else ''}): the per-client outcomes "
            "weigh each run's per-class accuracies by its clients' label counts. Draw them with "
            f"`snakemake --cores all {' '.join(missing)}`")


def run_label_counts(cfg: RunConfig, root: Path = Path(".")) -> list[list[int]]:
    return read_label_counts(partition_summary(root, cfg.dataset, cfg.partition, cfg.seed))


def round_outcomes(cfg: RunConfig, root: Path = Path(".")) -> list[ClientOutcomes]:
    """The per-client outcomes of every evaluated round of a trained run (its files verified, as the tables read
    them); MissingPartitionError without its partition summary."""
    from fedskew.runfiles import read_history

    return history_outcomes(read_history(cfg, root), run_label_counts(cfg, root))


def final_outcomes(cfg: RunConfig, root: Path = Path(".")) -> ClientOutcomes | None:
    """The outcomes at the run's final round (metrics.json's `final_round`, whose accuracy the tables report);
    None for a run that diverged or has no evaluated round, as its `final_acc` is None."""
    from fedskew.runfiles import read_metrics

    record = read_metrics(cfg, root)
    if record.get("status") == "diverged" or record.get(metrics.reported_key()) is None:
        return None
    found = round_outcomes(cfg, root)
    final_round = record.get("final_round")
    at_final = [o for o in found if o.round == final_round] if final_round is not None else found[-1:]
    return at_final[-1] if at_final else None


def final_values(cfg: RunConfig, root: Path = Path(".")) -> dict[str, float | None]:
    """The final round's outcomes as summary values, `{final_clients_<name>: value}` (None where there is none):
    the keys the suite tables average over seeds, beside metrics.json's own."""
    final = final_outcomes(cfg, root)
    values = {} if final is None else final.values()
    return {summary_key(name): values.get(name) for name in NAMES}
