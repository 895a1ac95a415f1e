"""A tracking server that does not answer costs a build seconds and keeps no run from training; no secret of the
tracking URI reaches any output.

A closed port, a server that accepts connections and never answers, one that answers its health check and drops
every request, and one that hangs in the middle of a run: each is found in seconds (a probe before the build, or
before a job's run: fedskew.tracking.reach) or bounded by MLflow's retries as fedskew sets them. The runs train,
are left to `fedskew track` exactly as after any tracking failure, and one line says so; `fedskew track` records
them once the server answers. The URI's user-info, query and fragment are masked in every line that fedskew,
MLflow, urllib3 and Python print (fedskew.tracking.redaction). Every server here listens on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.tracking import reach
from fedskew.tracking.redaction import redact_uri, redacted, server_address
from tests.helpers import (
    KILL_ROUNDS,
    REPO,
    TINY_PARAMS,
    MlflowServer,
    end_group,
    free_port,
    isolated_env,
    live_run,
    make_copy,
    metric_steps,
    mlflow_runs,
    wait_until,
)

pytest.importorskip("mlflow")

TOKEN, PASSWORD, FRAGMENT = "SECRET123tok", "PASSWORD456", "FRAGMENT789"
SECRETS = (TOKEN, PASSWORD, FRAGMENT)
OVERHEAD_S = 30  # what a silent tracker may add to a job: generous, against minutes before
HANG_BOUND_S = 150  # a job's end after its server hung: MLflow's bounded retries (~35 s), against 5 min before


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that accepts every connection and never answers: its URI, and the connections it holds."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    finally:
        stop.set()
        accepting.join(5)
        for connection in [listener, *held]:
            connection.close()


class _HealthOnly(BaseHTTPRequestHandler):
    """A tracker that answers its health check and drops every other request unanswered (a dying server)."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")
        else:
            self.close_connection = True

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def dropping_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def with_secrets(uri: str) -> str:
    """`uri` with a user and password, a token in the query and a fragment."""
    return uri.replace("http://", f"http://fedskew-user:{PASSWORD}@") + f"/?access_token={TOKEN}#{FRAGMENT}"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("server")).start(timeout_s=120)
    yield server
    server.stop()


# --- the pieces -----------------------------------------------------------------------------------

def test_a_tracking_uri_is_printed_without_its_user_info_query_or_fragment() -> None:
    uri = f"https://ana:{PASSWORD}@mlflow.example.org:5000/base?access_token={TOKEN}#{FRAGMENT}"
    assert redact_uri(uri) == "https://***@mlflow.example.org:5000/base?***#***"
    assert server_address(uri) == "https://mlflow.example.org:5000/base"
    assert redact_uri("sqlite:////a/b@c/mlflow.db") == "sqlite:////a/b@c/mlflow.db"
    environ = {"MLFLOW_TRACKING_URI": f"http://host:5000/?access_token={TOKEN}#{FRAGMENT}",
               "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    # urllib3 prints a request's path and query alone: the secrets are masked wherever they appear
    line = f"Retrying after 'RemoteDisconnected()': /?access_token={TOKEN}#{FRAGMENT}/api/2.0 ({PASSWORD}, {TOKEN})"
    assert redacted(line, environ) == "Retrying after 'RemoteDisconnected()': /?***#***/api/2.0 (***, ***)"


def test_mlflows_retries_are_bounded_unless_the_user_set_them() -> None:
    environ = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
    reach.bound_http_retries(environ)
    assert environ == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                       "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def test_a_closed_port_or_a_silent_server_is_found_in_seconds_and_a_live_one_passes() -> None:
    with silent_server() as (silent, held), dropping_server() as answering:
        for uri, expected in ((f"http://127.0.0.1:{free_port()}", "Connection refused"), (silent, "no answer")):
            started = time.monotonic()
            assert expected in reach.probe(uri)
            assert time.monotonic() - started < reach.PROBE_TIMEOUT_S + 2
        assert len(held) == 1  # one connection, and nothing sent that the server would have to read
        assert reach.probe(with_secrets(answering)) is None
    assert reach.probe("sqlite:////tmp/mlflow.db") is None  # a local store is never probed


def test_a_builds_verdict_spares_its_jobs_a_second_probe_of_the_same_uri() -> None:
    with silent_server() as (silent, held):
        environ = {"MLFLOW_TRACKING_URI": silent, "FEDSKEW_TRACKING": "1"}
        line = reach.probe_for_build(["tiny", "other"], environ)
        assert "is unreachable" in line and "`python -m fedskew track --suite tiny` and" in line
        assert reach.unreachable(silent, environ) is not None and len(held) == 1  # the verdict, no second probe
        assert "Connection refused" in reach.unreachable(f"http://127.0.0.1:{free_port()}", environ)  # another URI
        assert reach.probe_for_build(["tiny"], {**environ, "FEDSKEW_TRACKING": "0"}) is None and len(held) == 1


def test_a_request_that_got_no_answer_is_not_tried_again_on_top_of_mlflows_retries() -> None:
    import requests
    from mlflow.exceptions import MlflowException

    from fedskew.tracking import runs

    class Unanswered:
        calls = 0

        def log_inputs(self, run_id, datasets) -> None:
            self.calls += 1
            try:
                raise requests.exceptions.ReadTimeout("read timed out")
            except requests.exceptions.RequestException as error:  # as MLflow raises it, after its own retries
                raise MlflowException(f"API request failed with exception {error}")

    client = Unanswered()
    with pytest.raises(MlflowException):
        runs._log_dataset(client, "run", object())
    assert client.calls == 1  # a clash the server answered is retried (tests/unit/test_track.py); silence is not


def test_mlflows_and_urllib3s_retry_lines_show_no_secret_of_the_uri() -> None:
    code = ("import logging; from fedskew.tracking import redaction, store; redaction.install(); "
            "logging.basicConfig(level=logging.INFO); import os; uri = os.environ['MLFLOW_TRACKING_URI']; "
            "store.import_mlflow(uri)(tracking_uri=uri).search_experiments()")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"),
           "MLFLOW_TRACKING_URI": with_secrets(f"http://127.0.0.1:{free_port()}")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1  # MLflow's error, after its bounded retries, as an uncaught exception's traceback
    assert "Retrying" in done.stderr and "MlflowException" in done.stderr and "***@127.0.0.1" in done.stderr
    assert all(secret not in done.stdout + done.stderr for secret in SECRETS)


# --- training jobs and builds ---------------------------------------------------------------------

def _train(project: Path, cfg, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedskew", "train", "--suite", cfg.suite, "--dataset",
                             cfg.dataset, "--partition", cfg.partition, "--method", cfg.method, "--seed",
                             str(cfg.seed)], cwd=project, env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _timed_job(project: Path, cfg, env: dict) -> tuple[float, str]:
    """Train `cfg` afresh; its wall time and its output."""
    for folder in (paths.RUN_DIR, paths.CHECKPOINT_DIR):
        shutil.rmtree(project / cfg.path(folder), ignore_errors=True)
    started = time.monotonic()
    job = _train(project, cfg, env)
    try:
        out, err = job.communicate(timeout=600)
    finally:
        end_group(job, grace_s=5)
    assert job.returncode == 0, err[-3000:]
    assert (project / cfg.path(paths.RUN_METRICS)).exists()
    return time.monotonic() - started, out + err


@pytest.mark.parametrize("tracker", ["closed port", "silent server"])
def test_a_job_whose_tracker_does_not_answer_trains_in_its_usual_time_plus_seconds(project, tracker) -> None:
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    usual, _ = _timed_job(project, cfg, {"FEDSKEW_TRACKING": "0"})
    with silent_server() as (silent, held):
        uri = silent if tracker == "silent server" else f"http://127.0.0.1:{free_port()}"
        took, output = _timed_job(project, cfg, {"FEDSKEW_TRACKING": "1", "MLFLOW_TRACKING_URI": uri})
        assert len(held) == (1 if tracker == "silent server" else 0)  # probed once, then never asked again
    assert took < usual + OVERHEAD_S, f"{took:.1f} s against {usual:.1f} s without tracking"
    (line,) = [line for line in output.splitlines() if "TRACKING FAILED" in line]
    assert f"the MLflow tracking server {uri} is unreachable" in line and "fedskew track --suite tiny" in line


def _build(root: Path, uri: str, *command: str) -> subprocess.CompletedProcess:
    env = {**isolated_env(root), "FEDSKEW_TRACKING": "1", "MLFLOW_TRACKING_URI": uri}
    return subprocess.run([sys.executable, "-m", "fedskew", *command], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)


def _small_project(tmp_path: Path, methods: list[str]) -> tuple[Path, list]:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=methods, seeds=[0])
    root = make_copy(tmp_path, params).resolve()
    return root, load_params(root / "params.yaml").runs(["tiny"])


@pytest.mark.slow
def test_a_build_probes_a_silent_server_once_says_so_once_and_track_records_its_runs_later(tmp_path,
                                                                                          mlflow_server) -> None:
    root, runs = _small_project(tmp_path, ["fedavg", "fedlc"])
    with silent_server() as (silent, held):
        done = _build(root, silent, "run", "--cores", "1")
        assert len(held) == 1  # the build's probe; its two jobs took its verdict
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [line for line in (done.stdout + done.stderr).splitlines() if "is unreachable" in line]
    assert line.startswith(f"fedskew: the MLflow tracking server {silent} is unreachable")
    assert "`python -m fedskew track --suite tiny` records them" in line
    for cfg in runs:
        assert (root / cfg.path(paths.RUN_METRICS)).exists()
        log = (root / "logs/train/tiny" / cfg.dataset / cfg.partition / cfg.method / "seed0.log").read_text()
        assert len([line for line in log.splitlines() if "TRACKING FAILED" in line]) == 1

    tracked = _build(root, mlflow_server.uri, "track", "--suite", "tiny")
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    assert "2 logged" in tracked.stdout
    assert mlflow_server.statuses("fedskew/tiny") == sorted((cfg.run_id, "FINISHED") for cfg in runs)


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


@pytest.mark.slow
def test_no_secret_of_the_tracking_uri_reaches_any_output_when_its_server_fails(tmp_path, mlflow_server) -> None:
    root, (cfg,) = _small_project(tmp_path, ["fedavg"])
    with dropping_server() as dropping:
        uri = with_secrets(dropping)
        outputs = [_build(root, uri, *command) for command in (["run", "--cores", "1"], ["track", "--suite", "tiny"],
                                                               ["ui"])]
    assert outputs[0].returncode == 0 and outputs[1].returncode == 2
    # `python -m fedskew` took the user and password out of the URI; the rest of its secrets are masked
    assert f"from the MLflow tracking server {dropping}/?***#*** failed" in outputs[1].stderr
    job_log = (root / "logs/train/tiny" / cfg.dataset / cfg.partition / cfg.method / "seed0.log").read_text()
    assert "Retrying" in job_log and "/?***#***" in job_log and "TRACKING FAILED" in job_log  # urllib3's, masked
    for secret in SECRETS:
        assert all(secret not in done.stdout + done.stderr for done in outputs)
        assert _files_holding(root, secret.encode()) == []

    # what the job wrote is what `track` records: no secret in the run's params or tags either
    assert _build(root, mlflow_server.uri, "track", "--suite", "tiny").returncode == 0
    (run,) = [r for r in mlflow_server.runs("fedskew/tiny") if r.data.tags["fedskew.run_id"] == cfg.run_id]
    recorded = " ".join([*run.data.tags.values(), *run.data.params.values()])
    assert all(secret not in recorded for secret in SECRETS)


@pytest.mark.slow
def test_a_server_that_hangs_mid_run_costs_bounded_retries_and_track_completes_the_run(project, tmp_path) -> None:
    server = MlflowServer(tmp_path / "hanging").start(timeout_s=120)
    try:
        cfg = live_run(project, rounds=KILL_ROUNDS)
        job = _train(project, cfg, {"FEDSKEW_TRACKING": "1", "MLFLOW_TRACKING_URI": server.uri,
                                    "FEDSKEW_TRACKING_FLUSH_S": "0.5"})
        try:
            wait_until(lambda: mlflow_runs(server.uri, cfg), 120, "the live run", 0.1, alive=job)
            os.killpg(server.process.pid, signal.SIGSTOP)  # accepts connections, answers none
            hung = time.monotonic()
            try:
                out, err = job.communicate(timeout=HANG_BOUND_S)
            finally:
                os.killpg(server.process.pid, signal.SIGCONT)
        finally:
            end_group(job, grace_s=5)
        assert job.returncode == 0, err[-3000:]
        assert time.monotonic() - hung < HANG_BOUND_S
        assert (project / cfg.path(paths.RUN_METRICS)).exists()
        assert "TRACKING FAILED" in err and f"fedskew track --suite {cfg.suite}" in err

        wait_until(server.healthy, 60, "the server to answer again", 0.5)
        tracked = subprocess.run([sys.executable, "-m", "fedskew", "track", "--suite", cfg.suite], cwd=project,
                                 env={**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDSKEW_TRACKING": "1",
                                      "MLFLOW_TRACKING_URI": server.uri}, capture_output=True, text=True, timeout=300)
        assert tracked.returncode == 0, tracked.stderr[-3000:]
        (run,) = mlflow_runs(server.uri, cfg)  # the live run, continued: not a second one
        assert run.info.status == "FINISHED"
        assert set(metric_steps(server.uri, run.info.run_id).values()) == {1}
        assert len(metric_steps(server.uri, run.info.run_id)) == KILL_ROUNDS
    finally:
        server.stop()
