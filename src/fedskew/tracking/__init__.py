"""MLflow tracking at the edge of fedskew: it observes the run files, and is never an input to a result.

- `store`: where the MLflow store is (`tracking_uri`), the lock every local writer holds, and the store's
  kill-safe creation and repair.
- `runs`: one MLflow run per fedskew run, followed live while a job trains (`LiveRun`) or logged at once
  from its run files (`log_run`), idempotent per fedskew run id.
- `clients`: each evaluated round's per-client outcomes (fedskew.client_outcomes) as metrics of the section
  `clients/`, and the tag saying whether a run has them.
- `recorded`: what the store records: the fedskew experiments, their runs, each run's status.
- `reach`: whether a tracking server answers, probed in seconds once per build (or per job's run), and MLflow's
  own HTTP retries bounded, so that a silent server costs a build seconds and its runs wait for `fedskew track`.
- `redaction`: the tracking URI as fedskew prints it, and every line of a fedskew process (MLflow's and urllib3's
  included) cleaned of the URI's secrets: user-info, query and fragment.
- `ui`: `fedskew ui`, MLflow's UI on the project's store, its links to each suite's runs printed once it answers.
- `worker`: the job's tracking worker process (`python -m fedskew.tracking.worker`), which runs the
  `LiveRun`s beside the training so that MLflow's import and SQL work stay off the training's core.

The names below are the package's interface. Only the training job (fedskew.job) and the commands that read
the store import it; MLflow itself is imported lazily, inside the functions that need it.
"""

from fedskew.tracking.recorded import count_runs, fedskew_experiments, recorded_runs
from fedskew.tracking.runs import (
    ERROR_TAG,
    RUN_KEY_TAG,
    LiveRun,
    flatten_params,
    git_state,
    log_run,
    mlflow_metric_key,
)
from fedskew.tracking.store import TrackingStoreError, ensure_store, sqlite_store_path, tracking_uri

__all__ = ["ERROR_TAG", "RUN_KEY_TAG", "LiveRun", "TrackingStoreError", "count_runs", "ensure_store",
           "fedskew_experiments", "flatten_params", "git_state", "log_run", "mlflow_metric_key", "recorded_runs",
           "sqlite_store_path", "tracking_uri"]
