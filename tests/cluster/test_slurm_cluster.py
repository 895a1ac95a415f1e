"""The cluster path for real: the default suite through a one-node SLURM (scripts/slurm-cluster.sh),
with every job logging to an `mlflow server` on loopback and the results pushed to a local-folder
DVC remote, then pulled into a second clone; and three faults on that path (a scancel of a training
job, a node drained mid-run, the MLflow server stopped mid-suite), each ending with the results of
an uninterrupted run and one FINISHED MLflow run per configuration.

Root and Debian's packages (installed by the script where missing) are needed, and the cluster
tests took 29 minutes on 2 cores under load (docs/cluster.md), so they are left out of `make test`:

    .venv/bin/python -m pytest -m cluster tests/cluster

The yardstick of the SLURM run is the committed tables and figures of the default suite: every
training job pins portable CPU kernels (fedskew.numerics.cpu_pin, applied by `python -m fedskew`, which
every rule's command runs, inside `sbatch` and `srun` too), so a local `make run` rebuilds them byte
for byte on any x86-64 machine, and they are what a local run gives here. That run, uninterrupted
and checked, is then the yardstick of the faults, which repeat a cut of the suite with the same run
ids: no local run of the suite is needed.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fedskew import paths
from fedskew.config import load_params
from tests.cluster import harness
from tests.cluster.harness import Timings
from tests.helpers import REPO

pytestmark = pytest.mark.cluster

EXPERIMENT = "fedskew/default"
SUITE_TIMEOUT_S = 3600  # a whole run of the default suite through SLURM; about 10 minutes here
REFERENCE_COMPARED = ("data/partitions", "results/runs", "results/tables", "results/figures")


@dataclass
class Reference:
    """An uninterrupted run of the default suite through SLURM (the fixture `uninterrupted` below),
    whose tables were checked byte-identical to the committed ones: what each fault run must equal."""

    root: Path
    files: dict[str, str]  # relative path -> sha256 of partitions, run files, tables and figures
    commit: str  # the project's git commit, which every run's provenance records


def configurations(root: Path) -> list:
    return load_params(root / "params.yaml").suite_runs("default")


def run_files(reference: Reference, cfgs: list) -> dict[str, str]:
    """The reference's partitions and run files of the given configurations."""
    wanted = {str(cfg.path(paths.RUN_DIR)) for cfg in cfgs}
    partitions = {f"data/partitions/{cfg.dataset}/{cfg.partition}/seed{cfg.seed}" for cfg in cfgs}
    return {name: digest for name, digest in reference.files.items()
            if name.rsplit("/", 1)[0] in wanted or name.rsplit(".", 1)[0] in partitions}


def check_mlflow(server: harness.MlflowServer, cfgs: list) -> None:
    """One FINISHED MLflow run per configuration, and nothing else."""
    runs = server.statuses(EXPERIMENT)
    expected = sorted((cfg.run_id, "FINISHED") for cfg in cfgs)
    assert runs == expected, f"MLflow holds {runs}, expected one FINISHED run for each of {len(cfgs)} configurations"


def check_all_completed(cluster: harness.Cluster, run_ids: list[str], planned: dict[str, str]) -> list[dict]:
    """Every planned job went through sbatch once and ended COMPLETED in sacct."""
    records = cluster.sacct(run_ids)
    by_comment = {}
    for record in records:
        assert record["Comment"] not in by_comment, f"submitted twice: {record['Comment']}"
        by_comment[record["Comment"]] = record
    assert sorted(by_comment) == sorted(planned), (sorted(set(by_comment) ^ set(planned)))
    assert {r["State"] for r in records} == {"COMPLETED"}, [(r["Comment"], r["State"]) for r in records]
    assert {(r["Account"], r["Partition"], r["NodeList"]) for r in records} == {
        (cluster.account, cluster.partition, cluster.node)}
    return records


# ---------------------------------------------------------------------------------------------
# The default suite, end to end


@dataclass
class SuiteRun:
    """The default suite run once through SLURM, uninterrupted, in a git + DVC project."""

    folder: Path
    root: Path
    server: harness.MlflowServer
    run_ids: list[str]
    planned: dict[str, str]  # SLURM comment -> rule, from a dry run
    reference: Reference


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, cluster: harness.Cluster,
                  timings: Timings) -> Iterator[SuiteRun]:
    """`snakemake --profile workflow/profiles/slurm` on the default suite, every job tracked by an
    `mlflow server` on loopback, in a git project with a local-folder DVC remote."""
    folder = tmp_path_factory.mktemp("suite")
    server = harness.MlflowServer(folder / "mlflow")
    with timings.part("start the MLflow server"):
        server.start()
    try:
        root = harness.make_project(folder / "project")
        plain = harness.project_env(root)
        for cmd in (["git", "init", "-q"], [harness.venv_bin("dvc"), "init", "-q"],
                    [harness.venv_bin("dvc"), "remote", "add", "-d", "store", str(folder / "dvc-remote")],
                    ["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm",
                                           "fedskew"]):
            harness.must(harness.run(cmd, root, plain))
        commit = harness.must(harness.run(["git", "rev-parse", "HEAD"], root, plain)).stdout.strip()

        env = harness.project_env(root, cluster, server.uri)
        args = harness.profile_args(cluster, root / harness.SLURM_PROFILE / "config.yaml")
        planned = harness.planned_jobs(root, args, env)
        with timings.part("default suite through SLURM (snakemake --profile workflow/profiles/slurm)"):
            suite = harness.SnakemakeRun(root, args, env, folder / "snakemake.log")
            try:
                harness.finish(suite, SUITE_TIMEOUT_S)
            finally:
                suite.close()
        reference = Reference(root, harness.digests(root, REFERENCE_COMPARED), commit)
        yield SuiteRun(folder, root, server, suite.run_ids(), planned, reference)
    finally:
        server.stop()


def test_default_suite_through_slurm_with_an_mlflow_server_and_a_dvc_remote(
        uninterrupted: SuiteRun, cluster: harness.Cluster, timings: Timings) -> None:
    root, server, planned = uninterrupted.root, uninterrupted.server, uninterrupted.planned
    plain = harness.project_env(root)
    assert sorted(set(planned.values())) == ["aggregate", "download", "partition", "train"]
    # Every job went through sbatch with the profile's resources, and SLURM accounted it COMPLETED.
    records = check_all_completed(cluster, uninterrupted.run_ids, planned)
    cfgs = configurations(root)
    trains = [r for r in records if planned[r["Comment"]] == "train"]
    assert sorted(r["Comment"] for r in trains) == sorted(harness.train_comment(cfg) for cfg in cfgs)
    profile = yaml.safe_load((root / harness.SLURM_PROFILE / "config.yaml").read_text())
    assert {(r["ReqMem"], r["Timelimit"], r["AllocCPUS"]) for r in trains} == {
        (f"{profile['set-resources']['train']['mem_mb']}M", "12:00:00", "1")}  # 720 minutes, params' 1 thread

    # The tables and figures are byte-identical to the committed ones, which a local run rebuilds
    # byte for byte (`make run`, under the CPU kernels' pin).
    got = harness.digests(root, ("results/tables", "results/figures"))
    committed = {name: digest for name, digest in harness.digests(REPO, ("results/tables", "results/figures"))
                 .items() if re.match(r"results/(tables/default\.|figures/default/)", name)}
    assert sorted(got) == sorted(committed) and len(committed) >= 4 + 8, (sorted(got), sorted(committed))
    differ = [name for name in committed if got[name] != committed[name]]
    assert not differ, f"not byte-identical to the committed tables and figures: {differ}"
    assert sum(name.endswith("/metrics.json") for name in uninterrupted.reference.files) == 36

    # One FINISHED MLflow run per configuration, on the server (no local store), with its
    # per-round metrics and its files, sent from inside the batch jobs.
    check_mlflow(server, cfgs)
    assert not (root / "mlflow.db").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    by_key = {r.data.tags["fedskew.run_id"]: r for r in server.runs(EXPERIMENT)}
    for cfg in (cfgs[0], cfgs[-1]):
        run_ = by_key[cfg.run_id]
        steps = [m.step for m in client.get_metric_history(run_.info.run_id, "accuracy/test_acc")]
        assert steps == list(range(1, cfg.training["rounds"] + 1))
        assert {"config.yaml", "history.csv", "metrics.json"} <= {a.path for a in client.list_artifacts(
            run_.info.run_id)}
        assert run_.data.tags["fedskew.threads"] == "1"
        # The batch job trained under the CPU kernels' pin, as a local run does (python -m fedskew sets it).
        assert (run_.data.tags["fedskew.provenance.cpu_kernels"], run_.data.tags["fedskew.provenance.cpu_capability"],
                run_.data.tags["fedskew.provenance.torch_mkldnn"]) == ("portable", "AVX2", "False")

    # DVC: record the outputs without re-running, push them to the remote, pull into a fresh clone.
    with timings.part("dvc commit, dvc push, git clone and dvc pull"):
        for cmd in ([harness.venv_bin("dvc"), "commit", "-f", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results"],
                    [harness.venv_bin("dvc"), "push", "-q"]):
            harness.must(harness.run(cmd, root, plain, timeout=900))
        clone = uninterrupted.folder / "clone"
        harness.must(harness.run(["git", "clone", "-q", str(root), str(clone)], uninterrupted.folder, plain))
        assert not (clone / "results" / "runs").exists()  # git holds none of them
        harness.must(harness.run([harness.venv_bin("dvc"), "pull", "-q"], clone, harness.project_env(clone),
                                 timeout=900))
    tracked = ("data/raw", "data/partitions", "results/runs/default", "results/checkpoints/default")
    pushed = harness.digests(root, tracked)
    assert sum(name.endswith("/last.pt") for name in pushed) == len(cfgs)
    assert harness.digests(clone, tracked) == pushed
    status = harness.must(harness.run([harness.venv_bin("dvc"), "status", "-q"], clone,
                                      harness.project_env(clone)))
    assert status.returncode == 0


# ---------------------------------------------------------------------------------------------
# Faults, on a smaller grid of the default suite (same run ids, so the same run files)


def fault_params() -> dict:
    """The default suite cut to digits / dir0.1: 3 methods x 2 seeds, 6 training jobs."""
    params = harness.default_params()
    params["suites"]["default"] = {**params["suites"]["default"],
                                   "settings": [{"dataset": "digits", "partitions": ["dir0.1"]}], "seeds": [0, 1]}
    params["training"]["default"].pop("overrides")  # those of synthetic_1_1, which the cut suite lacks
    return params


def expected_tables(tmp_path: Path, reference: Reference, params: dict, cfgs: list) -> dict[str, str]:
    """The cut suite's tables and figures, aggregated from the reference's (uninterrupted) run files."""
    root = harness.make_project(tmp_path / "expected", params)
    for cfg in cfgs:
        shutil.copytree(reference.root / cfg.path(paths.RUN_DIR), root / cfg.path(paths.RUN_DIR))
    shutil.copytree(reference.root / "data" / "partitions", root / "data" / "partitions")
    harness.must(harness.run([harness.venv_bin("python"), "-m", "fedskew", "aggregate", "--suite", "default"],
                             root, harness.project_env(root)))
    return harness.digests(root, ("results/tables", "results/figures"))


class FaultRun:
    """A project of the cut suite, an MLflow server and the expected results, for one fault."""

    def __init__(self, tmp_path: Path, cluster: harness.Cluster, reference: Reference, **env: str) -> None:
        self.params = fault_params()
        self.root = harness.make_project(tmp_path / "project", self.params)
        self.cfgs = configurations(self.root)
        assert len(self.cfgs) == 6
        full = {cfg.run_id for cfg in configurations(reference.root)}
        assert {cfg.run_id for cfg in self.cfgs} <= full  # cutting the grid changes no run
        self.expected = {**run_files(reference, self.cfgs),
                         **expected_tables(tmp_path, reference, self.params, self.cfgs)}
        self.cluster = cluster
        self.server = harness.MlflowServer(tmp_path / "mlflow").start()
        # The fault projects have no git: their runs' provenance records the commit of the uninterrupted
        # project (same code), as FEDSKEW_COMMIT says for a copy without .git, so run files compare byte for byte.
        self.env = harness.project_env(self.root, cluster, self.server.uri, FEDSKEW_COMMIT=reference.commit, **env)
        self.args = harness.profile_args(cluster, self.root / harness.SLURM_PROFILE / "config.yaml")
        self.log = tmp_path / "snakemake.log"
        self.runs: list[harness.SnakemakeRun] = []

    def start(self) -> harness.SnakemakeRun:
        self.runs.append(harness.SnakemakeRun(self.root, self.args, self.env, self.log))
        return self.runs[-1]

    def trains(self) -> dict[str, dict]:
        """sacct records of this project's training jobs so far, by SLURM job id."""
        run_ids = sorted({i for r in self.runs for i in r.run_ids()})
        return {r["JobIDRaw"]: r for r in self.cluster.sacct(run_ids) if r["Comment"].startswith("rule_train_")}

    def check_results(self) -> None:
        got = harness.digests(self.root, ("data/partitions", "results/runs", "results/tables", "results/figures"))
        assert sorted(got) == sorted(self.expected)
        differ = [name for name in self.expected if got[name] != self.expected[name]]
        assert not differ, f"not byte-identical to the uninterrupted run: {differ}"
        check_mlflow(self.server, self.cfgs)

    def close(self) -> None:
        for run_ in self.runs:
            run_.close()
        self.server.stop()


@pytest.fixture
def fault(tmp_path: Path, cluster: harness.Cluster, uninterrupted: SuiteRun, request: pytest.FixtureRequest):
    extra = getattr(request, "param", {})
    made = FaultRun(tmp_path, cluster, uninterrupted.reference, **extra)
    try:
        yield made
    finally:
        made.close()


def ended(fault: FaultRun, job_id: str) -> str | None:
    """The first word of a job's final state in sacct ("CANCELLED by 0" -> CANCELLED), None while it runs."""
    state = fault.trains().get(job_id, {}).get("State", "RUNNING")
    return None if state in ("RUNNING", "PENDING") else state.split(" ")[0]


def test_a_cancelled_training_job_resumes_from_its_checkpoint(fault: FaultRun, timings: Timings) -> None:
    cluster, comments = fault.cluster, {harness.train_comment(cfg): cfg for cfg in fault.cfgs}
    with timings.part("fault: scancel of a running training job, then a resume"):
        first = fault.start()

        # A running training job that has written a checkpoint but not finished: cancel it there.
        def running_with_checkpoint():
            for job in cluster.queue():
                cfg = comments.get(job["comment"])
                if cfg is not None and job["state"] == "RUNNING" and \
                        (fault.root / cfg.path(paths.CHECKPOINT_DIR) / "last.pt").exists() and \
                        not (fault.root / cfg.path(paths.RUN_METRICS)).exists():
                    return job["id"], cfg
            return None

        cancelled = None
        for _ in range(6):  # a job may finish between the look and the scancel: then take another
            job_id, cfg = harness.wait_until(running_with_checkpoint, 900, "a training job past its first "
                                             "checkpoint", every_s=0.1, alive=first.process)
            cluster.command("scancel", job_id)
            state = harness.wait_until(lambda: ended(fault, job_id), 120, f"job {job_id} to end")
            if state == "CANCELLED":
                cancelled = (job_id, cfg)
                break
        assert cancelled is not None, "every scancel came too late"
        job_id, cfg = cancelled
        assert not (fault.root / cfg.path(paths.RUN_METRICS)).exists()

        # SIGTERM reached the training process: its MLflow run says KILLED, with the reason.
        killed = harness.wait_until(lambda: [s for k, s in fault.server.statuses(EXPERIMENT) if k == cfg.run_id
                                             and s != "RUNNING"], 120, "the cancelled run's MLflow status")
        assert killed == ["KILLED"]

        # snakemake-executor-plugin-slurm 2.8.0 reads sacct's "CANCELLED by <uid>" as still running, so
        # this Snakemake would wait for the job forever: stop it as a user would (Ctrl-C), and resume.
        if fault.runs[-1].interrupt() == -9:  # it did not stop in time: its lock stayed
            harness.must(harness.run([harness.venv_bin("snakemake"), "--unlock", *fault.args], fault.root, fault.env))
        resumed = fault.start()
        harness.finish(resumed, SUITE_TIMEOUT_S)

    trains = fault.trains()
    retries = [r for r in trains.values() if r["Comment"] == harness.train_comment(cfg) and r["JobIDRaw"] != job_id]
    assert [r["State"] for r in retries] == ["COMPLETED"]
    log = (fault.root / "logs" / "train" / "default" / cfg.dataset / cfg.partition / cfg.method /
           f"seed{cfg.seed}.log").read_text()
    resumed_from = [int(n) for n in re.findall(r"resuming after round (\d+)", log)]
    assert resumed_from and resumed_from[-1] >= cfg.training["checkpoint_every"], log[-3000:]
    fault.check_results()
    by_key = {r.data.tags["fedskew.run_id"]: r for r in fault.server.runs(EXPERIMENT)}
    assert int(by_key[cfg.run_id].data.tags["fedskew.resumed_from_round"]) == resumed_from[-1]
    assert "fedskew.error" not in by_key[cfg.run_id].data.tags  # the earlier ending no longer holds


def test_a_node_drained_and_resumed_during_a_run(fault: FaultRun, timings: Timings) -> None:
    cluster = fault.cluster
    with timings.part("fault: node drained and resumed during a run"):
        suite = fault.start()

        def training_started_and_waiting() -> bool:
            states = [job["state"] for job in cluster.queue() if job["comment"].startswith("rule_train_")]
            return "RUNNING" in states and "PENDING" in states

        harness.wait_until(training_started_and_waiting, 900, "training jobs running and waiting", 0.5,
                           alive=suite.process)
        cluster.command("scontrol", "update", f"nodename={cluster.node}", "state=drain", "reason=fedskew-test")
        # Running jobs finish; no job starts on a drained node, and Snakemake keeps waiting.
        harness.wait_until(lambda: cluster.node_state() == "drained", 900, "the node to be drained", 1,
                           alive=suite.process)
        drained_at = time.time()
        time.sleep(20)  # several scheduling passes
        waiting = [job for job in cluster.queue() if job["comment"].startswith("rule_train_")]
        assert waiting and {job["state"] for job in waiting} == {"PENDING"}, waiting
        assert suite.process.poll() is None
        cluster.command("scontrol", "update", f"nodename={cluster.node}", "state=resume")
        resumed_at = time.time()
        harness.finish(suite, SUITE_TIMEOUT_S)

    trains = fault.trains()
    assert {r["State"] for r in trains.values()} == {"COMPLETED"}
    assert len(trains) == len(fault.cfgs)  # each trained once: draining cancelled nothing
    starts = {r["Comment"]: time.mktime(time.strptime(r["Start"], "%Y-%m-%dT%H:%M:%S")) for r in trains.values()}
    assert not [c for c, start in starts.items() if drained_at + 1 < start < resumed_at - 1], starts
    assert any(start >= resumed_at - 1 for start in starts.values())  # some waited for the resume
    fault.check_results()


# The jobs' MLflow client gives up after one retry, so that the outage outlasts it in seconds
# (by default it retries for about 4 minutes, and a shorter outage is absorbed without a trace).
@pytest.mark.parametrize("fault", [{"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}], indirect=True, ids=["fast-giving-up"])
def test_the_mlflow_server_stopped_and_restarted_mid_suite(fault: FaultRun, timings: Timings) -> None:
    cluster, server = fault.cluster, fault.server
    with timings.part("fault: MLflow server stopped and restarted mid-suite, then the backfill"):
        suite = fault.start()

        def recorded_and_training() -> bool:
            finished = [s for _, s in server.statuses(EXPERIMENT) if s == "FINISHED"]
            running = [job for job in cluster.queue()
                       if job["comment"].startswith("rule_train_") and job["state"] in ("RUNNING", "PENDING")]
            return len(finished) >= 1 and len(running) >= 2

        harness.wait_until(recorded_and_training, 900, "a recorded run and training jobs to come", 1,
                           alive=suite.process)
        server.stop()
        stopped_at = time.time()
        assert not server.healthy()

        # Training goes on without the tracker: a job that starts while it is down completes, and says so.
        def trained_while_down() -> list[dict]:
            return [r for r in fault.trains().values() if r["State"] == "COMPLETED"
                    and time.mktime(time.strptime(r["Start"], "%Y-%m-%dT%H:%M:%S")) > stopped_at + 1]

        [job, *_] = harness.wait_until(trained_while_down, 900, "a training job to run while the server is down", 1,
                                       alive=suite.process)
        cfg = {harness.train_comment(c): c for c in fault.cfgs}[job["Comment"]]
        log = (fault.root / "logs" / "train" / "default" / cfg.dataset / cfg.partition / cfg.method /
               f"seed{cfg.seed}.log").read_text()
        assert "TRACKING FAILED" in log and "fedskew track --suite default" in log, log[-3000:]
        assert (fault.root / cfg.path(paths.RUN_METRICS)).exists()
        server.start()  # the same port and store
        harness.finish(suite, SUITE_TIMEOUT_S)

        before = server.statuses(EXPERIMENT)
        assert [s for _, s in before].count("FINISHED") < len(fault.cfgs), before  # the outage cost records
        backfill = harness.must(harness.run([harness.venv_bin("python"), "-m", "fedskew", "track", "--suite",
                                             "default"], fault.root, fault.env))
    assert re.search(r"suite default: [1-9]\d* logged", backfill.stdout), backfill.stdout
    fault.check_results()
    assert {r["State"] for r in fault.trains().values()} == {"COMPLETED"}
    again = harness.must(harness.run([harness.venv_bin("python"), "-m", "fedskew", "track", "--suite", "default"],
                                     fault.root, fault.env))
    assert f"0 logged, {len(fault.cfgs)} already recorded" in again.stdout  # repeating it adds nothing
    check_mlflow(server, fault.cfgs)
