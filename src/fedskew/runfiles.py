"""A run's files (config.yaml, history.csv, metrics.json): written atomically, read only if intact.

Tables, figures, the paper tables and the tracker all read a run through this module, so
none of them can build a number from a file that a crash, a disk error or a hand edit
changed. metrics.json is written last and vouches for the other two: it records their
sha256, and its own content carries a sha256 over everything else in it. A file that does
not match is refused with its path and the command that rebuilds it (training resumes
from the run's last checkpoint, so rebuilding a finished run costs no training).

Matching hashes say only that fedskew wrote the bytes, or someone who knows the format. So a finished run's
numbers are checked too, before any table uses them: each summary value and each history value of a
registered metric is a number in the metric's range (fedskew.metrics), and the number tables report is there.
A diverged run is a result whose numbers are null (fedskew.engine.summary): every table counts it apart.
The writer applies the same checks, so that fedskew never writes a run file its own reader refuses, and
metrics.json is strict JSON (no bare NaN).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedskew import metrics, paths
from fedskew.config import RunConfig, run_config_yaml
from fedskew.metrics import Statistic

INTEGRITY_KEY = "integrity"  # {"config.yaml": sha256, "history.csv": sha256, "metrics": sha256}
STATUSES = ("finished", "diverged")  # metrics.json's `status` (a record without one is a finished run's)
ROUND_KEYS = ("final_round", "best_round")  # a finished run's rounds in metrics.json


class RunFileError(RuntimeError):
    """A run file is missing, altered or unreadable; the message names it and how to rebuild it."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to a sibling temporary, flush it to disk, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when writing failed


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def history_csv(history: list[dict]) -> str:
    """history.csv's text: one row per round; floats as repr so reading them back is exact."""
    columns = list(dict.fromkeys(key for row in history for key in row)) or ["round"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()} for row in history)
    return buffer.getvalue()


def _summary_values() -> list[tuple[str, metrics.Metric]]:
    """(metrics.json key, its metric) of every summary value the registry defines: final_acc, best_acc, ..."""
    return [(m.key(s), m) for s in Statistic for m in metrics.summarised(s)]


def record_problem(record: dict[str, Any], complete: bool = True) -> str | None:
    """Why a run's summary (metrics.json without its hashes) cannot feed a table, or None when it can.

    A finished run's summary values are numbers in their metrics' ranges and its rounds are round numbers; with
    `complete`, it has the number tables report (a cell counts its seeds by the runs that finished). A diverged
    run's numbers are not read: every table counts it apart."""
    status = record.get("status", "finished")
    if status not in STATUSES:
        return f"status {status!r} is neither {' nor '.join(map(repr, STATUSES))}"
    if status == "diverged":
        return None
    reported = metrics.reported_key()
    if complete and reported not in record:
        return f"a finished run without {reported}, the number tables report"
    for key, metric in _summary_values():
        if key in record and (problem := metric.problem(record[key])) is not None:
            return f"{key} {problem}, which no table can use"
    for key in ROUND_KEYS:
        value = record.get(key)
        if key in record and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"{key} is {value!r}, not a round number"
    return None


def history_problem(rows: Iterable[dict[str, Any]]) -> str | None:
    """Why a finished run's history cannot feed a table or figure, or None: each value of a registered metric's
    column (test_acc, test_acc_class3, bytes_up, ...) is a number in the metric's range."""
    columns: dict[str, metrics.Metric | None] = {}
    for row in rows:
        for column, value in row.items():
            if column not in columns:
                columns[column] = next((m for m in metrics.METRICS if m.has_column(column)), None)
            metric = columns[column]
            if metric is not None and (problem := metric.problem(value)) is not None:
                return f"round {row.get('round')}: {column} {problem}, which no table can use"
    return None


def _as_recorded(path: Path, history: list[dict], record: dict[str, Any]) -> dict[str, Any]:
    """The record metrics.json stores, after the reader's checks: a diverged run's non-finite summary values
    as null (the run has none; fedskew.engine.summary writes null), a finished run with a number no table could
    use refused (a RunFileError: nothing is written, and the run's checkpoint stays)."""
    if record.get("status") == "diverged":
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    problem = record_problem(record, complete=False) or history_problem(history)
    if problem is not None:
        raise RunFileError(f"{path}: {problem}; nothing is written (the run's checkpoint stays): the evaluation "
                           "gave a number no table can use, so check the method's hyperparameters or training.lr")
    return record


def write_run_files(cfg: RunConfig, history: list[dict], final: dict, root: Path = Path(".")) -> list[Path]:
    """config.yaml, history.csv and metrics.json of a run; metrics.json last (it marks completion).

    Each file is whole or absent; when a write fails (OSError), the files this call wrote are removed again. A
    finished run with a number the reader would refuse is not written (RunFileError)."""
    config_path, history_path, metrics_path = (root / cfg.path(p) for p in
                                               (paths.RUN_CONFIG, paths.RUN_HISTORY, paths.RUN_METRICS))
    config_text, history_text = run_config_yaml(cfg), history_csv(history)
    record = _as_recorded(metrics_path, history, {"run_id": cfg.run_id, **cfg.keys, **final})
    record[INTEGRITY_KEY] = {"config.yaml": _sha256_text(config_text), "history.csv": _sha256_text(history_text),
                             "metrics": _sha256_text(_canonical(record))}
    written: list[Path] = []
    try:
        for path, text in ((config_path, config_text), (history_path, history_text),
                           (metrics_path, json.dumps(record, indent=2, allow_nan=False) + "\n")):
            atomic_write_text(path, text)
            written.append(path)
    except OSError:
        # A full disk or a read-only folder part way: take back what this call wrote, so the run folder
        # never holds a config.yaml or history.csv that no metrics.json vouches for.
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    return written


def rebuild_hint(cfg: RunConfig) -> str:
    return (f"rebuild it with `snakemake --cores 1 --force {cfg.path(paths.RUN_METRICS)}` "
            f"(training resumes from the run's last checkpoint)")


def _refuse(cfg: RunConfig, path: Path, problem: str) -> RunFileError:
    return RunFileError(f"{path}: {problem}; {rebuild_hint(cfg)}")


# A history.csv's sha256 -> its `history_problem`: bytes this process has checked are not parsed again to check
# them (the claims ledger reads a run once for each cell and protocol that shows it, thousands of reads in all).
_HISTORY_VERDICTS: dict[str, str | None] = {}


def _vouched(cfg: RunConfig, root: Path, integrity: dict, path: Path) -> dict[str, bytes]:
    """config.yaml's and history.csv's bytes, each matching the sha256 metrics.json (`path`) records for it."""
    vouched: dict[str, bytes] = {}
    for name, template in (("config.yaml", paths.RUN_CONFIG), ("history.csv", paths.RUN_HISTORY)):
        other = root / cfg.path(template)
        try:
            vouched[name] = other.read_bytes()
        except OSError as error:
            raise _refuse(cfg, other, f"cannot be read ({error.strerror or error})") from None
        if hashlib.sha256(vouched[name]).hexdigest() != integrity.get(name):
            raise _refuse(cfg, other, f"does not match the sha256 recorded in {path.name} (altered or damaged)")
    return vouched


def _read_run(cfg: RunConfig, root: Path, rows_wanted: bool) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """A finished run's metrics.json record (without its integrity entry) and, when `rows_wanted`, its history.csv
    rows, after checking both files and config.yaml against the hashes metrics.json records, then their numbers
    (`record_problem`, and `history_problem` for a run that did not diverge), the history parsed from the bytes
    just hashed."""
    path = root / cfg.path(paths.RUN_METRICS)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: train the run first "
                                f"(`snakemake --cores all {cfg.path(paths.RUN_METRICS)}`)")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _refuse(cfg, path, f"not readable JSON ({error})") from None
    integrity = record.pop(INTEGRITY_KEY, None) if isinstance(record, dict) else None
    if not isinstance(integrity, dict):
        raise _refuse(cfg, path, "it records no integrity hashes (written by an older fedskew, or not by fedskew)")
    if integrity.get("metrics") != _sha256_text(_canonical(record)):
        raise _refuse(cfg, path, "its content does not match its recorded sha256 (altered or damaged)")
    if record.get("run_id") != cfg.run_id:
        raise _refuse(cfg, path, f"it belongs to run {record.get('run_id')}, not to this configuration's "
                                 f"run {cfg.run_id}")
    content = _vouched(cfg, root, integrity, path)["history.csv"]
    problem = record_problem(record)
    if problem is not None:
        raise _refuse(cfg, path, problem)
    history_path = root / cfg.path(paths.RUN_HISTORY)
    rows = _history_rows(cfg, history_path, content) if rows_wanted else None
    if record.get("status") != "diverged":   # no table reads a diverged run's numbers
        digest = integrity["history.csv"]
        if digest not in _HISTORY_VERDICTS:
            parsed = rows if rows is not None else _history_rows(cfg, history_path, content)
            _HISTORY_VERDICTS[digest] = history_problem(parsed)
        if (problem := _HISTORY_VERDICTS[digest]) is not None:
            raise _refuse(cfg, history_path, problem)
    return record, rows


def read_metrics(cfg: RunConfig, root: Path = Path(".")) -> dict[str, Any]:
    """metrics.json of a finished run, after checking it and the files it vouches for.

    Returns the record without its integrity entry. Raises FileNotFoundError when the run
    has not been trained, RunFileError when any of its files does not match, or when the
    run holds a number no table can use (`record_problem`, `history_problem`): whatever a
    consumer reads of a run, the whole run has passed.
    """
    return _read_run(cfg, root, rows_wanted=False)[0]


def recorded_run_id(cfg: RunConfig, root: Path = Path(".")) -> str | None:
    """The run id a run's metrics.json was written for, unchecked (None when it is absent or unreadable): to tell
    an out-of-date run (another id) from the run of this configuration before reading it (read_metrics)."""
    try:
        record = json.loads((root / cfg.path(paths.RUN_METRICS)).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record.get("run_id") if isinstance(record, dict) else None


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _history_rows(cfg: RunConfig, path: Path, content: bytes) -> list[dict[str, Any]]:
    """history.csv's rows from its bytes, numbers parsed, empty cells left out."""
    try:
        text = content.decode()
    except UnicodeDecodeError as error:
        raise _refuse(cfg, path, f"not readable text ({error})") from None
    return [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(io.StringIO(text))]


def read_history(cfg: RunConfig, root: Path = Path(".")) -> list[dict[str, Any]]:
    """history.csv of a finished run, verified against metrics.json and checked as read_metrics checks it;
    empty cells left out."""
    return _read_run(cfg, root, rows_wanted=True)[1] or []


def check_runs(runs: Iterable[RunConfig], root: Path = Path(".")) -> None:
    """Read and check every run's files before a command writes anything from them, so that its tables and
    figures are written from all of them or not at all: the first run that fails raises its RunFileError (a
    FileNotFoundError for one not trained)."""
    for cfg in runs:
        _read_run(cfg, root, rows_wanted=False)
