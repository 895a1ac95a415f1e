"""`make ui` (`fedskew ui`) prints its links once MLflow's UI answers, says so when it never does, and stops with it.

`mlflow ui` takes a minute or more before it accepts connections: links printed as it starts open on "connection
refused". fedskew.tracking.ui.serve runs the server, polls its port with a bounded wait and prints the links only
when the port answers; a server that ends first, or does not answer in time, is said in one line; a port that
answers before the server starts is another's, refused before anything starts; and stopping fedskew stops the
server. A stand-in server (a few lines of Python that listen after a delay) plays mlflow ui, so each case takes
seconds.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fedskew.config import ConfigError
from fedskew.tracking import ui
from tests.helpers import REPO, end_group, free_port, wait_until, watchdog

# A stand-in for mlflow ui: starts for DELAY seconds, then listens on PORT for SERVE seconds (or forever) and
# ends; exits with EXIT instead of listening when given one.
STAND_IN = """
import socket, sys, time
port, delay, serve, exit_code = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
time.sleep(delay)
if exit_code:
    sys.exit(int(exit_code))
server = socket.create_server(("127.0.0.1", port))
server.settimeout(0.2)
deadline = time.monotonic() + serve
while time.monotonic() < deadline:
    try:
        server.accept()[0].close()
    except TimeoutError:
        pass
"""


def _stand_in(port: int, delay: float = 0.0, serve: float = 3.0, exit_code: str = "") -> list[str]:
    return [sys.executable, "-c", STAND_IN, str(port), str(delay), str(serve), exit_code]


class Printed(io.StringIO):
    """What is printed, each piece with whether the port answered at the moment it was printed."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.pieces: list[tuple[str, bool]] = []

    def write(self, text: str) -> int:
        self.pieces.append((text, ui.answers("127.0.0.1", self.port)))
        return super().write(text)


def test_the_links_are_printed_once_the_server_answers_not_as_it_starts(monkeypatch) -> None:
    port = free_port()
    printed = Printed(port)
    monkeypatch.setattr(sys, "stdout", printed)
    links = ["default: http://127.0.0.1:PORT/#/experiments/1/runs?workflowType=machine_learning"]
    assert ui.serve(_stand_in(port, delay=1.5), "127.0.0.1", port, links, timeout_s=60) == 0
    base = f"http://127.0.0.1:{port}"
    assert printed.getvalue().splitlines() == [
        f"starting mlflow ui on {base}; its links follow once it answers (Ctrl-C stops it)", links[0],
        f"mlflow ui answers on {base} (Ctrl-C stops it)"]
    said = {text.splitlines()[0]: answered for text, answered in printed.pieces if text.strip()}
    assert said[f"starting mlflow ui on {base}; its links follow once it answers (Ctrl-C stops it)"] is False
    assert said[links[0]] is True  # the link was printed while the server answered


def test_a_server_that_ends_before_it_answers_is_said_and_its_code_returned(capsys) -> None:
    port = free_port()
    assert ui.serve(_stand_in(port, exit_code="3"), "127.0.0.1", port, ["a link"], timeout_s=60) == 3
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"mlflow ui ended (exit 3) before it answered on http://127.0.0.1:{port}: its output above says why"]


def test_a_server_that_does_not_answer_in_time_is_said_once_and_waited_for(capsys) -> None:
    port = free_port()
    started = time.monotonic()
    assert ui.serve(_stand_in(port, delay=4, exit_code="0"), "127.0.0.1", port, ["a link"], timeout_s=1) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"mlflow ui does not answer on http://127.0.0.1:{port} after 1 s (its output above may say why); Ctrl-C "
        "stops it"]
    assert time.monotonic() - started >= 4  # the wait is bounded, the server is not ended for it


def test_a_port_that_answers_already_is_refused_and_nothing_starts(tmp_path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        marker = tmp_path / "started"
        with pytest.raises(ConfigError, match=f"port {port} of 127.0.0.1 answers already \\(another UI\\?\\): open "
                                              f"http://127.0.0.1:{port}, or start this one with another --port"):
            ui.serve([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], "127.0.0.1", port, ["a link"])
    time.sleep(0.5)
    assert not marker.exists()


def test_stopping_fedskew_stops_the_server(tmp_path) -> None:
    port = free_port()
    code = (f"import sys; from fedskew.tracking import ui; "
            f"sys.exit(ui.serve({_stand_in(port, serve=600)!r}, '127.0.0.1', {port}, ['a link'], timeout_s=60))")
    out = tmp_path / "out"
    with open(out, "w") as sink:
        process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO / "src")}, start_new_session=True)
    watchdog(process.pid, 120)
    try:
        wait_until(lambda: "a link" in out.read_text(), 60, "the link", every_s=0.2, alive=process)
        process.send_signal(signal.SIGTERM)  # to fedskew alone: the server is in a process group of its own
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        end_group(process, signal.SIGKILL, grace_s=5)
    wait_until(lambda: not ui.answers("127.0.0.1", port), 30, "the server to stop", every_s=0.2)
