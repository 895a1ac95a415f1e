"""A run whose files cannot be written (a read-only folder, a full disk) ends in one line and a consistent store.

The faults are real: the job runs in a mount namespace where the run's folder is a read-only bind mount,
or its checkpoint folder a tmpfs too small for one checkpoint (as root, with `unshare`); without root the
read-only folder is a chmod. Each job must then end its MLflow run FAILED, leave no half-written file,
print what failed and how to fix it in one line (no traceback), and a retry once the fault is gone
must finish the run from its last checkpoint.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from fedskew import paths, tracking
from fedskew.config import load_params
from tests.helpers import REPO

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


CAN_MOUNT = _can_mount()


def _train(project, uri: str, mounts: str = "", then: str = "") -> subprocess.CompletedProcess:
    """`python -m fedskew train` for the tiny suite's first run, after `mounts` in a private mount namespace
    (and `then`, in that namespace, after the job; the job's exit code is kept)."""
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    argv = [sys.executable, "-m", "fedskew", "train", "--suite", "tiny", "--dataset", cfg.dataset,
            "--partition", cfg.partition, "--method", cfg.method, "--seed", str(cfg.seed), "--threads", "1"]
    script = f"{mounts} && {{ {shlex.join(argv)}; code=$?; {then or ':'}; exit $code; }}"
    command = ["unshare", "-m", "sh", "-c", script] if mounts else argv
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDSKEW_TRACKING": "1", "MLFLOW_TRACKING_URI": uri}
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)


def _mlflow_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fedskew/tiny").experiment_id])
    return run


def _store(project, migrated_store) -> str:
    shutil.copy(migrated_store, project / "mlflow.db")
    return f"sqlite:///{project / 'mlflow.db'}"


def _assert_one_line_failure(job: subprocess.CompletedProcess, *words: str) -> str:
    assert job.returncode == 1, job.stderr
    assert "Traceback" not in job.stderr, job.stderr
    (line,) = [line for line in job.stderr.splitlines() if line.startswith("fedskew train:")]
    for word in words:
        assert word in line, line
    return line


def _read_only(folder) -> str:
    """Shell commands that make `folder` read-only for the job (a bind mount as root, else a chmod)."""
    folder.mkdir(parents=True, exist_ok=True)
    if CAN_MOUNT:
        quoted = shlex.quote(str(folder))
        return f"mount --bind {quoted} {quoted} && mount -o remount,ro,bind {quoted}"
    folder.chmod(0o555)
    return ""


@pytest.mark.skipif(os.geteuid() == 0 and not CAN_MOUNT, reason="as root a read-only folder needs a mount namespace")
def test_a_read_only_run_folder_ends_the_run_failed_and_a_retry_finishes_it(project, migrated_store) -> None:
    uri = _store(project, migrated_store)
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    run_dir = project / cfg.path(paths.RUN_DIR)
    mounts = _read_only(run_dir)
    try:
        job = _train(project, uri, mounts)
    finally:
        run_dir.chmod(0o755)
    line = _assert_one_line_failure(job, str(cfg.path(paths.RUN_DIR)), "could not write", "make that folder writable")
    assert "Read-only file system" in line or "Permission denied" in line
    assert list(run_dir.iterdir()) == []  # nothing half-written, no temporary left
    run = _mlflow_run(uri)
    assert run.info.status == "FAILED" and "could not write" in run.data.tags["fedskew.error"]

    again = _train(project, uri)  # the fault is gone: the final checkpoint is restored, nothing retrained
    assert again.returncode == 0, again.stderr
    assert f"resuming after round {cfg.training['rounds']}" in again.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "history.csv", "metrics.json"]
    assert tracking.recorded_runs(uri, "fedskew/tiny") == {cfg.run_id: "FINISHED"}  # the same MLflow run, continued


@pytest.mark.skipif(not CAN_MOUNT, reason="a full disk is a tmpfs mounted in a private namespace (root and unshare)")
def test_a_full_disk_under_the_checkpoints_ends_the_run_failed_with_no_partial_checkpoint(project,
                                                                                           migrated_store) -> None:
    uri = _store(project, migrated_store)
    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    checkpoints = project / cfg.path(paths.CHECKPOINT_DIR)
    checkpoints.mkdir(parents=True)
    folder = shlex.quote(str(checkpoints))
    job = _train(project, uri, f"mount -t tmpfs -o size=8k tmpfs {folder}", then=f"echo left: $(ls -A {folder})")
    line = _assert_one_line_failure(job, "could not write", "No space left on device", "free disk space")
    assert "last.pt" in line
    assert job.stdout.splitlines()[-1].rstrip() == "left:"  # the full disk holds no partial checkpoint or temporary
    assert not (project / cfg.path(paths.RUN_METRICS)).exists()
    assert _mlflow_run(uri).info.status == "FAILED"

    again = _train(project, uri)
    assert again.returncode == 0, again.stderr
    assert tracking.recorded_runs(uri, "fedskew/tiny") == {cfg.run_id: "FINISHED"}


def test_a_failed_write_of_the_last_run_file_takes_back_the_others(project, monkeypatch) -> None:
    """runfiles.write_run_files is all or nothing: config.yaml and history.csv never stand without metrics.json."""
    import errno

    from fedskew import runfiles

    cfg = load_params(project / "params.yaml").runs(["tiny"])[0]
    real = runfiles.atomic_write_text

    def full_disk_at_metrics(path, text):
        if path.name == "metrics.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(runfiles, "atomic_write_text", full_disk_at_metrics)
    with pytest.raises(OSError, match="No space left"):
        runfiles.write_run_files(cfg, [{"round": 1, "test_acc": 0.5}], {"status": "finished"})
    assert not (project / cfg.path(paths.RUN_DIR)).exists() or list((project / cfg.path(paths.RUN_DIR)).iterdir()) == []
