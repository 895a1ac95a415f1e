"""MLflow logging at the edge of fedskew: one call per finished (or failed) training run.

MLflow observes and is never an input, so nothing in the core imports this module and
``mlflow`` itself is imported lazily inside the functions that need it. Several training
jobs log to one local SQLite store at once; SQLite plus MLflow's SQLAlchemy store is not
safe for that (schema creation, experiment creation and writes race or fail with
"database is locked"), so every access to a local store holds an exclusive ``flock`` on
``<store>.lock``. Remote tracking servers serialise writes themselves and take no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import numbers
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "mlflow.db"
MAX_PARAM_VALUE_LEN = 6000  # MLflow's limit on a param value
MAX_TAG_VALUE_LEN = 8000  # MLflow's limit on a tag value
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
TRUNCATION_MARKER = "...[truncated]"
_NOISY_LOGGERS = ("alembic", "mlflow.store.db.utils", "mlflow.store.tracking.sqlalchemy_store")


def tracking_uri(project_root: Path) -> str:
    """$MLFLOW_TRACKING_URI if set (e.g. a cluster's server), else a SQLite store in the project."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(project_root).resolve() / DEFAULT_DB_NAME}"


def _truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER


def flatten_params(params: dict, prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into MLflow params: ``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``.

    Lists and tuples become JSON, None becomes "null", values longer than MLflow's limit
    are cut and end in a visible marker rather than being rejected.
    """
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, name))
            continue
        if value is None:
            text = "null"
        elif isinstance(value, (list, tuple, dict)):
            text = json.dumps(value, default=str)
        else:
            text = str(value)
        flat[name] = _truncate(text, MAX_PARAM_VALUE_LEN)
    return flat


def _git(project_root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(project_root), *args],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state(project_root: Path) -> dict[str, str]:
    """Commit and dirtiness of the code that produced a run; "unknown" when git cannot say.

    Dirty means uncommitted changes to tracked files (as ``git describe --dirty``), so
    untracked run outputs inside the checkout do not mark every run dirty.
    """
    commit = _git(project_root, "rev-parse", "--verify", "HEAD")
    status = _git(project_root, "status", "--porcelain", "--untracked-files=no") if commit else None
    dirty = "unknown" if status is None else ("true" if status else "false")
    return {"git.commit": commit or "unknown", "git.dirty": dirty}


def _local_store_path(uri: str) -> Path | None:
    """Path of a local store (SQLite file or file-store directory), None for remote or in-memory stores."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri[len("sqlite:///"):].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        return Path(unquote(path)) if path and path != ":memory:" else None
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":  # a plain path is a file store
        return Path(uri)
    return None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive cross-process lock on a local store; no-op for remote servers."""
    store = _local_store_path(uri)
    if store is None:
        yield
        return
    store = store.absolute()
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.with_name(store.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _import_mlflow(uri: str) -> type:
    """Import MLflow (and, for SQLite, its slow SQLAlchemy store) before taking the lock, so
    parallel writers spend their CPU-bound import time in parallel, not queued behind each other."""
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    return MlflowClient


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """Get or create an experiment, tolerating another writer creating it first."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _metrics(history: list[dict]) -> list[Any]:
    """Every numeric value of every history row as an MLflow metric at step = round."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key, float(value), now, int(row["round"]))
            for row in history for key, value in row.items()
            if key != "round" and isinstance(value, numbers.Real) and not isinstance(value, bool)]


def log_run(*, project_root: Path, experiment: str, run_name: str, params: dict, history: list[dict],
            tags: dict[str, str], artifacts: list[Path], status: str = "FINISHED",
            uri: str | None = None) -> str:
    """Record one training run in MLflow and return its run id.

    A run that fails to log completely is marked FAILED (best effort) and the error is
    re-raised, so a half-logged run never looks finished.
    """
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, not {status!r}")
    uri = uri or tracking_uri(project_root)
    client_class = _import_mlflow(uri)
    from mlflow.entities import Param, RunTag

    all_tags = {**git_state(project_root), **tags}
    if all_tags["git.commit"] != "unknown":
        all_tags.setdefault("mlflow.source.git.commit", all_tags["git.commit"])
    # build everything before touching the store: bad input fails fast and holds no lock
    param_list = [Param(k, v) for k, v in flatten_params(params).items()]
    tag_list = [RunTag(k, _truncate(str(v), MAX_TAG_VALUE_LEN)) for k, v in all_tags.items()]
    metric_list = _metrics(history)
    local = _local_store_path(uri) is not None
    artifact_location = (Path(project_root).resolve() / "mlartifacts").as_uri() if local else None
    run_id = None
    with _store_lock(uri):
        try:
            client = client_class(tracking_uri=uri)
            run_id = client.create_run(_experiment_id(client, experiment, artifact_location),
                                       run_name=run_name).info.run_id
            for batch in _chunks(param_list, MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(run_id, params=batch)
            for batch in _chunks(tag_list, MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(run_id, tags=batch)
            for batch in _chunks(metric_list, MAX_METRICS_PER_BATCH):
                client.log_batch(run_id, metrics=batch)
            for artifact in map(Path, artifacts):
                if artifact.is_dir():
                    client.log_artifacts(run_id, str(artifact), artifact_path=artifact.name)
                else:
                    client.log_artifact(run_id, str(artifact))
            client.set_terminated(run_id, status)
        except BaseException as exc:  # interrupts too: never leave a half-logged run behind unmarked
            if run_id is not None:
                with contextlib.suppress(Exception):
                    client.set_terminated(run_id, "FAILED")
            if not isinstance(exc, Exception):
                raise
            marked = f"; run {run_id} marked FAILED" if run_id else ""
            raise RuntimeError(f"logging run {run_name!r} (experiment {experiment!r}) to MLflow store "
                               f"{uri} failed{marked}: {exc}") from exc
    log.info("logged run %s (%s) to %s", run_name, run_id, uri)
    return run_id


def count_runs(uri: str, experiment: str) -> int:
    """Number of runs in an experiment (0 if it does not exist); takes the store lock like log_run."""
    client_class = _import_mlflow(uri)
    with _store_lock(uri):
        client = client_class(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return 0
        total, token = 0, None
        while True:
            page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
            total += len(page)
            token = page.token
            if not token:
                return total
