"""What the MLflow store records: the fedskew experiments, their runs and each run's status, read under the
store's lock (fedskew.tracking.store). `track` and `packed import` log a run unless it is recorded here with the
status its files give it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedskew.tracking import clients
from fedskew.tracking.runs import RUN_KEY_TAG
from fedskew.tracking.store import ensure_store, import_mlflow, store_lock


def recorded_runs(uri: str, experiment: str, project_root: Path = Path(".")) -> dict[str, str]:
    """fedskew run id -> MLflow status of the runs in an experiment (FINISHED wins over others). A run recorded
    without its per-client outcomes that the project `project_root` can now give (fedskew.tracking.clients.complete)
    has INCOMPLETE after its status: what a backfill compares with is then not its status, and `track` and
    `packed import` log it again."""
    client_class = import_mlflow(uri)
    with store_lock(uri):
        ensure_store(uri)
        client = client_class(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        runs = [] if found is None else list(_all_runs(client, found.experiment_id))
    status: dict[str, str] = {}
    for run in runs:
        key = run.data.tags.get(RUN_KEY_TAG)
        if key and status.get(key) != "FINISHED":
            status[key] = run.info.status + ("" if clients.complete(run.data.tags, project_root) else clients.INCOMPLETE)
    return status


def _all_runs(client: Any, experiment_id: str) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def fedskew_experiments(uri: str) -> list[tuple[str, str]]:
    """(name, experiment id) of the store's fedskew experiments (`fedskew/<suite>`), by name."""
    client_class = import_mlflow(uri)
    with store_lock(uri):
        client = client_class(tracking_uri=uri)
        found = client.search_experiments(filter_string="name LIKE 'fedskew/%'")
    return sorted((e.name, e.experiment_id) for e in found)


def count_runs(uri: str, experiment: str) -> int:
    """Number of runs in an experiment (0 if it does not exist); takes the store lock like log_run."""
    client_class = import_mlflow(uri)
    with store_lock(uri):
        ensure_store(uri)
        client = client_class(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        return 0 if found is None else sum(1 for _ in _all_runs(client, found.experiment_id))
