"""The cluster path, kept alive in `make test`: one small training job through the SLURM profile.

`make cluster-test` (test_slurm_cluster.py) runs the whole default suite and three faults through a
one-node SLURM in about half an hour, too long for every change. This smoke test runs on the same
harness in a few minutes: it starts the one-node cluster (scripts/slurm-cluster.sh, which installs
Debian's SLURM, munge and MariaDB where they are missing), an `mlflow server` on loopback, prepares
one run's data and partition locally, sends that run's training job through
`snakemake --profile workflow/profiles/slurm`, and checks that sacct accounts it COMPLETED, that its
run files are intact and that MLflow holds its FINISHED run. Then it stops the cluster.

It needs root (the daemons, the packages). Without root it says so and skips; as root (CI) a failure
is a failure.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.runfiles import read_metrics
from tests.cluster import harness
from tests.helpers import TINY_PARAMS, single_setting

pytestmark = pytest.mark.slow

CLUSTER_MAX_SECONDS = 900  # the watchdog stops the cluster after this, whatever happens
JOB_TIMEOUT_S = 300  # the training job through SLURM; well under a minute here
PACKAGES = ("slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", "mariadb-server", "mariadb-client")


def _why_it_cannot_run() -> str | None:
    """Why this machine cannot run the smoke test, or None."""
    if os.geteuid() != 0:
        return ("the SLURM smoke test needs root: scripts/slurm-cluster.sh installs Debian's SLURM, munge and "
                "MariaDB where missing and starts their daemons (run `sudo make test`, or `sudo make cluster-test` "
                "for the whole cluster path)")
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}\n", *PACKAGES], capture_output=True, text=True)
    if installed.stdout.count("install ok installed") < len(PACKAGES) and shutil.which("apt-get") is None:
        return f"SLURM's packages ({', '.join(PACKAGES)}) are missing and there is no apt-get to install them"
    return None


def test_one_training_job_through_the_slurm_profile_with_an_mlflow_server(tmp_path: Path) -> None:
    if (reason := _why_it_cannot_run()) is not None:
        pytest.skip(reason)
    # Under /tmp, not pytest's deeper folders: SLURM's socket paths must stay short (see the script).
    folder = Path(tempfile.mkdtemp(prefix="fedskew-slurm-smoke-", dir="/tmp")) / "c"
    cluster = harness.start_cluster(folder, CLUSTER_MAX_SECONDS)
    try:
        server = harness.MlflowServer(tmp_path / "mlflow").start()
        try:
            _train_one_run_through_slurm(cluster, server, tmp_path / "project")
        finally:
            server.stop()
    finally:
        stopped = harness.stop_cluster(folder)
        shutil.rmtree(folder.parent, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr


def _train_one_run_through_slurm(cluster: harness.Cluster, server: harness.MlflowServer, project: Path) -> None:
    params = single_setting(copy.deepcopy(TINY_PARAMS))
    params["suites"]["tiny"]["methods"] = ["fedavg"]
    root = harness.make_project(project, params)
    (cfg,) = load_params(root / "params.yaml").suite_runs("tiny")
    partition = paths.PARTITION.format(dataset=cfg.dataset, partition=cfg.partition, seed=cfg.seed)
    # The data and the partition are made here, so that the one job SLURM runs is the training.
    harness.must(harness.run([harness.venv_bin("snakemake"), "--cores", "1", partition], root,
                             harness.project_env(root)))

    target = str(cfg.path(paths.RUN_METRICS))
    env = harness.project_env(root, cluster, server.uri)
    # The profile as users get it; the plugin's first status check after 5 s instead of its 40 (a job of
    # seconds would otherwise wait for it: the cluster tests leave the default, this test is in make test).
    args = [target, *harness.profile_args(cluster, root / harness.SLURM_PROFILE / "config.yaml"),
            "--slurm-init-seconds-before-status-checks", "5"]
    assert harness.planned_jobs(root, args, env) == {harness.train_comment(cfg): "train"}
    snakemake = harness.SnakemakeRun(root, args, env, project.parent / "snakemake.log", max_seconds=JOB_TIMEOUT_S)
    try:
        harness.finish(snakemake, JOB_TIMEOUT_S)
    finally:
        snakemake.close()

    (record,) = cluster.sacct(snakemake.run_ids())
    assert (record["Comment"], record["State"]) == (harness.train_comment(cfg), "COMPLETED"), record
    assert (record["Account"], record["Partition"], record["NodeList"]) == (cluster.account, cluster.partition,
                                                                          cluster.node)
    final = read_metrics(cfg, root)  # verifies every run file against its recorded digests
    assert final["final_round"] == params["training"]["tiny"]["rounds"], final
    assert server.statuses(f"fedskew/{cfg.suite}") == [(cfg.run_id, "FINISHED")]
