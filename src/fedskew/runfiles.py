"""A run's files (config.yaml, history.csv, metrics.json): written atomically, read only if intact.

Tables, figures, the paper tables and the tracker all read a run through this module, so
none of them can build a number from a file that a crash, a disk error or a hand edit
changed. metrics.json is written last and vouches for the other two: it records their
sha256, and its own content carries a sha256 over everything else in it. A file that does
not match is refused with its path and the command that rebuilds it (training resumes
from the run's last checkpoint, so rebuilding a finished run costs no training).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from fedskew import paths
from fedskew.config import RunConfig, run_config_yaml

INTEGRITY_KEY = "integrity"  # {"config.yaml": sha256, "history.csv": sha256, "metrics": sha256}


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


def write_run_files(cfg: RunConfig, history: list[dict], final: dict, root: Path = Path(".")) -> list[Path]:
    """config.yaml, history.csv and metrics.json of a run; metrics.json last (it marks completion).

    Each file is whole or absent; when a write fails (OSError), the files this call wrote are removed again."""
    config_path, history_path, metrics_path = (root / cfg.path(p) for p in
                                               (paths.RUN_CONFIG, paths.RUN_HISTORY, paths.RUN_METRICS))
    config_text, history_text = run_config_yaml(cfg), history_csv(history)
    record = {"run_id": cfg.run_id, **cfg.keys, **final}
    record[INTEGRITY_KEY] = {"config.yaml": _sha256_text(config_text), "history.csv": _sha256_text(history_text),
                             "metrics": _sha256_text(_canonical(record))}
    written: list[Path] = []
    try:
        for path, text in ((config_path, config_text), (history_path, history_text),
                           (metrics_path, json.dumps(record, indent=2) + "\n")):
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


def read_metrics(cfg: RunConfig, root: Path = Path(".")) -> dict[str, Any]:
    """metrics.json of a finished run, after checking it and the files it vouches for.

    Returns the record without its integrity entry. Raises FileNotFoundError when the run
    has not been trained, RunFileError when any of its files does not match.
    """
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
    for name, template in (("config.yaml", paths.RUN_CONFIG), ("history.csv", paths.RUN_HISTORY)):
        other = root / cfg.path(template)
        try:
            digest = hashlib.sha256(other.read_bytes()).hexdigest()
        except OSError as error:
            raise _refuse(cfg, other, f"cannot be read ({error.strerror or error})") from None
        if digest != integrity.get(name):
            raise _refuse(cfg, other, f"does not match the sha256 recorded in {path.name} (altered or damaged)")
    return record


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


def read_history(cfg: RunConfig, root: Path = Path(".")) -> list[dict[str, Any]]:
    """history.csv of a finished run, verified against metrics.json; empty cells left out."""
    read_metrics(cfg, root)
    with open(root / cfg.path(paths.RUN_HISTORY), newline="") as handle:
        return [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]
