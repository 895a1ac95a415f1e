"""MLflow runs, one per fedskew run: followed live while a job trains (`LiveRun`), or logged at once
from run files (`log_run`, a backfill).

MLflow observes and is never an input, so nothing in the core imports this package and
``mlflow`` itself is imported lazily inside the functions that need it. Every write holds the
store's lock (fedskew.tracking.store). Logging is idempotent per fedskew run id: a retry continues
the run it finds (same tag ``fedskew.run_id``) instead of adding a second one, and metric points
carry the run's start time as timestamp, so logging them again adds nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import numbers
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedskew.metrics import mlflow_section
from fedskew.tracking import clients, reach
from fedskew.tracking.store import (
    TrackingStoreError,
    ensure_store,
    import_mlflow,
    local_store_path,
    store_lock,
    tracking_uri,
)
from fedskew.tracking.redaction import redact_uri, redacted

log = logging.getLogger(__name__)

RUN_KEY_TAG = "fedskew.run_id"  # one MLflow run per value of this tag
# On a run that a later one replaced (the same grid point of the suite, another run id: a changed hyperparameter,
# training setting or numerics version): the run id that replaced it. Replaced runs stay in the store.
REPLACED_TAG = "fedskew.replaced_by"
ERROR_TAG = "fedskew.error"  # why a run ended FAILED or KILLED; cleared when a retry continues it
MAX_PARAM_VALUE_LEN = 6000  # MLflow's limit on a param value
MAX_TAG_VALUE_LEN = 8000  # MLflow's limit on a tag value
# MLflow 3 opens an experiment on its GenAI overview (traces, token usage) unless the experiment says
# it is about training models: this tag makes `mlflow ui` open on the runs table.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
DATASET_DIGEST_LEN = 16  # MLflow keeps at most 36 characters of a dataset digest; the full sha256 is a run tag
DATASET_LOG_TRIES = 3  # attempts to link a run to its dataset (see _log_dataset)
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
TRUNCATION_MARKER = "...[truncated]"


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


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """Get or create an experiment (a model-training one), tolerating another writer creating it first."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # a store written before fedskew set the kind
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return found.experiment_id


def _dataset_input(dataset: dict[str, str]) -> Any:
    """A run's dataset as an MLflow dataset input (the UI's Dataset column and its filters):
    `dataset` has name, sha256, source (where the files came from) and partition."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    source = json.dumps({"uri": dataset["source"]})
    return DatasetInput(Dataset(name=dataset["name"], digest=dataset["sha256"][:DATASET_DIGEST_LEN],
                                source_type="local", source=source),
                        tags=[InputTag("mlflow.data.context", "training"),
                              InputTag("fedskew.partition", dataset.get("partition", ""))])


def _log_dataset(client: Any, run_id: str, dataset_input: Any) -> None:
    """Link a run to its dataset, retrying a clash with another job's insert of the same dataset.

    An MLflow server (3.17, SQLAlchemy store) looks the dataset up, then inserts it when missing, in
    one transaction: two jobs of an experiment that start together both miss it, and the later insert
    fails on the store's unique key (experiment, name, digest) with BAD_REQUEST. Seen on the one-node
    SLURM cluster (tests/cluster). The failed transaction leaves nothing behind, and a retry finds
    the other job's row and links it, so retrying is safe; a local store never clashes, since its
    writers take the store's file lock. Bounded: DATASET_LOG_TRIES attempts, and only when the server
    answered: a request that got no answer has had MLflow's own retries already (fedskew.tracking.reach),
    and trying it again would multiply the wait for a hung server."""
    from mlflow.exceptions import MlflowException

    for attempt in range(1, DATASET_LOG_TRIES + 1):
        try:
            client.log_inputs(run_id, datasets=[dataset_input])
            return
        except MlflowException as error:
            if attempt == DATASET_LOG_TRIES or reach.unanswered(error):
                raise
            time.sleep(0.2 * attempt)


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def mlflow_metric_key(key: str) -> str:
    """The name a history column is logged under in MLflow, in its section (fedskew.metrics.mlflow_section):
    `test_acc` -> `accuracy/test_acc`, `bytes_up` -> `traffic/bytes_up`; a column of no known kind keeps its name."""
    section = mlflow_section(key)
    return key if section is None else f"{section}/{key}"


def _metrics(history: list[dict], timestamp: int, label_counts: list[list[int]] | None = None) -> list[Any]:
    """Every numeric value of every history row as an MLflow metric at step = round, and each evaluated row's
    per-client outcomes (fedskew.tracking.clients) where the partition's label counts are known.

    All points share one timestamp (the run's start), so logging the same history again
    (a retry, a backfill) reproduces identical points, which MLflow stores once.
    """
    from mlflow.entities import Metric

    return [Metric(mlflow_metric_key(key), float(value), timestamp, int(row["round"]))
            for row in history for key, value in row.items()
            if key != "round" and isinstance(value, numbers.Real) and not isinstance(value, bool)] + [
        Metric(key, value, timestamp, step) for key, value, step in clients.metric_values(history, label_counts)]


def _find_run(client: Any, experiment_id: str, key: str) -> Any | None:
    """The run already recorded for fedskew run id `key` (a finished one first, then the oldest), or None."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'", max_results=100)
    return min(found, key=lambda r: (r.info.status != "FINISHED", r.info.start_time)) if found else None


def _mark_replaced(client: Any, experiment_id: str, run_name: str, key: str) -> None:
    """Tag every earlier run of the same grid point (run name) under another run id as replaced by `key`, so that
    `tags.fedskew.replaced_by` finds what a change retrained, and what it was (the old run keeps its params)."""
    found = client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{run_name}'", max_results=1000)
    for earlier in found:
        if earlier.data.tags.get(RUN_KEY_TAG) not in (None, key) and REPLACED_TAG not in earlier.data.tags:
            client.set_tag(earlier.info.run_id, REPLACED_TAG, key)


class LiveRun:
    """One MLflow run that follows a training job while it trains.

    `start` finds the run recorded under the fedskew run id (``tags[RUN_KEY_TAG]``) or
    creates it, and marks it RUNNING; `log_round` buffers history rows and sends them in
    one batch at most every `flush_every_s` seconds (and after the first round, so a run
    shows up at once); `end` sends the rest, the artifacts and the final status
    (FINISHED, FAILED or KILLED). A job killed with -9 leaves the run RUNNING, and its
    retry continues the same run. Points logged twice (the rounds a resumed job replays
    from its checkpoint) are identical and stored once.

    With ``strict=False`` (training jobs) a tracker failure never propagates: it is logged
    once, `error` says what happened, and tracking stops for this job; the run files stay
    the truth and `fedskew track` logs them later. ``strict=True`` raises (a backfill).
    """

    def __init__(self, *, project_root: Path, experiment: str, run_name: str, params: dict,
                 tags: dict[str, str], uri: str | None = None, strict: bool = False,
                 flush_every_s: float = 10.0, dataset: dict[str, str] | None = None) -> None:
        self.project_root = Path(project_root)
        self.dataset = dataset
        self.uri = uri or tracking_uri(project_root)
        self.experiment, self.run_name, self.strict = experiment, run_name, strict
        self.params, self.tags = params, tags
        self.flush_every_s = flush_every_s
        self.run_id: str | None = None
        self.error: str | None = None
        self._client: Any = None
        self._start_time = 0
        self._pending: list[dict] = []
        self._last_flush: float | None = None
        # the partition's label counts, for the per-client outcomes; the tag says whether they are logged
        self._label_counts, outcomes = clients.label_counts(self.project_root, params)
        self.tags = {**tags, clients.TAG: outcomes}

    def _guard(self, what: str, action: Any) -> None:
        if self.error is not None:
            return
        try:
            action()
        except Exception as exc:
            self.error = redacted(f"{what} failed: {type(exc).__name__}: {exc}")  # a request's error names its URL
            if self.strict:
                raise
            log.error("TRACKING FAILED for %s (%s); tracking stops for this job, training goes on",
                      self.run_name, self.error)

    def start(self) -> LiveRun:
        self._guard("opening the MLflow run", self._start)
        return self

    def _start(self) -> None:
        client_class = import_mlflow(self.uri)
        from mlflow.entities import Param, RunTag

        all_tags = {**git_state(self.project_root), **self.tags}
        if all_tags["git.commit"] != "unknown":
            all_tags.setdefault("mlflow.source.git.commit", all_tags["git.commit"])
        params = [Param(k, v) for k, v in flatten_params(self.params).items()]
        tags = [RunTag(k, _truncate(str(v), MAX_TAG_VALUE_LEN)) for k, v in all_tags.items()]
        key = all_tags.get(RUN_KEY_TAG)
        local = local_store_path(self.uri) is not None
        artifact_location = (self.project_root.resolve() / "mlartifacts").as_uri() if local else None
        with store_lock(self.uri):
            ensure_store(self.uri)
            client = self._client = client_class(tracking_uri=self.uri)
            experiment_id = _experiment_id(client, self.experiment, artifact_location)
            run = _find_run(client, experiment_id, key) if key else None
            if run is None:  # the key tag is written with the run, in one transaction: a kill cannot separate them
                run = client.create_run(experiment_id, run_name=self.run_name,
                                        tags={RUN_KEY_TAG: key} if key else None)
                if key:
                    _mark_replaced(client, experiment_id, self.run_name, key)
            else:
                log.info("continuing MLflow run %s of %s %s", run.info.run_id, RUN_KEY_TAG, key)
                if run.info.status != "RUNNING":
                    client.update_run(run.info.run_id, status="RUNNING")
                if ERROR_TAG in run.data.tags:  # the reason of the earlier ending no longer holds
                    client.delete_tag(run.info.run_id, ERROR_TAG)
            self.run_id, self._start_time = run.info.run_id, run.info.start_time
            for batch in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(self.run_id, params=batch)
            for batch in _chunks(tags, MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(self.run_id, tags=batch)
            logged = run.inputs.dataset_inputs if run.inputs is not None else []
            if self.dataset and not logged:  # once: a continued run has it already
                _log_dataset(client, self.run_id, _dataset_input(self.dataset))

    def add_rows(self, rows: list[dict]) -> None:
        """Buffer history rows to be sent with the next flush."""
        self._pending.extend(rows)

    def log_round(self, row: dict) -> None:
        """Buffer one history row; send the buffer when it is due."""
        if self.error is not None:
            return
        self._pending.append(row)
        now = time.monotonic()
        if self._last_flush is None or now - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if self._pending:
            self._guard("logging metrics", self._flush)

    def _flush(self) -> None:
        metrics = _metrics(self._pending, self._start_time, self._label_counts)
        with store_lock(self.uri):
            for batch in _chunks(metrics, MAX_METRICS_PER_BATCH):
                self._client.log_batch(self.run_id, metrics=batch)
        self._pending = []

    def end(self, status: str, artifacts: list[Path] = (), tags: dict[str, str] | None = None) -> None:
        """Send what is buffered, the artifacts and extra tags, then the final status."""
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"status must be FINISHED, FAILED or KILLED, not {status!r}")
        self.flush()
        self._guard("finishing the MLflow run", lambda: self._end(status, list(artifacts), tags or {}))

    def _end(self, status: str, artifacts: list[Path], tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        with store_lock(self.uri):
            if tags:
                self._client.log_batch(self.run_id, tags=[RunTag(k, _truncate(str(v), MAX_TAG_VALUE_LEN))
                                                          for k, v in tags.items()])
            for artifact in map(Path, artifacts):
                if artifact.is_dir():
                    self._client.log_artifacts(self.run_id, str(artifact), artifact_path=artifact.name)
                else:
                    self._client.log_artifact(self.run_id, str(artifact))
            self._client.set_terminated(self.run_id, status)


def log_run(*, project_root: Path, experiment: str, run_name: str, params: dict, history: list[dict],
            tags: dict[str, str], artifacts: list[Path], status: str = "FINISHED",
            uri: str | None = None, dataset: dict[str, str] | None = None) -> str:
    """Record one whole run in MLflow at once (a backfill from run files) and return its run id.

    Idempotent per ``tags[RUN_KEY_TAG]``, like `LiveRun`: a run already recorded under
    that fedskew run id is continued and completed instead of a second one being created.
    A run that fails to log completely is marked FAILED (best effort) and the error is
    re-raised, so a half-logged run never looks finished.
    """
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, not {status!r}")
    run = LiveRun(project_root=project_root, experiment=experiment, run_name=run_name, params=params,
                  tags=tags, uri=uri, strict=True, flush_every_s=float("inf"), dataset=dataset)
    try:
        run.start()
        run.add_rows(history)
        run.end(status, artifacts)
    except BaseException as exc:  # interrupts too: never leave a half-logged run behind unmarked
        if run.run_id is not None:
            with contextlib.suppress(Exception), store_lock(run.uri):
                run._client.set_terminated(run.run_id, "FAILED")
        if not isinstance(exc, Exception) or isinstance(exc, TrackingStoreError):  # the latter says all
            raise
        marked = f"; run {run.run_id} marked FAILED" if run.run_id else ""
        raise RuntimeError(redacted(f"logging run {run_name!r} (experiment {experiment!r}) to MLflow store "
                                    f"{redact_uri(run.uri)} failed{marked}: {exc}")) from exc
    log.info("logged run %s (%s) to %s", run_name, run.run_id, redact_uri(run.uri))
    return run.run_id
