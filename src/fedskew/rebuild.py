"""Rebuild a suite's tables and prove it: are they identical to the committed ones?

Two ways, one comparison (`docs/design.md`, "Rebuilding and proving it"):

- `fedskew run` (`make run`) builds `run.suites` in place: Snakemake trains the runs that are
  missing or stale (all of them on a fresh clone, whose run files are DVC outputs and not in
  git), then rebuilds every table of those suites from the run files, then compares each table
  with the committed one. It leaves the project as `snakemake --cores all` would: a second
  `snakemake` has nothing to do.
- `fedskew verify --suite S` (`make verify SUITE=S`) trains the suite from its seeds in a
  scratch project under `.verify/S/` (the project's params.yaml, its verified raw data, nothing
  else) and compares the tables built there. It never writes into `results/`.
- `fedskew verify --suite S --method M... --seed N...` retrains only those runs, for a suite too long
  to retrain whole (FL-FCR's MNIST suite is a night on two cores). The scratch project takes the
  suite's committed runs (results/committed-runs/S/, or results/imported/S/), sets the chosen ones
  aside, trains them again from their seeds and compares each with its committed files: config.yaml
  and history.csv byte for byte, metrics.json without its provenance (which machine and commit
  trained it). The tables are then rebuilt from the retrained and the other committed runs.

The reference of the comparison is read before anything is built: the table as committed at
HEAD when it is tracked by git, else the file as it was before the build. So nothing committed
is overwritten before it has been compared, and a difference is reported cell by cell, never
silently replaced. Snakemake and DVC keep their own semantics: `make run` adds only a forced
re-aggregation (cheap) to what `snakemake --cores all` does.

Snakemake runs as a child process, its output going to `logs/rebuild/<suite...>.log` (job blocks
quieted). This module learns what it does from its job events, which a logger plugin of this project
writes as JSON lines into a pipe (src/snakemake_logger_plugin_fedskew), never from that text, and prints
one line per progress step and per finished run (its final accuracy).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import paths
from fedskew.config import Params

TABLE_EXTS = ("md", "csv", "tex", "json")
SCRATCH = Path(".verify")
LOG_DIR = Path("logs/rebuild")
# The figures of a table are rebuilt with it but not compared: a PNG's bytes depend on the
# matplotlib and libpng build, not on the numbers (the numbers are in the tables).


@dataclass(frozen=True)
class CellDiff:
    """One cell of a suite's table that differs: `key` is dataset/partition/method."""

    key: str
    field: str
    committed: float | None
    rebuilt: float | None

    def text(self) -> str:
        if self.committed is None or self.rebuilt is None:
            return f"{self.key} {self.field}: {_show(self.committed)} -> {_show(self.rebuilt)}"
        scale = 100.0 if "acc" in self.field else 1.0
        delta = (self.rebuilt - self.committed) * scale
        unit = " points" if scale == 100.0 else ""
        return (f"{self.key} {self.field}: {_show(self.committed, scale)} -> {_show(self.rebuilt, scale)} "
                f"({delta:+.4g}{unit})")


def _show(value: float | None, scale: float = 1.0) -> str:
    return "absent" if value is None else f"{value * scale:.6g}"


@dataclass
class TableCheck:
    """The comparison of one suite's four table files with their references."""

    suite: str
    reference: str  # "HEAD 1a2b3c4" or "the file before the build" or "none"
    differing_files: list[str] = field(default_factory=list)
    missing_reference: list[str] = field(default_factory=list)
    cells: list[CellDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differing_files and not self.missing_reference

    @property
    def differs(self) -> bool:
        """A table differs from its reference (a table with nothing to compare with does not differ: it is new)."""
        return bool(self.differing_files)

    def summary(self) -> str:
        if self.identical:
            return f"{self.suite}: identical to {self.reference}"
        parts = []
        if self.differing_files:
            what = f"{len(self.cells)} cell(s) differ" if self.cells else "the numbers agree, the text differs"
            parts.append(f"{', '.join(self.differing_files)} differ from {self.reference}: {what}")
        if self.missing_reference:
            parts.append(f"{', '.join(self.missing_reference)} new (nothing committed to compare with)")
        return f"{self.suite}: " + "; ".join(parts)


def table_files(suite: str, root: Path = Path(".")) -> dict[str, Path]:
    return {ext: root / paths.TABLE.format(suite=suite, ext=ext) for ext in TABLE_EXTS}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)


def read_references(suite: str, root: Path = Path(".")) -> tuple[str, dict[str, bytes | None]]:
    """Each table file of `suite` as committed at HEAD (when git tracks it), else as it is now.

    Read before a build, so that a rebuild cannot overwrite what it is compared with."""
    files = table_files(suite, root)
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        tracked = head.returncode == 0 and all(
            _git(root, "ls-files", "--error-unmatch", str(p.relative_to(root))).returncode == 0 for p in files.values())
    except (OSError, subprocess.SubprocessError):
        tracked = False
    if tracked:
        label = f"the committed tables (HEAD {head.stdout.decode().strip()})"
        blobs = {}
        for ext, path in files.items():
            shown = _git(root, "show", f"HEAD:{path.relative_to(root).as_posix()}")
            blobs[ext] = shown.stdout if shown.returncode == 0 else None
        return label, blobs
    present = {ext: (path.read_bytes() if path.exists() else None) for ext, path in files.items()}
    label = "the tables as they were before the build" if any(present.values()) else "nothing (no earlier tables)"
    return label, present


def cell_differences(committed_json: bytes, rebuilt_json: bytes) -> list[CellDiff]:
    """The numbers that differ between two `<suite>.json` tables, cell by cell (exact comparison)."""
    try:
        committed, rebuilt = json.loads(committed_json), json.loads(rebuilt_json)
    except ValueError:
        return []
    cells = []
    for key in sorted(set(committed) | set(rebuilt)):
        old, new = committed.get(key, {}), rebuilt.get(key, {})
        for name in sorted(set(old) | set(new), key=_field_order):
            a, b = old.get(name), new.get(name)
            if a != b and not (_is_nan(a) and _is_nan(b)):
                cells.append(CellDiff(key, name, a, b))
    return cells


def _field_order(name: str) -> tuple[int, str]:
    return (0 if name.startswith("final_acc") else 1, name)


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare(suite: str, built_root: Path, reference_label: str, references: dict[str, bytes | None]) -> TableCheck:
    """Compare the table files built under `built_root` with `references` (read by `read_references`)."""
    check = TableCheck(suite, reference_label)
    built = {ext: path.read_bytes() for ext, path in table_files(suite, built_root).items()}
    for ext in TABLE_EXTS:
        name = f"{suite}.{ext}"
        if references.get(ext) is None:
            check.missing_reference.append(name)
        elif references[ext] != built[ext]:
            check.differing_files.append(name)
    if references.get("json") is not None and references["json"] != built["json"]:
        check.cells = cell_differences(references["json"], built["json"])
    return check


def closing_line(checks: list[TableCheck], how: str) -> str:
    """The one line a rebuild ends with."""
    tables = len(checks) * len(TABLE_EXTS)
    if all(c.identical for c in checks):
        suites = ", ".join(c.suite for c in checks)
        return f"fedskew: {how} {suites}: all {tables} tables are identical, byte for byte, to {checks[0].reference}."
    bad = [c for c in checks if not c.identical]
    verdict = (f"{sum(c.differs for c in checks)} of {len(checks)} suite(s) differ" if any(c.differs for c in checks)
               else "no table differs, but not every table had a committed one")
    return f"fedskew: {how}: {verdict}: " + " | ".join(c.summary() for c in bad)


def report(checks: list[TableCheck], how: str, max_cells: int = 40) -> str:
    """The cells that differ (at most `max_cells` per suite), then the closing line."""
    lines = []
    for check in checks:
        for cell in check.cells[:max_cells]:
            lines.append(f"  {check.suite}: {cell.text()}")
        if len(check.cells) > max_cells:
            lines.append(f"  {check.suite}: ... and {len(check.cells) - max_cells} more (compare the .json tables)")
    lines.append(closing_line(checks, how))
    return "\n".join(lines)


# ---- running Snakemake with a readable progress ------------------------------------------------

class Progress:
    """Follows a build through Snakemake's job events (`EVENTS_LOGGER`, one JSON object a line) and prints a
    short line for each progress step, for each of `runs` whose training job has finished (method, setting,
    seed, final accuracy), and for each failed job and workflow error.

    A run is reported when a job that has it among its outputs finishes, so runs already up to date are not."""

    def __init__(self, runs: list, root: Path, out=sys.stdout):
        self.runs = {cfg.path(paths.RUN_METRICS).as_posix(): cfg for cfg in runs}
        self.root = root
        self.outputs: dict[int, list[str]] = {}  # each started job's output files, by job id
        self.out = out
        self.started = time.time()

    def feed(self, line: str) -> None:
        """One line of the events file. A line that is not an event is skipped: the build must go on."""
        try:
            event = json.loads(line)
        except ValueError:
            return
        if isinstance(event, dict):
            self.handle(event)

    def handle(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "job_info":
            self.outputs[event.get("jobid")] = event.get("output") or []
        elif kind == "job_finished":
            self.report_trained(self.outputs.pop(event.get("job_id"), []))
        elif kind == "progress":
            done, total = event["done"], event["total"]
            self._print(f"[{time.time() - self.started:5.0f} s] {done} of {total} steps "
                        f"({100 * done // max(total, 1)}%) done")
        elif kind == "job_error":
            logs = ", ".join(event.get("log") or [])
            self._print(f"Error in rule {event.get('rule_name')}, jobid {event.get('jobid')}"
                        + (f"; its log: {logs}" if logs else ""))
        elif kind == "error":  # its opening: the rest is in the end of Snakemake's output, shown on failure
            lines = [text.strip() for text in str(event.get("message") or event.get("exception")).splitlines()]
            lines = [text for text in lines if text] or ["(no message)"]
            self._print(" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])  # "WorkflowError:" says little

    def report_trained(self, outputs: list[str]) -> None:
        for cfg in [self.runs.pop(path) for path in outputs if path in self.runs]:
            try:
                record = json.loads((self.root / cfg.path(paths.RUN_METRICS)).read_text())
                accuracy = f"{record['final_acc'] * 100:.2f} %"
            except (OSError, ValueError, KeyError, TypeError):
                accuracy = "(metrics unreadable)"
            self._print(f"  trained {cfg.method} on {cfg.dataset}/{cfg.partition} seed {cfg.seed}: "
                        f"final accuracy {accuracy}")

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)


# The logger plugin that writes Snakemake's job events as JSON lines (src/snakemake_logger_plugin_fedskew;
# Snakemake finds it on the Python path, which _snakemake_env gives src/).
EVENTS_LOGGER = "fedskew"


# How long Snakemake may take to stop its jobs after a stop was forwarded, before its process group is killed.
STOP_GRACE_S = 120.0


class _StopForwarding:
    """While Snakemake runs as a child in its own process group, SIGINT and SIGTERM to this process stop it.

    Either signal is forwarded to the child's process group as SIGINT: Snakemake's Ctrl-C, on which it
    cancels its running jobs (local ones, which are in its group and stop on SIGINT too, keeping their
    checkpoints; cluster jobs, which it cancels through their executor), marks their outputs incomplete
    and releases its lock. (Snakemake takes SIGTERM as "finish the running jobs first", which can take
    hours.) A second signal, or STOP_GRACE_S without an exit, kills the group. Once the child has ended,
    the caller re-raises the signal in this process (`reraise`), so that it stops as it would have.

    The handlers are installed before the child starts: a signal this process inherited as ignored (a
    background job of a script ignores SIGINT) would otherwise stay ignored in Snakemake and its jobs, while
    a signal with a handler here starts with its default action there.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.signal: int | None = None
        self._killer: threading.Timer | None = None

    def __enter__(self) -> _StopForwarding:
        self._previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def attach(self, child: subprocess.Popen) -> None:
        self.child = child
        if self.signal is not None:  # it came while the child was starting
            self._stop()

    def _forward(self, signum: int, frame: object) -> None:
        if self.signal is None:
            self.signal = signum
            if self.child is not None:
                self._stop()
        else:
            self._send(signal.SIGKILL)

    def _stop(self) -> None:
        self._send(signal.SIGINT)
        self._killer = threading.Timer(STOP_GRACE_S, self._send, (signal.SIGKILL,))
        self._killer.daemon = True
        self._killer.start()

    def _send(self, signum: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    def __exit__(self, *exc: object) -> None:
        if self._killer is not None:
            self._killer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def reraise(self) -> None:
        """Raise the signal that stopped the build in this process, as its handler here takes it (an exception
        under fedskew's CLI); where that signal is ignored, a KeyboardInterrupt, since the build did stop."""
        if self.signal is None:
            return
        if self._previous[self.signal] == signal.SIG_IGN:
            raise KeyboardInterrupt
        signal.raise_signal(self.signal)


def run_snakemake(args: list[str], *, cwd: Path, runs: list, log_path: Path, env: dict | None = None) -> int:
    """`snakemake <args>` in `cwd`; returns its exit code. Snakemake's output (job blocks quieted) goes to
    `log_path` (and, when it fails, its last lines to stderr); its job events to `Progress`.

    `--rerun-incomplete`: a run whose job was stopped (a forwarded stop, a kill, a pre-empted node) is
    trained again by the next build, resuming from its checkpoint, instead of stopping that build.
    SIGINT or SIGTERM stops Snakemake and its jobs first (`_StopForwarding`), then this process."""
    events_in, events_out = os.pipe()  # Snakemake's job events, through the logger plugin
    command = [sys.executable, "-m", "snakemake", "--quiet", "rules", "host", "reason", "--rerun-incomplete",
               "--logger", EVENTS_LOGGER, f"--logger-{EVENTS_LOGGER}-events-file", f"/dev/fd/{events_out}", *args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(runs, cwd)
    with open(log_path, "a") as log, open(events_in, encoding="utf-8") as events, _StopForwarding() as stop:
        log.write(f"$ {' '.join(command)}   (in {cwd})\n")
        log.flush()
        output_start = log.tell()
        try:
            child = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     pass_fds=(events_out,), start_new_session=True)
        finally:
            os.close(events_out)  # Snakemake holds the only writing end now: the events end when it does
        with child:
            stop.attach(child)
            for line in events:
                progress.feed(line)
            code = child.wait()
    if stop.signal is not None:
        print(f"fedskew: stopped by {signal.Signals(stop.signal).name}: Snakemake and its jobs have ended (exit "
              f"{code}); its output is in {log_path}. A stopped training job keeps its checkpoint: building again "
              "resumes it", file=sys.stderr, flush=True)
        stop.reraise()
    if code != 0:
        with open(log_path, errors="replace") as log:
            log.seek(output_start)
            print("\n".join(log.read().splitlines()[-40:]), file=sys.stderr)
        print(f"fedskew: snakemake failed (exit {code}); its whole output is in {log_path}", file=sys.stderr)
    return code


def _snakemake_env() -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run_in_place(params: Params, suites: list[str], root: Path = Path("."), cores: str = "all") -> tuple[int, str]:
    """`make run`: train what is missing, rebuild the suites' tables from the run files, compare.
    Returns (exit code, closing report)."""
    references = {suite: read_references(suite, root) for suite in suites}
    runs = params.runs(suites)
    log_path = root / LOG_DIR / f"{'+'.join(suites)}.log"
    log_path.unlink(missing_ok=True)
    print(f"fedskew: building {', '.join(suites)} ({len(runs)} runs; Snakemake's output: {log_path})", flush=True)
    env = _snakemake_env()
    trained = [str(cfg.path(paths.RUN_METRICS)) for cfg in runs]
    code = run_snakemake(["--cores", cores, *trained], cwd=root, runs=runs, log_path=log_path, env=env)
    if code == 0:
        tables = [str(paths.TABLE.format(suite=s, ext="md")) for s in suites]
        code = run_snakemake(["--cores", cores, "--forcerun", "aggregate", "--", *tables], cwd=root, runs=[],
                             log_path=log_path, env=env)
    if code != 0:
        return code, f"fedskew: the build failed; nothing was compared (see {log_path})"
    checks = [compare(s, root, *references[s]) for s in suites]
    return (1 if any(c.differs for c in checks) else 0), report(checks, "rebuilt")


def reproduce(params: Params, root: Path = Path("."), cores: str = "all") -> int:
    """`make reproduce`: `snakemake results/claims.md` (the suites of reproduce.suites trained, those of
    reproduce.imported imported, the papers' tables and the ledger written), stopped with its jobs on SIGINT or
    SIGTERM. Returns Snakemake's exit code."""
    runs = params.runs(params.reproduce_suites) if params.reproduce_suites else []
    log_path = root / LOG_DIR / "reproduce.log"
    print(f"fedskew: reproducing the papers' tables ({len(runs)} runs to train or reuse; Snakemake's output: "
          f"{log_path})", flush=True)
    code = run_snakemake(["--cores", cores, paths.CLAIMS.format(ext="md")], cwd=root, runs=runs, log_path=log_path,
                         env=_snakemake_env())
    if code == 0:
        print(f"fedskew: wrote {paths.CLAIMS.format(ext='md')} and the papers' tables in results/papers/", flush=True)
    return code


def _scratch_project(suite: str, root: Path) -> tuple[Path, Path]:
    """An empty project in `.verify/<suite>/` (params.yaml, the raw data linked) and its emptied log file."""
    scratch = (root / SCRATCH / suite).resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "data").mkdir(parents=True)
    shutil.copy2(root / "params.yaml", scratch / "params.yaml")
    raw = (root / "data" / "raw").resolve()
    raw.mkdir(parents=True, exist_ok=True)
    # Raw data is verified by its checksums wherever it came from; sharing it saves a download.
    # Partitions, runs and tables are made afresh from the seeds.
    os.symlink(raw, scratch / "data" / "raw")
    log_path = (root / LOG_DIR / f"verify-{suite}.log").resolve()
    log_path.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return scratch, log_path


def verify_in_scratch(params: Params, suite: str, root: Path = Path("."), cores: str = "all",
                      keep: bool = False, methods: list[str] | None = None,
                      seeds: list[int] | None = None) -> tuple[int, str]:
    """`make verify SUITE=...`: train `suite` from its seeds in `.verify/<suite>/` and compare its tables.
    With `methods` or `seeds`, retrain only those runs beside the suite's committed ones (module docstring)."""
    if methods or seeds:
        return _verify_some_runs(params, suite, root, cores, keep, select_runs(params, suite, methods, seeds))
    label, references = read_references(suite, root)
    scratch, log_path = _scratch_project(suite, root)
    runs = params.runs([suite])
    print(f"fedskew: rebuilding {suite} from its seeds in {scratch} ({len(runs)} runs; Snakemake's output: "
          f"{log_path})", flush=True)
    env = {**_snakemake_env(), "FEDSKEW_TRACKING": "0"}  # a check, not a result: the MLflow store stays as it is
    snakefile = (root / "workflow" / "Snakefile").resolve()
    code = run_snakemake(["--snakefile", str(snakefile), "--directory", str(scratch), "--cores", cores,
                          paths.TABLE.format(suite=suite, ext="md")], cwd=scratch, runs=runs, log_path=log_path,
                         env=env)
    if code != 0:
        return code, (f"fedskew: rebuilding {suite} failed; nothing was compared (see {log_path}; "
                      f"the scratch project is kept in {scratch})")
    check = compare(suite, scratch, label, references)
    if check.identical and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    elif not check.identical:
        print(f"fedskew: the rebuilt tables are kept in {scratch / 'results' / 'tables'}", flush=True)
    return (1 if check.differs else 0), report([check], "rebuilt from the seeds")


# ---- retraining some of a suite's runs beside its committed ones -------------------------------

COMPARED_RUN_FILES = ("config.yaml", "history.csv", "metrics.json")
NOT_COMPARED_METRICS = ("provenance", "integrity")  # which machine and commit; the digests that cover it


def committed_archives(params: Params, suite: str, root: Path = Path(".")) -> list[Path]:
    """The archives of a suite's committed runs (results/committed-runs/README.md)."""
    folder = paths.IMPORTED_ARCHIVES if suite in params.imported_suites else paths.COMMITTED_RUNS
    return sorted((root / folder.format(suite=suite)).glob("*.tar.gz"))


def select_runs(params: Params, suite: str, methods: list[str] | None, seeds: list[int] | None) -> list:
    """The runs of `suite` with one of `methods` and one of `seeds` (each, when not given: all)."""
    from fedskew.config import ConfigError, suggestion

    body = params.raw["suites"][suite]
    for method in methods or []:
        if method not in body["methods"]:
            raise ConfigError(f"--method {method!r} is not a method of suite {suite!r}"
                              f"{suggestion(method, body['methods'])}; its methods: {', '.join(body['methods'])}")
    for seed in seeds or []:
        if seed not in body["seeds"]:
            raise ConfigError(f"--seed {seed} is not a seed of suite {suite!r}; its seeds: "
                              f"{', '.join(map(str, body['seeds']))}")
    return [cfg for cfg in params.runs([suite])
            if (not methods or cfg.method in methods) and (not seeds or cfg.seed in seeds)]


def run_file_differences(committed: Path, retrained: Path) -> list[str]:
    """The files of one run that differ: config.yaml and history.csv byte for byte, metrics.json
    without `NOT_COMPARED_METRICS`. Empty when the run rebuilt."""
    differing = []
    for name in COMPARED_RUN_FILES:
        old, new = (folder / name for folder in (committed, retrained))
        if not new.exists():
            differing.append(f"{name} (not written)")
        elif name == "metrics.json":
            old_record, new_record = (json.loads(p.read_text()) for p in (old, new))
            for record in (old_record, new_record):
                for key in NOT_COMPARED_METRICS:
                    record.pop(key, None)
            if old_record != new_record:
                keys = sorted(k for k in old_record.keys() | new_record.keys()
                              if old_record.get(k) != new_record.get(k))
                differing.append(f"metrics.json ({', '.join(keys)})")
        elif old.read_bytes() != new.read_bytes():
            differing.append(name)
    return differing


def _fedskew(args: list[str], scratch: Path, env: dict, log_path: Path) -> int:
    """`python -m fedskew <args>` in the scratch project, its output appended to the log."""
    with open(log_path, "a") as log:
        log.write(f"$ fedskew {' '.join(args)}   (in {scratch})\n")
        log.flush()
        return subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=scratch, env=env, stdout=log,
                              stderr=subprocess.STDOUT).returncode


def _verify_some_runs(params: Params, suite: str, root: Path, cores: str, keep: bool,
                      selected: list) -> tuple[int, str]:
    from fedskew.config import ConfigError

    archives = committed_archives(params, suite, root)
    if not archives:
        raise ConfigError(f"suite {suite!r} has no committed runs to compare with (results/committed-runs/{suite}/ "
                          f"holds no archive): verify it whole, without --method and --seed")
    label, references = read_references(suite, root)
    scratch, log_path = _scratch_project(suite, root)
    env = {**_snakemake_env(), "FEDSKEW_TRACKING": "0"}
    kept = f"the scratch project is kept in {scratch}"
    if _fedskew(["packed", "import", *map(str, (a.resolve() for a in archives))], scratch, env, log_path) != 0:
        return 1, f"fedskew: importing the committed runs of {suite} failed; nothing was compared (see {log_path})"
    committed = scratch / "committed"
    for cfg in selected:
        if not (scratch / cfg.path(paths.RUN_METRICS)).exists():
            raise ConfigError(f"{cfg.path(paths.RUN_DIR)} is not among the committed runs of {suite}; "
                              f"retrain it with `make verify SUITE={suite}` or commit it first")
        target = committed / cfg.path(paths.RUN_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        (scratch / cfg.path(paths.RUN_DIR)).rename(target)
    print(f"fedskew: retraining {len(selected)} of {len(params.runs([suite]))} runs of {suite} from their seeds in "
          f"{scratch}, beside its committed runs (Snakemake's output: {log_path})", flush=True)
    snakefile = (root / "workflow" / "Snakefile").resolve()
    code = run_snakemake(["--snakefile", str(snakefile), "--directory", str(scratch), "--cores", cores,
                          *(str(cfg.path(paths.RUN_METRICS)) for cfg in selected)], cwd=scratch, runs=selected,
                         log_path=log_path, env=env)
    if code != 0:
        return code, f"fedskew: retraining runs of {suite} failed; nothing was compared (see {log_path}; {kept})"
    differing = {}
    for cfg in selected:
        run_dir = cfg.path(paths.RUN_DIR)
        if diff := run_file_differences(committed / run_dir, scratch / run_dir):
            differing[run_dir.as_posix()] = diff
    if _fedskew(["aggregate", "--suite", suite], scratch, env, log_path) != 0:
        return 1, f"fedskew: rebuilding the tables of {suite} failed (see {log_path}; {kept})"
    check = compare(suite, scratch, label, references)
    lines = [f"  {run}: {', '.join(diff)}" for run, diff in differing.items()]
    lines.append(f"fedskew: retrained {len(selected)} runs of {suite}: " +
                 (f"{len(differing)} differ from their committed runs" if differing else
                  "each identical to its committed run (config.yaml and history.csv byte for byte, metrics.json "
                  "but for its provenance)") + ".")
    if check.identical and not differing and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    elif differing or not check.identical:
        print(f"fedskew: {kept}; the committed runs set aside are in {committed}", flush=True)
    return (1 if check.differs or differing else 0), "\n".join(lines) + "\n" + report(
        [check], "rebuilt with those runs retrained")
