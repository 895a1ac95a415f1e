"""What the cluster tests drive: the one-node SLURM of scripts/slurm-cluster.sh, MLflow servers,
scratch projects and Snakemake runs through the SLURM profile.

Every process started here runs in its own session and gets a watchdog: a detached shell that
ends the session's process group once the test process has gone or a time limit has passed, so
a test that dies (or is killed) leaves nothing running. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

# The processes and the MLflow server are the reliability tests' too; the cluster tests use them as harness.X.
from tests.helpers import REPO, MlflowServer, end_group, venv_bin, wait_until, watchdog  # noqa: F401

SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
SLURM_PROFILE = "workflow/profiles/slurm"  # relative to a project: the profile as users get it
PROJECT_FILES = ("src", "workflow", "params.yaml", "dvc.yaml", ".gitignore", ".dvcignore")
SACCT_FIELDS = ("JobIDRaw", "JobName", "State", "Comment", "ReqMem", "AllocCPUS", "Timelimit", "Account",
                "Partition", "NodeList", "Start", "End")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digests(root: Path, tops: Iterable[str]) -> dict[str, str]:
    """relative path -> sha256 of every file under the given folders (or files) of `root`, but for
    Snakemake's marker in a directory() output, which is bookkeeping and no result."""
    out = {}
    for top in tops:
        base = root / top
        for path in sorted([base] if base.is_file() else base.rglob("*")):
            if path.is_file() and path.name != ".snakemake_timestamp":
                out[path.relative_to(root).as_posix()] = sha256(path)
    return out


class Timings:
    """Wall time of each part of the cluster tests, printed at the end of the session."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, float]] = []
        self.started = time.monotonic()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.parts.append((name, time.monotonic() - start))

    def report(self) -> list[str]:
        lines = [f"{seconds:8.1f} s  {name}" for name, seconds in self.parts]
        return lines + [f"{time.monotonic() - self.started:8.1f} s  all cluster tests (wall)"]


# ---------------------------------------------------------------------------------------------
# The cluster


@dataclass
class Cluster:
    folder: Path
    env: dict[str, str]  # SLURM_CONF and FEDSKEW_SLURM_* as `slurm-cluster.sh env` prints them

    @property
    def account(self) -> str:
        return self.env["FEDSKEW_SLURM_ACCOUNT"]

    @property
    def partition(self) -> str:
        return self.env["FEDSKEW_SLURM_PARTITION"]

    @property
    def node(self) -> str:
        return self.env["FEDSKEW_SLURM_NODE"]

    def command(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}"
        return done.stdout

    def sacct(self, names: Iterable[str]) -> list[dict[str, str]]:
        """Accounting records (allocations only) of the jobs named `names` (Snakemake's run ids)."""
        names = list(names)
        if not names:
            return []
        since = (datetime.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
        out = self.command("sacct", "-X", "--parsable2", "--noheader", "--starttime", since, "--endtime", "now",
                           "--format", ",".join(SACCT_FIELDS), "--name", ",".join(names))
        return [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line]

    def queue(self) -> list[dict[str, str]]:
        """squeue: id, state, reason and comment of every queued or running job."""
        out = self.command("squeue", "--noheader", "--format", "%i|%T|%r|%k")
        return [dict(zip(("id", "state", "reason", "comment"), line.split("|", 3))) for line in out.splitlines()
                if line]

    def node_state(self) -> str:
        return self.command("sinfo", "--noheader", "--nodes", self.node, "--format", "%T").strip()


def start_cluster(folder: Path, max_seconds: int, owner: int | None = None) -> Cluster:
    """scripts/slurm-cluster.sh start, owned by process `owner` (default: this one): the cluster stops
    by itself once the owner has died, or after `max_seconds`."""
    done = subprocess.run(["bash", str(SCRIPT), "start", "--dir", str(folder), "--owner-pid",
                           str(owner or os.getpid()), "--max-seconds", str(max_seconds)], capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, f"the cluster did not start:\n{done.stderr[-6000:]}"
    env = dict(re.findall(r"^export (\w+)=(.*)$", done.stdout, re.M))
    assert {"SLURM_CONF", "FEDSKEW_SLURM_ACCOUNT", "FEDSKEW_SLURM_PARTITION", "FEDSKEW_SLURM_NODE"} <= set(env), done
    return Cluster(folder, env)


def stop_cluster(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "stop", "--dir", str(folder)], capture_output=True, text=True,
                          timeout=300)


# ---------------------------------------------------------------------------------------------
# Projects and runs


def make_project(folder: Path, params: dict | None = None) -> Path:
    """A fresh project: the code, workflow (profiles included), dvc.yaml and .gitignore of this
    checkout, and params.yaml (this checkout's, or `params`)."""
    folder.mkdir(parents=True)
    for name in PROJECT_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, folder / name)
    if params is not None:
        (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return folder


def default_params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def project_env(root: Path, cluster: Cluster | None = None, tracking_uri: str | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a user in `root` with the environment activated (and the cluster's SLURM_CONF)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PATH": path}
    for name in ("MLFLOW_TRACKING_URI", "FEDSKEW_TRACKING", "FEDSKEW_COMMIT"):
        env.pop(name, None)
    if cluster is not None:
        env.update(cluster.env)
    if tracking_uri is not None:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    env.update(extra)
    return env


def run(cmd: list[str], root: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    return done


def must(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"{' '.join(map(str, done.args))} failed ({done.returncode}):\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def profile_args(cluster: Cluster, profile: Path) -> list[str]:
    """`--profile` with the profile as it is, and its default-resources with the cluster's account and
    partition: on the command line, because an option given there replaces the profile's whole key."""
    defaults = yaml.safe_load(profile.read_text())["default-resources"]
    assert {"slurm_account", "slurm_partition"} <= set(defaults), defaults
    defaults = {**defaults, "slurm_account": cluster.account, "slurm_partition": cluster.partition}
    return ["--profile", SLURM_PROFILE, "--default-resources", *(f"{k}={v}" for k, v in defaults.items())]


class SnakemakeRun:
    """`snakemake ARGS` in the background, in its own session, its output in a log file."""

    def __init__(self, root: Path, args: list[str], env: dict[str, str], log: Path, max_seconds: int = 3600):
        self.root, self.log = root, log
        with open(log, "a") as out:
            self.process = subprocess.Popen([venv_bin("snakemake"), *args], cwd=root, env=env,
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        watchdog(self.process.pid, max_seconds)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def run_ids(self) -> list[str]:
        """The SLURM run ids (every job's name) of this and earlier runs logged to the same file."""
        return re.findall(r"SLURM run ID: (\S+)", self.text())

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            end_group(self.process, signal.SIGINT, grace_s=120)
            raise AssertionError(f"snakemake did not finish in {timeout_s:.0f} s:\n{self.text()[-6000:]}") from None

    def interrupt(self, grace_s: float = 180) -> int:
        """Ctrl-C, as a user would: Snakemake cancels its jobs with scancel and exits."""
        end_group(self.process, signal.SIGINT, grace_s=grace_s)
        return self.process.returncode

    def close(self) -> None:
        if self.process.poll() is None:
            end_group(self.process, signal.SIGINT, grace_s=120)


def finish(run_: SnakemakeRun, timeout_s: float) -> None:
    code = run_.wait(timeout_s)
    assert code == 0, f"snakemake failed ({code}):\n{run_.text()[-8000:]}"


# ---------------------------------------------------------------------------------------------
# The plan, and what SLURM did


def planned_jobs(root: Path, args: list[str], env: dict[str, str]) -> dict[str, str]:
    """SLURM comment -> rule of every job a dry run plans to submit: not local rules, nor jobs without a
    command (`all`, which Snakemake completes itself).

    The executor plugin names each job `rule_<rule>[_wildcards_<values joined by _>]` in its comment."""
    done = must(run([venv_bin("snakemake"), "-n", "--printshellcmds", *args], root, env))
    jobs = {}
    for block in re.split(r"\n(?=\[[^\]]+\]\n)", done.stdout):
        header = re.search(r"^(local)?rule (\w+):", block, re.M)
        if header is None or header.group(1) or re.search(r"^Shell command: None$", block, re.M):
            continue
        wildcards = re.search(r"^    wildcards: (.*)$", block, re.M)
        values = [item.split("=", 1)[1] for item in wildcards.group(1).split(", ")] if wildcards else []
        name = header.group(2)
        comment = f"rule_{name}" + (f"_wildcards_{'_'.join(values)}".replace("/", "_") if values else "")
        jobs[comment] = name
    assert jobs, done.stdout[-3000:]
    return jobs


def train_comment(cfg: Any) -> str:
    return f"rule_train_wildcards_{cfg.suite}_{cfg.dataset}_{cfg.partition}_{cfg.method}_{cfg.seed}"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
