"""A build stops when told: SIGTERM (or SIGINT) to `python -m fedskew run` stops Snakemake and every job it
started, keeps Snakemake's log, and leaves a project that the next `fedskew run` builds without `--unlock`."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import TINY_PARAMS, isolated_env, make_copy, processes_in  # the project's own code, its own MLflow store

pytest.importorskip("mlflow")


def _params() -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"].update(methods=["fedavg", "fedprox"], seeds=[0])
    # Long enough that the stop lands while both jobs train (a checkpoint every 5 rounds).
    params["training"]["tiny"].update(rounds=120, checkpoint_every=5, eval_every=20, threads=1)
    return params


@pytest.mark.parametrize("stop, sigint", [(signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.SIG_DFL),
                                          (signal.SIGINT, signal.SIG_IGN)],
                         ids=["SIGTERM", "SIGINT", "SIGINT, ignored from the start as in a script's background job"])
def test_a_signal_to_fedskew_run_stops_snakemake_and_its_jobs(tmp_path, stop, sigint) -> None:
    root = make_copy(tmp_path, _params()).resolve()
    build = subprocess.Popen([sys.executable, "-m", "fedskew", "run", "--cores", "2"], cwd=root,
                             env=isolated_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and build.poll() is None \
            and len(list(root.glob("results/checkpoints/tiny/**/last.pt"))) < 2:
        time.sleep(0.05)
    assert build.poll() is None, build.communicate()
    os.kill(build.pid, stop)  # the fedskew process only, as a scheduler or `kill` sends it
    out, err = build.communicate(timeout=180)

    assert build.returncode == (143 if stop == signal.SIGTERM else 130), err
    assert f"stopped by {stop.name}" in err and "Traceback" not in err, err
    assert processes_in(root) == []
    log = (root / "logs/rebuild/tiny.log").read_text()
    assert "--rerun-incomplete" in log and "snakemake" in log  # Snakemake's output is kept
    assert not list(root.glob("results/runs/tiny/**/metrics.json"))  # nothing was finished, nothing half-written
    assert not list((root / ".snakemake" / "locks").glob("*"))
    if stop != signal.SIGTERM:
        return

    again = subprocess.run([sys.executable, "-m", "fedskew", "run", "--cores", "2"], cwd=root,
                           env=isolated_env(root), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "unlock" not in again.stderr.lower()
    assert len(list(root.glob("results/runs/tiny/**/metrics.json"))) == 2
    assert "resuming after round" in "".join(p.read_text() for p in root.glob("logs/train/tiny/**/*.log"))


@pytest.mark.parametrize("cores", ["0", "-2", "two", "1.5", ""])
def test_cores_must_be_a_positive_integer_or_all(cores, capsys) -> None:
    """`--cores 0` would start a Snakemake that waits forever for a free core."""
    from fedskew.cli import main

    for command in (["run"], ["verify", "--suite", "default"], ["reproduce"]):
        with pytest.raises(SystemExit) as stopped:
            main([*command, "--cores", cores])
        assert stopped.value.code == 2
        assert f"{cores!r} is not a number of cores: give a positive integer, or all" in capsys.readouterr().err
