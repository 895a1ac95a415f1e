"""`make run` learns what Snakemake does from its job events, never from its console text: the logger plugin
(src/snakemake_logger_plugin_fedskew) writes Snakemake's log records as JSON lines, `snakemake_run.Progress` reads
them. Here on log records made as Snakemake's logger makes them (no Snakemake run)."""

from __future__ import annotations

import io
import json
import logging

import snakemake_logger_plugin_fedskew as plugin
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry

from fedskew import paths, snakemake_run
from fedskew.config import load_params
from tests.helpers import TINY_PARAMS


def record(event: LogEvent | None, msg: str | None = None, **fields) -> logging.LogRecord:
    """A log record as snakemake.logging makes one: the event and its fields are the record's `extra`."""
    return logging.makeLogRecord({"msg": msg, "event": event, **fields})


def written(tmp_path, records: list[logging.LogRecord]) -> list[str]:
    """The lines the plugin's handler writes for `records`."""
    events = tmp_path / "events.jsonl"
    handler = plugin.LogHandler(None, plugin.LogHandlerSettings(events_file=str(events)))
    for one in records:
        handler.handle(one)
    handler.close()
    return events.read_text().splitlines()


def run_outputs(cfg) -> list[str]:
    return [cfg.path(template).as_posix() for template in (paths.RUN_METRICS, paths.RUN_HISTORY, paths.RUN_CONFIG)]


def trained(cfg, accuracy: str) -> str:
    return f"  trained {cfg.method} on {cfg.dataset}/{cfg.partition} seed {cfg.seed}: final accuracy {accuracy}"


def test_snakemake_finds_the_plugin_by_the_name_rebuild_asks_for() -> None:
    found = LoggerPluginRegistry().get_plugin(snakemake_run.EVENTS_LOGGER)
    assert found.log_handler is plugin.LogHandler
    assert found.settings_cls is plugin.LogHandlerSettings


def test_progress_reports_each_run_whose_job_finished_with_its_accuracy_and_each_step(tmp_path) -> None:
    runs = load_params(TINY_PARAMS).runs()[:4]
    for cfg, accuracy in ((runs[0], 0.6), (runs[1], 0.8), (runs[3], 0.7)):
        metrics = tmp_path / cfg.path(paths.RUN_METRICS)
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(json.dumps({"final_acc": accuracy}))
    lines = written(tmp_path, [
        record(None, "Building DAG of jobs..."),  # no event: not written
        record(LogEvent.JOB_INFO, " Rule: train, Jobid: 1", jobid=1, rule_name="train", output=run_outputs(runs[1])),
        record(LogEvent.SHELLCMD, "Shell command: ...", shellcmd="..."),  # not one that says what happened
        record(LogEvent.JOB_INFO, " Rule: train, Jobid: 2", jobid=2, rule_name="train", output=run_outputs(runs[0])),
        record(LogEvent.JOB_INFO, " Rule: train, Jobid: 4", jobid=4, rule_name="train", output=run_outputs(runs[2])),
        record(LogEvent.JOB_FINISHED, "Finished jobid: 1 (Rule: train)", job_id=1),
        record(LogEvent.PROGRESS, None, done=1, total=10),
        record(LogEvent.JOB_INFO, " Rule: aggregate, Jobid: 3", jobid=3, rule_name="aggregate",
               output=["results/tables/tiny.md"]),
        record(LogEvent.JOB_FINISHED, "Finished jobid: 2 (Rule: train)", job_id=2),
        record(LogEvent.JOB_FINISHED, "Finished jobid: 3 (Rule: aggregate)", job_id=3),
        record(LogEvent.PROGRESS, None, done=3, total=10),
        record(LogEvent.JOB_ERROR, "Error in rule train, jobid: 4", jobid=4, rule_name="train",
               log=["logs/train/seed0.log"]),
        record(LogEvent.ERROR, "WorkflowError:\nAt least one job did not complete successfully.",
               exception="WorkflowError"),
    ])
    assert len(lines) == 11 and all(json.loads(line)["event"] for line in lines)

    out = io.StringIO()
    progress = snakemake_run.Progress(runs, tmp_path, out=out)
    for line in ["not an event\n", *lines]:
        progress.feed(line)
    shown = out.getvalue().splitlines()
    # runs[2]'s job failed and runs[3] was up to date (no job): neither is reported as trained
    assert shown[0] == trained(runs[1], "80.00 %")
    assert shown[1].startswith("[") and shown[1].endswith(" s] 1 of 10 steps (10%) done")
    assert shown[2] == trained(runs[0], "60.00 %")
    assert shown[3].endswith(" s] 3 of 10 steps (30%) done")
    assert shown[4:] == ["Error in rule train, jobid 4; its log: logs/train/seed0.log",
                         "WorkflowError: At least one job did not complete successfully."]


def test_a_run_whose_metrics_cannot_be_read_is_still_reported(tmp_path) -> None:
    [cfg] = load_params(TINY_PARAMS).runs()[:1]
    out = io.StringIO()
    progress = snakemake_run.Progress([cfg], tmp_path, out=out)
    progress.handle({"event": "job_info", "jobid": 7, "rule_name": "train", "output": run_outputs(cfg)})
    progress.handle({"event": "job_finished", "job_id": 7})
    progress.handle({"event": "job_finished", "job_id": 7})  # once only
    assert out.getvalue().splitlines() == [trained(cfg, "(metrics unreadable)")]
