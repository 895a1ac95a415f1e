"""No secret of the tracking URI in any output: what fedskew prints, logs or raises, and what MLflow, urllib3 and
Python itself print in a fedskew process.

A tracking URI can carry secrets in four places: its user name and password (`https://ana:pw@host`, which
fedskew.tracking.store moves to MLflow's credential variables before anything runs), its query
(`?access_token=...`) and its fragment. MLflow builds every request's URL by appending the endpoint to the URI,
query and fragment included, and that URL is in urllib3's retry warnings, in MLflow's errors and in its "View run"
line. So:

- `redact_uri` is the form of a tracking URI that fedskew prints: user-info, query and fragment shown as `***`;
  `server_address` is the part a browser opens (no user-info, query or fragment), for links;
- `redacted` cleans any text: the user-info of every URL in it, and every literal secret of the configured tracking
  URI and of MLflow's credential variables, wherever it appears (urllib3 prints a request's path and query alone,
  without the scheme that would mark it as a URL);
- `install` applies `redacted` to every log record of the process (MLflow's own handler included), to Python's
  warnings and to an uncaught exception's traceback. `python -m fedskew` and the tracking worker install it first.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Mapping
from functools import lru_cache
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

MASK = "***"
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]*@")
# Where the secrets are: the tracking URI, and MLflow's credential variables (basic auth; a bearer token).
SECRET_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# A secret shorter than this is not searched for as a literal: it would erase ordinary words from every message
# (a user name `ana`), and a secret that short protects nothing. URLs' user-info is masked whatever its length.
MIN_LITERAL_LEN = 4


def redact_uri(uri: str) -> str:
    """`uri` as fedskew prints it: user-info, query and fragment replaced by *** (a path and port stay)."""
    parts = urlsplit(uri)
    if not parts.scheme or not parts.netloc:
        return uri  # a local store's path (sqlite:////a/b.db) or a plain folder: nothing there is a secret
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{MASK}@{host}" if "@" in parts.netloc else host
    return urlunsplit((parts.scheme, netloc, parts.path, MASK if parts.query else "", MASK if parts.fragment else ""))


def server_address(uri: str) -> str:
    """The tracking server's address without user-info, query or fragment (what a browser opens), no final /."""
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")).rstrip("/")


def _variants(secret: str) -> set[str]:
    """A secret as it may be printed: as written, decoded, and percent-encoded as a request's URL has it."""
    found = {secret, unquote(secret), quote(unquote(secret), safe=""), quote(unquote(secret), safe="=&")}
    return {s for s in found if len(s) >= MIN_LITERAL_LEN}


@lru_cache(maxsize=8)
def _secrets(uri: str, variables: tuple[str, ...]) -> tuple[str, ...]:
    parts = urlsplit(uri)
    found = {*variables, parts.query, parts.fragment, parts.username or "", parts.password or ""}
    found |= {value for _, value in parse_qsl(parts.query, keep_blank_values=True)}
    literals = set().union(*(_variants(s) for s in found if s))
    return tuple(sorted(literals, key=len, reverse=True))  # the longest first: a part never hides its whole


def secrets(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The literal secrets to mask: the tracking URI's user-info, query (whole and each value) and fragment, and
    the values of MLflow's credential variables."""
    return _secrets(environ.get("MLFLOW_TRACKING_URI", ""), tuple(environ.get(v, "") for v in SECRET_VARIABLES))


def redacted(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """`text` with every URL's user name and password replaced by ***, and every secret of the tracking URI and of
    MLflow's credential variables (`secrets`) too."""
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    for secret in secrets(environ):
        text = text.replace(secret, MASK)
    return text


def _redacted_record(record: logging.LogRecord) -> logging.LogRecord:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed logging call: logging reports it when it formats the record
        return record
    clean = redacted(message)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        record.exc_text = redacted("".join(traceback.format_exception(*record.exc_info))).rstrip("\n")
    if record.stack_info:
        record.stack_info = redacted(record.stack_info)
    return record


def install() -> None:
    """Redact every log record this process makes (whichever logger and handler: MLflow has its own), every
    warning Python prints and an uncaught exception's traceback. Idempotent."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacting", False):
        return

    def redacting_factory(*args, **kwargs) -> logging.LogRecord:
        return _redacted_record(factory(*args, **kwargs))

    redacting_factory.redacting = True
    logging.setLogRecordFactory(redacting_factory)
    format_warning = warnings.formatwarning
    warnings.formatwarning = lambda *args, **kwargs: redacted(format_warning(*args, **kwargs))

    def excepthook(kind, value, trace) -> None:
        sys.stderr.write(redacted("".join(traceback.format_exception(kind, value, trace))))

    def thread_excepthook(hook_args) -> None:
        if hook_args.exc_type is SystemExit:  # as Python's own hook: a thread's sys.exit() is silent
            return
        trace = traceback.format_exception(hook_args.exc_type, hook_args.exc_value, hook_args.exc_traceback)
        sys.stderr.write(redacted(f"Exception in thread {getattr(hook_args.thread, 'name', '?')}:\n{''.join(trace)}"))

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
