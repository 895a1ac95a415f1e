"""`fedskew ui` (`make ui`): MLflow's UI on the project's store, and a link to each suite's runs table.

`mlflow ui` takes a minute or more before it accepts a connection (its server imports MLflow and opens the store),
so the links are printed once its port answers, not as it starts: a link printed earlier opens on "connection
refused". The wait is bounded (START_TIMEOUT_S); a UI that ends first, or does not answer in time, is said in one
line. The server runs as a child in a process group of its own that stops with fedskew, as a build's Snakemake does
(fedskew.buildstop): Ctrl-C or SIGTERM stops it, and after a `kill -9` of fedskew no server is left holding the port.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time

from fedskew.buildstop import StopForwarding, Watchdog
from fedskew.config_errors import ConfigError
from fedskew.tracking.recorded import fedskew_experiments

START_TIMEOUT_S = 300.0  # mlflow ui 3.x answered after 70 to 95 s on a loaded 2-core machine
_POLL_S = 0.5


def ui_links(uri: str, base_url: str) -> list[str]:
    """A link to each fedskew suite's runs table, in the UI's Model training mode (docs/tracking.md)."""
    return [f"{name}: {base_url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            for name, experiment_id in fedskew_experiments(uri)]


def answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on host:port (a wildcard host is asked on the loopback)."""
    address = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def serve(command: list[str], host: str, port: int, links: list[str], timeout_s: float = START_TIMEOUT_S) -> int:
    """Run the UI server `command` until it ends, printing `links` once it answers on host:port; its exit code
    (128 + the signal's number when Ctrl-C or SIGTERM stopped it). A port that answers before the server starts is
    another's: a ConfigError, nothing started."""
    base = f"http://{host}:{port}"
    if answers(host, port):
        raise ConfigError(f"port {port} of {host} answers already (another UI?): open {base}, or start this one "
                          "with another --port")
    print(f"starting mlflow ui on {base}; its links follow once it answers (Ctrl-C stops it)", flush=True)
    with StopForwarding() as stop, Watchdog() as watchdog:
        child = subprocess.Popen(command, start_new_session=True)
        watchdog.watch(child.pid)
        with child:
            stop.attach(child)
            problem = _once_it_answers(child, stop, host, port, timeout_s)
            print(problem or "\n".join([*links, f"mlflow ui answers on {base} (Ctrl-C stops it)"]), flush=True)
            code = child.wait()
    return 128 + stop.signal if stop.signal is not None else code


def _once_it_answers(child: subprocess.Popen, stop: StopForwarding, host: str, port: int,
                     timeout_s: float) -> str | None:
    """Wait until the server answers on host:port (None), or ends, is stopped or runs out of time: the line that
    says which."""
    base = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while not answers(host, port):
        if stop.signal is not None:
            return f"stopping mlflow ui ({signal.Signals(stop.signal).name})"
        if child.poll() is not None:
            return f"mlflow ui ended (exit {child.returncode}) before it answered on {base}: its output above says why"
        if time.monotonic() > deadline:
            return (f"mlflow ui does not answer on {base} after {timeout_s:g} s (its output above may say why); "
                    "Ctrl-C stops it")
        time.sleep(_POLL_S)
    return None
