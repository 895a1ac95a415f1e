"""`make run` and `make verify` prove a rebuild: on a fresh clone they train from the seeds and say whether
every rebuilt table is identical to the committed one, and a perturbed committed cell is reported."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import make_copy, run, venv_bin

pytestmark = pytest.mark.slow


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture(scope="session")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose tiny suite's tables are built and committed (run files, as in fedskew, are not).
    Built once, by the first pytest-xdist worker that needs it, under a lock in the workers' common
    temporary folder; every test works in clones of it and never writes into it."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # a worker's folder is popen-gw<n> in the session's own folder
    with FileLock(shared / "rebuild-origin.lock"):
        if not (shared / "rebuild-origin" / "BUILT").exists():
            shutil.rmtree(shared / "rebuild-origin", ignore_errors=True)  # a half-built one
            (shared / "rebuild-origin").mkdir()
            build_origin(shared / "rebuild-origin" / "project")
            (shared / "rebuild-origin" / "BUILT").touch()
    return shared / "rebuild-origin" / "project"


def build_origin(origin: Path) -> None:
    from tests.helpers import TINY_PARAMS

    make_copy(origin.parent, TINY_PARAMS)
    (origin / ".gitignore").write_text("/data/raw/\n/data/partitions/\n/results/runs/\n/results/checkpoints/\n"
                                       ".snakemake/\nlogs/\n.verify/\n__pycache__/\nmlflow.db*\n")
    built = run([venv_bin("snakemake"), "--cores", "2"], origin, FEDSKEW_TRACKING="0")
    assert built.returncode == 0, built.stderr[-3000:]
    shipped = fedskew(origin, "packed", "ship", "--suite", "tiny", "--out", "results/committed-runs/tiny")
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    git(origin, "init", "-q", "-b", "main")
    commit(origin, "tables")


def commit(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def fresh_clone(origin: Path, where: Path) -> Path:
    git(origin.parent, "clone", "-q", str(origin), str(where))
    return where


def fedskew(root: Path, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "fedskew", *args], root, FEDSKEW_TRACKING="0")


def test_make_run_on_a_fresh_clone_trains_and_proves_the_tables_identical(tmp_path, origin):
    """Also the report, before and after, and a committed cell perturbed afterwards: one training of the
    clone serves them all (it is the slow part)."""
    clone = fresh_clone(origin, tmp_path / "clone")
    assert not (clone / "results/runs").exists() and (clone / "results/tables/tiny.md").exists()

    # a plain snakemake on the fresh clone plans nothing: what the committed tables declare as inputs (the run
    # files) is not there, and nothing there looks newer (it only notes that it has no record of them: README)
    fresh = run([venv_bin("snakemake"), "-n"], clone)
    assert fresh.returncode == 0 and "Nothing to be done" in fresh.stdout + fresh.stderr
    assert "missing provenance" in fresh.stdout + fresh.stderr

    # the report on a fresh clone says what to run, and no traceback
    before = run([venv_bin("snakemake"), "--report", "results/report.html"], clone)
    assert before.returncode == 1
    assert "Traceback" not in before.stderr and "WorkflowError" not in before.stderr
    assert "suite(s) tiny are not built here yet" in before.stderr and "make report" in before.stderr

    # a suite of one's own, untracked: `make run` builds run.suites, and speaks of them only
    (clone / "experiments").mkdir()
    (clone / "experiments/mine.yaml").write_text(yaml.safe_dump(MINE, sort_keys=False))
    done = fedskew(clone, "run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("fedskew: rebuilt tiny: all 7 tables are identical, byte for byte, to the "
                                "committed tables (HEAD ")
    assert "mine" not in done.stdout and not (clone / "results/runs/mine").exists()
    # a readable progress: one line per trained run with its accuracy, no Snakemake job blocks
    trained = [line for line in lines if line.startswith("  trained ")]
    assert len(trained) == 8 and all("final accuracy" in line and line.endswith(" %") for line in trained)
    # and a line per step, from Snakemake's job events: the training, then the forced aggregation and comparison
    steps = [re.fullmatch(r"\[ *\d+ s\] (\d+) of (\d+) steps \(\d+%\) done", line) for line in lines]
    counts = [(int(m[1]), int(m[2])) for m in steps if m]
    total = counts[0][1]
    assert counts == [(k, total) for k in range(1, total + 1)] + [(1, 2), (2, 2)] and total > 8
    assert "rule train:" not in done.stdout and "jobid" not in done.stdout
    assert len(list((clone / "results/runs/tiny").rglob("metrics.json"))) == 8
    assert git(clone, "status", "--porcelain", "results/tables") == ""

    an_experiments_suite_is_built_when_named_and_compared_with_what_there_is(clone)

    # a clone that has its runs: a plain snakemake has nothing to do
    again = run([venv_bin("snakemake"), "--cores", "2", "-n"], clone)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert "missing provenance" not in again.stdout + again.stderr

    # and the report builds once the runs are there
    after = run([venv_bin("snakemake"), "--report", "results/report.html"], clone)
    assert after.returncode == 0, after.stderr[-3000:]
    assert (clone / "results/report.html").stat().st_size > 10_000

    a_perturbed_committed_cell_is_reported_and_stays_in_git(clone)


MINE = {  # a researcher's suite over the tiny suite's data: two methods (a comparison), one seed, two rounds
    "suites": {"mine": {"settings": [{"dataset": "digits", "partitions": ["dir0.5"]}], "methods": ["fedavg", "fedprox"],
                        "seeds": [0]}},
    "training": {"mine": {"inherit": "tiny", "rounds": 2}},
}


def an_experiments_suite_is_built_when_named_and_compared_with_what_there_is(clone: Path) -> None:
    """Named, the experiment's suite is built, and each suite's part of the closing line says what it was compared
    with: the committed tables, nothing (its first build), then its previous build's tables."""
    head = git(clone, "rev-parse", "--short", "HEAD").strip()
    both = fedskew(clone, "run", "--suite", "tiny", "mine")
    assert both.returncode == 0, both.stdout[-3000:] + both.stderr[-3000:]
    assert both.stdout.strip().splitlines()[-1] == (
        "fedskew: rebuilt: no table differs, but not every table had one to compare with: tiny: identical, byte for "
        f"byte, to the committed tables (HEAD {head}) | mine: built; no committed table to compare")
    assert len(list((clone / "results/runs/mine").rglob("metrics.json"))) == 2

    again = fedskew(clone, "run", "--suite", "mine")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == (
        "fedskew: rebuilt mine: all 7 tables are identical, byte for byte, to the previous build's tables "
        "(not committed).")


def a_perturbed_committed_cell_is_reported_and_stays_in_git(clone: Path) -> None:
    """A wrong cell committed into a built clone: `make run` rebuilds the table from the runs and lists the cell."""
    table = clone / "results/tables/tiny.json"
    cells = json.loads(table.read_text())
    key = "digits/dir0.5/fedavg"
    true_mean = cells[key]["final_acc_mean"]
    cells[key]["final_acc_mean"] = round(true_mean + 0.0123, 6)
    table.write_text(json.dumps(cells, indent=2) + "\n")
    commit(clone, "a wrong cell")

    done = fedskew(clone, "run")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"tiny: {key} final_acc_mean:" in out and "(-1.23 points)" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("fedskew: rebuilt: 1 of 1 suite(s) differ: tiny: tiny.json differ from the committed "
                           "tables") and "1 cell(s) differ" in last
    # the committed cell is still in git; the working tree holds the rebuilt table, for git diff to show
    assert json.loads(git(clone, "show", "HEAD:results/tables/tiny.json"))[key]["final_acc_mean"] == \
        cells[key]["final_acc_mean"]
    assert json.loads((clone / "results/tables/tiny.json").read_text())[key]["final_acc_mean"] == true_mean


def test_make_verify_rebuilds_from_the_seeds_in_a_scratch_project(tmp_path, origin):
    project = fresh_clone(origin, tmp_path / "clone")
    before = {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*") if p.is_file()}

    done = fedskew(project, "verify", "--suite", "tiny", "--cores", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("fedskew: rebuilt from the seeds tiny: all 7 tables "
                                                            "are identical")
    assert {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*") if p.is_file()} == before
    assert not (project / ".verify/tiny").exists()  # removed once identical

    # some runs retrained beside the committed ones: each compared with its committed files, then the tables
    some = fedskew(project, "verify", "--suite", "tiny", "--method", "fedlc", "--seed", "1", "--cores", "2")
    assert some.returncode == 0, some.stdout[-3000:] + some.stderr[-3000:]
    lines = some.stdout.strip().splitlines()
    assert lines[0].startswith("fedskew: retraining 2 of 8 runs of tiny from their seeds")
    assert lines[-2] == ("fedskew: retrained 2 runs of tiny: each identical to its committed run (config.yaml and "
                         "history.csv byte for byte, metrics.json but for its provenance).")
    assert lines[-1].startswith("fedskew: rebuilt with those runs retrained tiny: all 7 tables are identical")
    assert len([line for line in lines if line.startswith("  trained fedlc on digits/")]) == 2
    assert {p: p.stat().st_mtime_ns for p in (project / "results").rglob("*") if p.is_file()} == before
    assert not (project / ".verify/tiny").exists()

    bad = fedskew(project, "verify", "--suite", "tinny")
    assert bad.returncode == 2 and "'tinny' is not a suite (did you mean 'tiny'?)" in bad.stderr
