"""One training job: train some seeds of one configuration, with everything around the training.

The engine (fedskew.engine.simulation.run_training) trains; this module makes that a job a user or a
scheduler can run and stop: it starts and ends the live MLflow run (through the job's tracking worker,
fedskew.tracking.worker), tags it with what traces the run to its inputs and the machine that computed it,
writes the run files, records a divergence as a result where `training.on_divergence` says so, and
turns SIGTERM into a clean stop that keeps the checkpoint. It also prepares a run's partition and logs
finished run files after the fact (`track`, `packed import`).

The command line (fedskew.cli), the packed runner (fedskew.packed) and the benchmarks call it; it
imports neither of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path

from fedskew import arguments, metrics, paths
from fedskew.config import ConfigError, Params, RunConfig
from fedskew.runfiles import RunFileError, read_history, read_metrics, write_run_files

log = logging.getLogger("fedskew")


class TrackingError(RuntimeError):
    """Runs could not be logged to MLflow (their run files are intact)."""


class RunWriteError(RuntimeError):
    """A run's checkpoint or run files could not be written (a full disk, a read-only folder); what was written
    is whole, and the run's MLflow record ended FAILED."""


def _write_failure(cfg: RunConfig, error: OSError) -> RunWriteError:
    what = f"{error.filename}: {error.strerror or error}" if error.filename else str(error)
    return RunWriteError(f"{cfg.path(paths.RUN_DIR)}: could not write {what}. Nothing half-written is left: free "
                         "disk space or make that folder writable, then run the job again (it resumes from the last "
                         f"checkpoint written in {cfg.path(paths.CHECKPOINT_DIR)})")


class Terminated(BaseException):
    """SIGTERM arrived (a scheduler's preemption, `kill`): stop like Ctrl-C and record the run as KILLED."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop like Ctrl-C does, through every `finally` (fedskew.cli installs it for every command)."""
    raise Terminated(f"stopped by signal {signal.Signals(signum).name}")


def _read_json_field(path: Path, field: str) -> str:
    try:
        return str(json.loads(path.read_text())[field])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """What traces a run to its exact inputs: config hash, partition content hash, dataset digest."""
    from fedskew.tracking import RUN_KEY_TAG

    return {RUN_KEY_TAG: cfg.run_id, "fedskew.config_hash": cfg.run_id,
            "fedskew.partition_hash": _read_json_field(Path(cfg.path(paths.PARTITION_JSON)), "content_hash"),
            "fedskew.dataset_sha256": _read_json_field(Path(paths.RAW_READY.format(dataset=cfg.dataset)), "sha256"),
            **{f"fedskew.{k}": str(v) for k, v in cfg.keys.items()}}


def dataset_record(cfg: RunConfig) -> dict[str, str]:
    """The run's dataset as MLflow shows it (the runs table's Dataset column): name, the sha256 of its
    prepared tensors, where they are, and the partition."""
    ready = Path(paths.RAW_READY.format(dataset=cfg.dataset))
    return {"name": cfg.dataset, "sha256": _read_json_field(ready, "sha256"), "source": str(ready.resolve()),
            "partition": cfg.partition}


def _provenance_tags(provenance: dict[str, str]) -> dict[str, str]:
    return {f"fedskew.provenance.{key}": str(value) for key, value in provenance.items()}


def artifacts(cfg: RunConfig, files: list[Path]) -> list[Path]:
    """What a run's MLflow record carries as artifacts: its files and its partition's heatmap, where they exist."""
    return [f for f in [*files, Path(cfg.path(paths.PARTITION_HEATMAP))] if f.exists()]


def run_name(cfg: RunConfig) -> str:
    """The run's name in MLflow: dataset/partition/method/seed."""
    return f"{cfg.dataset}/{cfg.partition}/{cfg.method}/seed{cfg.seed}"


def tracking_enabled() -> bool:
    """Whether jobs record their runs in MLflow (FEDSKEW_TRACKING=0 turns it off)."""
    return os.environ.get("FEDSKEW_TRACKING", "1") != "0"  # tests and quick experiments may turn it off


def _end_tracking(live, cfg: RunConfig, status: str, files: list[Path], tags: dict[str, str]) -> None:
    """Close the live MLflow run. The run files are the truth and the tracker only observes
    them: a tracking failure is reported loudly but never fails (or, under Snakemake,
    deletes) a trained result; `python -m fedskew track --suite ...` logs it later."""
    if live is None:
        return
    live.end(status, artifacts(cfg, files), tags)
    if live.error is not None:
        log.error("TRACKING FAILED for %s: %s. The run files are intact; log them later with "
                  "`python -m fedskew track --suite %s`.", cfg.path(paths.RUN_DIR), live.error, cfg.suite)


def start_tracking_worker():
    """The job's tracking worker process (`fedskew.tracking.worker`), or None when tracking is off."""
    if not tracking_enabled():
        return None
    from fedskew.tracking.worker import SidecarWorker

    return SidecarWorker().start()


def _start_tracking(cfg: RunConfig, worker):
    """The live MLflow run of one run of a training job, recorded by the job's worker."""
    if worker is None:
        return None
    from fedskew.tracking.worker import SidecarRun

    return SidecarRun(project_root=Path(".").resolve(), experiment=f"fedskew/{cfg.suite}", run_name=run_name(cfg),
                      params=cfg.to_dict(), tags=run_tags(cfg), worker=worker, dataset=dataset_record(cfg),
                      flush_every_s=_flush_every_s()).start()


def _flush_every_s() -> float:
    """FEDSKEW_TRACKING_FLUSH_S: how often a run's rounds go to MLflow, a finite number of seconds above 0."""
    text = os.environ.get("FEDSKEW_TRACKING_FLUSH_S", "10")
    try:
        return arguments.number(0, 3600, low_open=True)(text)
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"FEDSKEW_TRACKING_FLUSH_S={text}: {error} (seconds); or unset it (10 s)") from None


def _tracking_hook(live, cfg: RunConfig):
    """The engine's per-round hook: each history row to the tracker. Before a round that the
    engine checkpoints, wait until MLflow shows the run (once): a job killed when it has
    something to resume then always leaves a visible run, which its retry continues."""
    if live is None:
        return None
    every, last = cfg.train.checkpoint_every, cfg.train.rounds

    def on_round(row: dict) -> None:
        live.log_round(row)
        if row["round"] % every == 0 or row["round"] == last:  # run_training's checkpoint rounds
            live.await_first_round()
    return on_round


class RunsFailedError(RuntimeError):
    """Some runs of a several-seed training job failed (each one's error is in the log above)."""


def train_seeds(params: Params, suite: str, dataset: str, partition: str, method: str, seeds: list[int],
                threads: int | None = None) -> None:
    """Train the runs of one grid point, one per seed, in this process, one after another.

    Several seeds in one job share the interpreter, torch's import and one tracking worker
    (suites with `seeds_per_job: all`): for small runs those fixed costs are most of a job.
    Each run keeps its own checkpoint, run files and MLflow run. A failed run does not stop
    the others; the job then fails naming every failed seed. Ctrl-C or SIGTERM stops the job.
    """
    runs = [params.run(suite, dataset, partition, method, seed) for seed in dict.fromkeys(seeds)]  # each once
    # The tracker starts before torch is imported, so MLflow's import and the store's work in
    # the worker overlap torch's import and the training here.
    worker = start_tracking_worker()
    failed = []
    try:
        for cfg in runs:
            try:
                train_run(cfg, threads, worker)
            except Exception as error:
                if len(runs) == 1:
                    raise
                log.error("%s failed: %s: %s", cfg.path(paths.RUN_DIR), type(error).__name__, error)
                failed.append(f"seed {cfg.seed} ({type(error).__name__}: {error})")
    finally:
        if worker is not None:
            worker.close()
    if failed:
        raise RunsFailedError(f"{len(failed)} of {len(runs)} runs failed: {'; '.join(failed)}. The runs that "
                              "finished kept their checkpoints: running the job again only restores them.")


def train_run(cfg: RunConfig, threads: int | None = None, worker=None) -> None:
    """Train one run (resuming from its checkpoint), write its run files, and record it live in MLflow through
    `worker` (`start_tracking_worker()`; None: no tracking). SIGTERM stops it as Ctrl-C does."""
    live = _start_tracking(cfg, worker)
    try:
        from fedskew.engine.checkpoint import CheckpointWriteError
        from fedskew.engine.rounds import NonFiniteError
        from fedskew.engine.simulation import resolve_device, run_training
        from fedskew.engine.summary import summarise_divergence
        from fedskew.provenance import run_provenance
    except BaseException as error:  # a broken install or a Ctrl-C during torch's import: the run ends, not RUNNING
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        _end_tracking(live, cfg, status, [], {"fedskew.error": f"{type(error).__name__}: {error}"})
        raise

    # What computed the run (device, CPU model and kernels, library versions, commit), asked once it has trained:
    # in metrics.json and as MLflow tags, so that a number that differs between machines names the machine.
    def provenance() -> dict[str, str]:
        return run_provenance(str(resolve_device(cfg.train.device)), cfg.train.precision, cfg.train.model)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        result = run_training(cfg, threads=threads, on_round=_tracking_hook(live, cfg))
    except NonFiniteError as error:
        history = error.history or []
        files = []
        computed = provenance()
        if cfg.train.on_divergence == "record":
            # A divergence is a result of this method in this setting: the tables show it.
            files = _write_run_files(live, cfg, history, {**summarise_divergence(error), "provenance": computed})
        _end_tracking(live, cfg, "FAILED", files, {"fedskew.error": str(error), **_provenance_tags(computed)})
        if cfg.train.on_divergence == "record":
            log.warning("%s diverged (recorded as a result): %s", cfg.path(paths.RUN_DIR), error)
            return
        raise
    except (Terminated, KeyboardInterrupt) as stop:  # the checkpoint stays; a retry continues the same run
        _end_tracking(live, cfg, "KILLED", [], {"fedskew.error": str(stop) or "interrupted"})
        raise
    except CheckpointWriteError as error:  # the previous checkpoint stays whole
        failure = _write_failure(cfg, error)
        _end_tracking(live, cfg, "FAILED", [], {"fedskew.error": str(failure)})
        raise failure from error
    except (Exception, SystemExit) as error:  # a plugin exiting fails the run too (and the command: cli.main)
        _end_tracking(live, cfg, "FAILED", [], {"fedskew.error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    computed = provenance()
    files = _write_run_files(live, cfg, result.history, {**result.final, "provenance": computed})
    _end_tracking(live, cfg, "FINISHED", files, {"fedskew.resumed_from_round": str(result.resumed_from),
                                                 "fedskew.threads": str(threads or cfg.train.threads),
                                                 "fedskew.execution": result.execution,
                                                 **_provenance_tags(computed)})
    log.info("%s: final accuracy %.4f", cfg.path(paths.RUN_DIR),
             result.final[metrics.reported_key()])
    # what benchmarks/fixed_cost.py reads: the job's wall time minus this is its fixed cost
    log.info("timing: %d rounds in %.3f s", len(result.history) - result.resumed_from, result.loop_seconds)


def _write_run_files(live, cfg: RunConfig, history: list[dict], final: dict) -> list[Path]:
    """The run's files written (fedskew.runfiles), or its MLflow run ended FAILED and a RunWriteError saying
    what to do (a RunFileError where the run gave a number no table can use: nothing is written)."""
    try:
        return write_run_files(cfg, history, final)
    except OSError as error:
        failure = _write_failure(cfg, error)
        _end_tracking(live, cfg, "FAILED", [], {"fedskew.error": str(failure)})
        raise failure from error
    except RunFileError as error:
        _end_tracking(live, cfg, "FAILED", [], {"fedskew.error": str(error)})
        raise


def _recorded_runs(suite: str) -> dict[str, str]:
    """What MLflow records of a suite (fedskew.tracking.recorded_runs); a TrackingError at once when the tracking
    server does not answer (fedskew.tracking.reach: a probe of seconds, not MLflow's retries) or fails."""
    from fedskew import tracking
    from fedskew.tracking import reach
    from fedskew.tracking.redaction import redact_uri, redacted

    uri = tracking.tracking_uri(Path("."))
    if (reason := reach.probe(uri)) is not None:
        raise TrackingError(f"{reach.unreachable_message(uri, reason)}: nothing was logged, and the run files are "
                            f"as they were; run `python -m fedskew track --suite {suite}` again once it answers")
    try:
        return tracking.recorded_runs(uri, f"fedskew/{suite}")
    except Exception as error:
        if not reach.is_server(uri):
            raise  # a local store's own error says what to do (fedskew.tracking.store)
        # It answered the probe, then failed (after MLflow's bounded retries): MLflow's error names the URI.
        raise TrackingError(redacted(f"reading the runs of suite {suite} from the MLflow tracking server "
                                     f"{redact_uri(uri)} failed: {error}; nothing was logged")) from error


def track_suite(params: Params, suite: str) -> dict[str, int]:
    """Log a suite's trained runs to MLflow from their run files (a backfill; safe to repeat). Returns the
    counts by outcome; raises TrackingError when a run could not be logged, or the server cannot be read."""
    if suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {suite!r} is not defined under `suites` in params.yaml")
    recorded = _recorded_runs(suite)
    counts = {"logged": 0, "already recorded": 0, "not trained": 0, "failed": 0}
    for cfg in params.suite_runs(suite):
        if not Path(cfg.path(paths.RUN_METRICS)).exists():
            counts["not trained"] += 1
            continue
        final = read_metrics(cfg)  # only intact run files are logged
        if recorded.get(cfg.run_id) == finished_status(final):
            counts["already recorded"] += 1
            continue
        try:
            log_run_files(cfg, run_tags(cfg))
            counts["logged"] += 1
        except Exception as error:  # noqa: BLE001 - report every run that could not be logged, then fail
            log.error("logging %s failed: %s", cfg.path(paths.RUN_DIR), error)
            counts["failed"] += 1
    if counts["failed"]:
        raise TrackingError(f"{counts['failed']} run(s) could not be logged; see the errors above")
    return counts


def finished_status(final: dict) -> str:
    """The MLflow status of a run whose files are written: a recorded divergence is FAILED."""
    return "FAILED" if final.get("status") == "diverged" else "FINISHED"


def log_run_files(cfg: RunConfig, tags: dict[str, str]) -> None:
    """Log one run to MLflow from its (intact) run files, after the fact: `track` and `packed import`."""
    from fedskew import tracking

    final = read_metrics(cfg)
    files = [Path(cfg.path(p)) for p in (paths.RUN_CONFIG, paths.RUN_HISTORY, paths.RUN_METRICS)]
    tags = {**tags, **({"fedskew.error": final["error"]} if "error" in final else {})}
    tracking.log_run(project_root=Path(".").resolve(), experiment=f"fedskew/{cfg.suite}", run_name=run_name(cfg),
                     params=cfg.to_dict(), history=read_history(cfg), tags=tags, artifacts=artifacts(cfg, files),
                     status=finished_status(final), dataset=dataset_record(cfg))


def prepare_partition(params: Params, dataset: str, partition: str, seed: int) -> None:
    """Write the seeded partition of `dataset` (and its heatmap) under data/partitions/: the partition job."""
    from fedskew.data import registry
    from fedskew.data.partitions import make_partition, plot_heatmap, save_partition

    spec = params.partition_spec(partition)
    data = registry.load(dataset, params.dataset_spec(dataset))
    scheme_params = {k: v for k, v in spec.items() if k != "scheme"}
    made = make_partition(data.y_train.numpy(), data.num_classes, spec["scheme"], scheme_params, seed,
                          dataset=dataset, natural_groups=data.natural_groups)
    keys = {"dataset": dataset, "partition": partition, "seed": seed}
    save_partition(made, Path(paths.PARTITION.format(**keys)))
    plot_heatmap(made, Path(paths.PARTITION_HEATMAP.format(**keys)), title=f"{dataset} / {partition} / seed {seed}")
