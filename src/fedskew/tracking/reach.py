"""Whether the tracking server answers, asked in seconds before anything is recorded; MLflow's own retries bounded.

A tracking server that is down or hung must cost a build seconds, not MLflow's patience: its client retries a
request 7 times with a backoff factor of 2, each try waiting up to 120 s, which made every training job wait
minutes for a server that never answered. So:

- `probe` asks an http(s) tracking server for any HTTP answer, within PROBE_TIMEOUT_S in all (connection, TLS,
  first byte of the answer, and the host's name lookup, which has no timeout of its own); nothing is sent but
  `GET <path>/health`: no credentials, no query;
- `fedskew run` and `reproduce` probe once before Snakemake starts (`probe_for_build`): a server that does not
  answer is said in one line and noted in VERDICT_VARIABLE, which the build's jobs inherit, so that none of them
  asks again; a job started otherwise (`snakemake` itself, `fedskew train`) has its tracking worker probe before
  each run it records (`unreachable`);
- a run whose server does not answer trains all the same, unrecorded in MLflow, exactly as after any tracking
  failure: its job says so in one line, naming `fedskew track`, which records it from its run files later;
- `bound_http_retries` caps MLflow's retries of a request that fails once the server has answered the probe (a
  server that dies or hangs in the middle of a run), unless the user set MLflow's variables themselves.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterable, MutableMapping
from urllib.parse import urlsplit, urlunsplit

from fedskew.tracking.redaction import redact_uri, redacted

PROBE_TIMEOUT_S = 5.0
# Set (inherited by a build's jobs) when the build's probe found the tracking server silent: "<uri digest> <why>".
VERDICT_VARIABLE = "FEDSKEW_TRACKING_UNREACHABLE"
# MLflow's variables and fedskew's values where the user set none: 3 tries of at most 10 s each, with 2 to 3 s of
# backoff in all, so that a request to a dead server fails in about 3 s and one to a hung server in about 33 s,
# rather than MLflow's 8 tries of up to 120 s each, with backoffs of up to a minute between them.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# Answers that say the server behind a proxy is down (MLflow retries them too): as good as no answer.
GATEWAY_ERRORS = (502, 503, 504)
# What urllib3 puts before the reason of a failed connection: the connection object, as urllib3 2 or 1 writes it.
_CONNECTION = re.compile(r"^(?:HTTPS?Connection\([^)]*\)|<[^>]*>): ")


def bound_http_retries(environ: MutableMapping[str, str] = os.environ) -> None:
    """Bound MLflow's HTTP retries and timeouts in `environ` (HTTP_LIMITS), leaving any the user set."""
    for name, value in HTTP_LIMITS.items():
        if not environ.get(name):
            environ[name] = value


def is_server(uri: str) -> bool:
    """Whether `uri` is a tracking server fedskew can probe (http or https; not a local store or Databricks)."""
    return urlsplit(uri).scheme in ("http", "https")


def probe(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the tracking server at `uri` gives an HTTP answer within `timeout_s` (any status but a
    gateway's error: 401, 404 or a TLS handshake mean that it is there), else why not, without the URI. A URI that
    is no server (`is_server`) is not probed: None."""
    if not is_server(uri):
        return None
    import requests  # noqa: F401 - before the clock starts: a slow import on a busy machine is no silent server

    parts = urlsplit(uri)
    target = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/") + "/health", "", ""))
    found: list[str | None] = []
    # In a thread, so that the bound holds for a name lookup too; a lookup that outlives it ends with the process.
    asking = threading.Thread(target=lambda: found.append(_ask(target, timeout_s)), daemon=True)
    asking.start()
    asking.join(timeout_s)
    return found[0] if found else f"no answer within {timeout_s:g} s"


def _ask(url: str, timeout_s: float) -> str | None:
    import requests  # MLflow's own HTTP client: the same proxies, certificates and .netrc as its requests

    try:
        with requests.get(url, timeout=(timeout_s, timeout_s), allow_redirects=False, stream=True) as answer:
            status = answer.status_code
    except requests.exceptions.SSLError:
        return None  # it answered, in TLS: whether MLflow trusts it is MLflow's settings' affair
    except requests.exceptions.ConnectTimeout:
        return f"no connection within {timeout_s:g} s"
    except requests.exceptions.ReadTimeout:
        return f"connected, but no answer within {timeout_s:g} s"
    except requests.exceptions.RequestException as error:
        return _why(error)
    return f"HTTP {status} from a gateway" if status in GATEWAY_ERRORS else None


def _why(error: Exception) -> str:
    """The innermost reason of a failed request (`[Errno 111] Connection refused`), without its URL."""
    reason = error.args[0] if error.args else error
    reason = getattr(reason, "reason", reason)  # urllib3's MaxRetryError names its cause
    text = _CONNECTION.sub("", str(reason))  # "HTTPConnection(host=..., port=...): Failed to establish ..."
    return redacted(text or type(error).__name__)


def unanswered(error: BaseException) -> bool:
    """Whether an MLflow request failed for want of an answer (MLflow raises its error from the HTTP client's,
    after its retries), rather than with the server's answer."""
    import requests

    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, requests.exceptions.RequestException):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _digest(uri: str) -> str:
    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def note(uri: str, reason: str | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """Record a probe's verdict on `uri` in `environ` for the processes it starts: the reason, or none."""
    if reason is None:
        environ.pop(VERDICT_VARIABLE, None)
    else:
        environ[VERDICT_VARIABLE] = f"{_digest(uri)} {reason}"


def unreachable(uri: str, environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Why the tracking server at `uri` cannot be used: the build's verdict on this very URI where it has one (no
    second probe), else a probe's; None when it answers, or `uri` is no server."""
    digest, _, reason = environ.get(VERDICT_VARIABLE, "").partition(" ")
    if reason and digest == _digest(uri):
        return reason
    return probe(uri)


def unreachable_message(uri: str, reason: str) -> str:
    return f"the MLflow tracking server {redact_uri(uri)} is unreachable ({reason})"


def probe_for_build(suites: Iterable[str], environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Once before a build's first job: probe the tracking server, note the verdict in `environ` for the jobs, and
    return the line that says a silent server is left out (None when tracking is off, local, or answers)."""
    uri = environ.get("MLFLOW_TRACKING_URI", "")
    suites = list(suites)
    if not suites or environ.get("FEDSKEW_TRACKING", "1") == "0" or not is_server(uri):
        return None
    reason = probe(uri)
    note(uri, reason, environ)
    if reason is None:
        return None
    track = " and ".join(f"`python -m fedskew track --suite {suite}`" for suite in suites)
    return (f"fedskew: {unreachable_message(uri, reason)}: the runs train without live tracking; once it answers, "
            f"{track} records them")
