"""Secrets stay secret: credentials written into MLFLOW_TRACKING_URI reach MLflow through its own credential
variables, and nothing fedskew or its jobs print or write holds them (logs, messages, run files, tags)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedskew.tracking.store import move_credentials_out_of_uri, redacted
from tests.helpers import TINY_PARAMS, MlflowServer, make_copy

SECRET = "s3cr3t-Pa55"


def test_credentials_move_from_the_uri_to_mlflows_variables() -> None:
    environ = {"MLFLOW_TRACKING_URI": f"https://ana:{SECRET}%40x@mlflow.example.org:5000/base"}
    warning = move_credentials_out_of_uri(environ)
    assert environ == {"MLFLOW_TRACKING_URI": "https://mlflow.example.org:5000/base",
                       "MLFLOW_TRACKING_USERNAME": "ana", "MLFLOW_TRACKING_PASSWORD": f"{SECRET}@x"}
    assert SECRET not in warning and "ana" not in warning and "MLFLOW_TRACKING_PASSWORD" in warning
    assert move_credentials_out_of_uri(environ) is None  # done once: the URI holds none now
    assert environ["MLFLOW_TRACKING_PASSWORD"] == f"{SECRET}@x"


def test_variables_the_user_set_win_over_the_uris_credentials() -> None:
    environ = {"MLFLOW_TRACKING_URI": f"http://ana:{SECRET}@host:5000", "MLFLOW_TRACKING_USERNAME": "bo",
               "MLFLOW_TRACKING_PASSWORD": "theirs"}
    assert SECRET not in move_credentials_out_of_uri(environ)
    assert environ == {"MLFLOW_TRACKING_URI": "http://host:5000", "MLFLOW_TRACKING_USERNAME": "bo",
                       "MLFLOW_TRACKING_PASSWORD": "theirs"}


@pytest.mark.parametrize("uri", ["sqlite:////tmp/mlflow.db", "http://host:5000", "databricks://profile", ""])
def test_a_uri_without_credentials_is_left_as_it_is(uri) -> None:
    environ = {"MLFLOW_TRACKING_URI": uri}
    assert move_credentials_out_of_uri(environ) is None and environ == {"MLFLOW_TRACKING_URI": uri}


def test_messages_are_redacted() -> None:
    message = f"logging to http://ana:{SECRET}@host:5000/api failed: HTTPConnectionPool(host='host') (https://t@h/x)"
    assert redacted(message) == ("logging to http://***@host:5000/api failed: HTTPConnectionPool(host='host') "
                                 "(https://***@h/x)")
    assert redacted("sqlite:////a/b@c/mlflow.db") == "sqlite:////a/b@c/mlflow.db"  # a path's @ is no user


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("server")).start(timeout_s=90)
    yield server
    server.stop()


def test_a_secret_in_the_tracking_uri_reaches_no_log_and_no_message(tmp_path, mlflow_server) -> None:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=["fedavg"], seeds=[0])
    root = make_copy(tmp_path, params).resolve()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PATH": path, "FEDSKEW_TRACKING": "1",
           "MLFLOW_TRACKING_URI": mlflow_server.uri.replace("http://", f"http://fedskew-user:{SECRET}@")}
    outputs = []
    for command in (["run", "--cores", "1"], ["track", "--suite", "tiny"], ["ui"]):
        done = subprocess.run([sys.executable, "-m", "fedskew", *command], cwd=root, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        outputs.append(done.stdout + done.stderr)

    assert "MLFLOW_TRACKING_PASSWORD" in outputs[0]  # the user is told once, where the credentials went
    assert all(SECRET not in text for text in outputs)
    assert mlflow_server.uri in outputs[2]  # `ui` names the server, without its credentials
    assert list(root.glob("logs/train/tiny/**/*.log")) and (root / "logs/rebuild/tiny.log").exists()
    assert _files_holding(root, SECRET.encode()) == []
    (run,) = mlflow_server.runs("fedskew/tiny")  # the run reached the server through MLflow's variables
    assert run.info.status == "FINISHED"
    assert all(SECRET not in value for value in (*run.data.tags.values(), *run.data.params.values()))
