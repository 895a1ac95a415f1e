"""Per-client outcomes in MLflow: each evaluated round's `clients/mean_acc`, `clients/worst10_acc` and
`clients/spread_acc` (fedskew.client_outcomes), beside the history's own metrics.

A run's MLflow record derives them from its history rows and its partition's label counts: live, in the job's
tracking worker (the training job has drawn the partition it trains on), and from run files, in a backfill
(`fedskew track`, `packed import`), from the project's data/partitions/. The tag `fedskew.client_outcomes` says
whether they were logged: `logged`, or why not (`missing <path>`: the partition summary is not in this project,
as after importing runs trained elsewhere; `not a fedskew run`: params that name no partition). A run recorded
without them (by a fedskew that did not log them, or while a partition was missing that has been drawn since)
does not count as recorded (`recorded_runs`), so the next `track` or `packed import` logs it again, completing
the same MLflow run; while its partition is still missing there is nothing to add, and it is not logged again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedskew import client_outcomes

log = logging.getLogger(__name__)

TAG = "fedskew.client_outcomes"
LOGGED = "logged"
NOT_A_RUN = "not a fedskew run"   # params without dataset, partition and seed (a test's, an experiment's own)
MISSING = "missing "              # + the partition summary's path (relative to the project) that was not there
INCOMPLETE = " (no per-client outcomes)"   # what `recorded_runs` appends to the status of a run recorded without


def label_counts(project_root: Path, params: Mapping[str, Any]) -> tuple[list[list[int]] | None, str]:
    """The label counts of the run's partition and the tag value saying whether its outcomes can be logged."""
    try:
        dataset, partition, seed = params["dataset"], params["partition"], int(params["seed"])
    except (KeyError, TypeError, ValueError):
        return None, NOT_A_RUN
    path = client_outcomes.partition_summary(Path(project_root), str(dataset), str(partition), seed)
    try:
        return client_outcomes.read_label_counts(path), LOGGED
    except client_outcomes.MissingPartitionError:
        shown = path.relative_to(project_root) if path.is_relative_to(project_root) else path
        log.warning("%s is missing: the run's per-client outcomes (MLflow clients/) are not logged; draw the "
                    "partition, then `python -m fedskew track --suite ...` adds them", shown)
        return None, f"{MISSING}{shown}"
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("%s cannot be read (%s): the run's per-client outcomes are not logged", path, error)
        return None, f"unreadable {path.name}"


def metric_values(rows: Sequence[Mapping[str, Any]], counts: list[list[int]] | None) -> list[tuple[str, float, int]]:
    """(MLflow key, value, step = round) of every outcome of every evaluated row; none without label counts.
    A row whose classes the partition does not have is left out (and said once)."""
    if counts is None:
        return []
    values = []
    for row in rows:
        try:
            found = client_outcomes.row_outcomes(row, counts)
        except ValueError as error:
            log.warning("per-client outcomes of round %s not logged: %s", row.get("round"), error)
            return values
        if found is not None:
            values += [(client_outcomes.mlflow_key(name), value, found.round) for name, value in found.values().items()]
    return values


def complete(tags: Mapping[str, str], project_root: Path = Path(".")) -> bool:
    """Whether a recorded run has nothing more to log here: its per-client outcomes are logged, it has none, or the
    partition summary they need is still missing under `project_root` (once it is drawn, the run is logged again)."""
    value = tags.get(TAG)
    if value in (LOGGED, NOT_A_RUN):
        return True
    if value is not None and value.startswith(MISSING):
        return not (Path(project_root) / value.removeprefix(MISSING)).exists()
    return False   # recorded by a fedskew that did not log them, or from an unreadable summary
