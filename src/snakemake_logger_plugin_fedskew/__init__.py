"""Snakemake's job events as JSON lines: the logger plugin through which `fedskew run` follows a build.

`snakemake --logger fedskew --logger-fedskew-events-file PATH` appends one JSON object a line to PATH for
each job that starts, finishes or fails, for each progress step and for each workflow error, with the
fields Snakemake's log records carry (snakemake-interface-logger-plugins 2.x), for example

    {"event": "job_info", "jobid": 3, "rule_name": "train", "input": [...], "output": [".../metrics.json", ...], ...}
    {"event": "job_finished", "job_id": 3}
    {"event": "progress", "done": 1, "total": 50}

`fedskew.snakemake_run` reads them from a pipe, so it learns what Snakemake did from Snakemake itself, whatever
runs the jobs (an executor plugin) or stores the files (a storage plugin), and never from its console text,
which goes on to Snakemake's usual stream as before.

Snakemake finds a logger plugin as a package named `snakemake_logger_plugin_<name>` on the Python path;
fedskew's commands run Snakemake with `src/` on that path, so nothing needs installing. The package
imports nothing of fedskew: it runs inside Snakemake's process.
"""

import json
from dataclasses import dataclass, field
from logging import LogRecord
from typing import Optional

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

# The events written, each with the fields of Snakemake's record that say what happened.
FIELDS = {
    LogEvent.JOB_INFO: ("jobid", "rule_name", "input", "output", "wildcards"),
    LogEvent.JOB_FINISHED: ("job_id",),
    LogEvent.JOB_ERROR: ("jobid", "rule_name", "log"),
    LogEvent.PROGRESS: ("done", "total"),
    LogEvent.ERROR: ("exception",),
}


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    events_file: Optional[str] = field(  # Optional[]: the form Snakemake's option parser reads
        default=None,
        metadata={"help": "The file (or pipe, e.g. /dev/fd/N) that the JSON lines are appended to.",
                  "required": True})


class LogHandler(LogHandlerBase):
    def __post_init__(self) -> None:
        # Line-buffered: the reader acts on each event as it happens.
        self.events = open(self.settings.events_file, "a", buffering=1, encoding="utf-8")

    def emit(self, record: LogRecord) -> None:
        event = getattr(record, "event", None)
        if event not in FIELDS:
            return
        line = {"event": str(event), **{name: getattr(record, name, None) for name in FIELDS[event]}}
        if event == LogEvent.ERROR:
            line["message"] = record.getMessage()
        try:
            self.events.write(json.dumps(line, default=str) + "\n")
        except (OSError, ValueError):  # the reader has gone (or the file closed): the build goes on without it
            pass

    def close(self) -> None:
        try:
            self.events.close()
        except OSError:
            pass
        super().close()

    @property
    def writes_to_stream(self) -> bool:
        return False  # Snakemake's own text keeps its usual stream

    @property
    def writes_to_file(self) -> bool:
        return False  # not a log file Snakemake should name at the end

    @property
    def has_filter(self) -> bool:
        return True  # every event, whatever --quiet hides from the console

    @property
    def has_formatter(self) -> bool:
        return True  # the JSON above is the format

    @property
    def needs_rulegraph(self) -> bool:
        return False
