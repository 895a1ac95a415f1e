"""The MLflow store: where it is, its lock, and its creation and repair.

Several training jobs log to one local SQLite store at once; SQLite plus MLflow's SQLAlchemy
store is not safe for that (schema creation, experiment creation and writes race or fail with
"database is locked"), so every access to a local store holds an exclusive ``flock`` on
``<store>.lock`` (`store_lock`). Remote tracking servers serialise writes themselves and take no lock.

A kill must never leave a store that later jobs cannot use. MLflow creates its schema
through a series of migrations that SQLite cannot apply in one transaction, so a kill
in the middle leaves a half-migrated file. fedskew therefore builds a new store in a
sibling temporary file and renames it into place (`ensure_store`), and repairs a
half-migrated store it finds on a copy (or, when the store holds no runs, moves it
aside and starts afresh).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

from fedskew.tracking.reach import bound_http_retries
from fedskew.tracking.redaction import redacted  # noqa: F401 - its home before fedskew.tracking.redaction

log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "mlflow.db"
_NOISY_LOGGERS = ("alembic", "mlflow.store.db.utils", "mlflow.store.tracking.sqlalchemy_store")


# MLflow's own variables for a tracking server's credentials (basic auth; or a token).
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def tracking_uri(project_root: Path) -> str:
    """$MLFLOW_TRACKING_URI if set (e.g. a cluster's server), else a SQLite store in the project.

    Credentials written into the URI are moved to MLflow's credential variables first
    (`move_credentials_out_of_uri`), so that the URI fedskew and MLflow print holds none."""
    move_credentials_out_of_uri()
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(project_root).resolve() / DEFAULT_DB_NAME}"


def move_credentials_out_of_uri(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Take a user name and password out of $MLFLOW_TRACKING_URI into MLFLOW_TRACKING_USERNAME and
    MLFLOW_TRACKING_PASSWORD, where MLflow reads them for a server's basic auth; returns a warning for the user
    (which names neither), or None when the URI carried none.

    A URI is printed in many places (fedskew's messages, MLflow's "View run at" line in every job's log, a
    failed request's error), and a job inherits its environment, so a secret in the URI would reach the logs.
    Variables the user set already win over the URI's credentials, which are then dropped. Idempotent: the
    first fedskew process (`python -m fedskew`, the Snakefile) does it before it starts any job."""
    uri = environ.get("MLFLOW_TRACKING_URI", "")
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return None
    environ["MLFLOW_TRACKING_URI"] = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    given = {name: environ.get(name) for name in CREDENTIAL_VARIABLES}
    from_uri = dict(zip(CREDENTIAL_VARIABLES, (unquote(parts.username or ""), unquote(parts.password or ""))))
    if any(given.values()):
        return ("MLFLOW_TRACKING_URI carries credentials, and MLFLOW_TRACKING_USERNAME or MLFLOW_TRACKING_PASSWORD "
                "is set as well: fedskew uses the variables and has removed the URI's credentials, so that no log "
                "shows them")
    environ.update({name: value for name, value in from_uri.items() if value})
    return ("MLFLOW_TRACKING_URI carries credentials: fedskew has moved them to MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD, where MLflow reads them, so that no log shows them; set those variables (or "
            "MLFLOW_TRACKING_TOKEN) instead of writing credentials into the URI")


def local_store_path(uri: str) -> Path | None:
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
def store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive cross-process lock on a local store; no-op for remote servers."""
    store = local_store_path(uri)
    if store is None:
        yield
        return
    store = store.absolute()
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.with_name(store.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


class TrackingStoreError(RuntimeError):
    """A local store is damaged in a way fedskew will not repair by itself; the message says how."""


def sqlite_store_path(uri: str) -> Path | None:
    store = local_store_path(uri)
    return store.absolute() if store is not None and urlparse(uri).scheme == "sqlite" else None


def _store_problem(path: Path) -> str | None:
    """None when `path` is a complete MLflow store at this MLflow's schema, else what is wrong."""
    import sqlalchemy
    from mlflow.store.db import utils

    try:
        # Any read first rolls back a transaction that a kill left in <store>-journal.
        with contextlib.closing(sqlite3.connect(path)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as error:
        return f"SQLite cannot read it ({error})"
    if leftovers := sorted(t for t in tables if t.startswith("_alembic_tmp_")):
        return f"an interrupted schema migration left {', '.join(leftovers)}"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        if not utils._all_tables_exist(engine):  # MLflow's own test of a complete schema
            return "MLflow's tables are incomplete (an interrupted schema creation)"
        version, head = utils._get_schema_version(engine), utils._get_latest_schema_revision()
    finally:
        engine.dispose()
    return None if version == head else f"schema version {version}, but this MLflow needs {head}"


def _run_count(path: Path) -> int:
    """Runs recorded in a (possibly damaged) store; 0 when there is no readable runs table."""
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0


def _migrate(path: Path) -> None:
    """Create MLflow's schema in `path`, or finish a migration that was interrupted there."""
    import sqlalchemy
    from mlflow.store.db import utils

    with contextlib.closing(sqlite3.connect(path)) as db:
        # A batch migration copies table T to _alembic_tmp_T, drops T, then renames the copy:
        # a leftover copy is stale while T exists, and is T's only data once T was dropped.
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for leftover in sorted(t for t in tables if t.startswith("_alembic_tmp_")):
            original = leftover.removeprefix("_alembic_tmp_")
            db.execute(f'DROP TABLE "{leftover}"' if original in tables
                       else f'ALTER TABLE "{leftover}" RENAME TO "{original}"')
        db.commit()
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        if utils._is_empty_database(engine):
            utils._initialize_tables(engine)
        else:
            utils._upgrade_db(engine)
    finally:
        engine.dispose()


def _drop_pooled_connections(path: Path) -> None:
    """Close this process's pooled MLflow connections to `path`: they still point at the replaced file."""
    store_module = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    if store_module is None:
        return
    for engine in list(store_module.SqlAlchemyStore._engine_map.values()):
        if engine.url.database and Path(engine.url.database).absolute() == path:
            engine.dispose()  # the engine stays usable and opens new connections to the new file


def ensure_store(uri: str) -> None:
    """Make a local SQLite store complete and current, never leaving a half-written one behind.

    Call with the store lock held. A missing or empty store is created in a temporary
    sibling file and renamed into place, so a kill at any moment leaves either no store or
    a complete one. A damaged store without runs is moved aside and replaced; one with runs
    is repaired on a copy that replaces it only once it checks out. Remote servers and file
    stores are left to themselves.
    """
    path = sqlite_store_path(uri)
    if path is None:
        return
    for stale in path.parent.glob(f".{path.name}.init-*"):  # a killed initialisation's copy (we hold the lock)
        stale.unlink(missing_ok=True)
    existing = path.exists() and path.stat().st_size > 0  # SQLite reads an empty file as an empty database
    problem = _store_problem(path) if existing else None
    if existing and problem is None:
        return
    runs = _run_count(path) if existing else 0
    if existing:
        log.warning("MLflow store %s is damaged: %s; %s", path, problem,
                    "repairing a copy of it" if runs else "it holds no runs, so it is replaced by a new store")
    tmp = path.with_name(f".{path.name}.init-{os.getpid()}")
    try:
        if runs:
            shutil.copyfile(path, tmp)
        _migrate(tmp)
        if (left := _store_problem(tmp)) is not None:
            raise TrackingStoreError(left)
        if existing and not runs:
            aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            os.replace(path, aside)
            log.warning("moved the damaged store to %s", aside)
        os.replace(tmp, path)
        _drop_pooled_connections(path)
    except Exception as error:
        if not existing:
            raise TrackingStoreError(f"creating the MLflow store {path} failed: {error}") from error
        raise TrackingStoreError(
            f"MLflow store {path} is damaged ({problem}) and could not be repaired ({error}). It holds {runs} "
            f"run(s) and was left as it is. Back it up, then run `mlflow db upgrade sqlite:///{path}`, or move it "
            f"aside; the run files are intact and `python -m fedskew track --suite <suite>` logs them again."
        ) from error
    finally:
        tmp.unlink(missing_ok=True)


def import_mlflow(uri: str) -> type:
    """Import MLflow (and, for SQLite, its slow SQLAlchemy store) before taking the lock, so
    parallel writers spend their CPU-bound import time in parallel, not queued behind each other.
    Every process that talks to a tracking server comes here first: its HTTP retries are bounded from here on
    (fedskew.tracking.reach)."""
    bound_http_retries()
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    return MlflowClient


