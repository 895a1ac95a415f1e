"""What more than one test module uses: the tiny project, the method tests' pieces, a copied project and the
commands run in it, processes with a watchdog, a loopback MLflow server, a live run's MLflow records.

Test modules import these from here (`from tests.helpers import ...`), never from another test module or from
a conftest.py: conftest.py files hold fixtures and hooks, which pytest hands to the tests itself. The root
conftest.py registers this module for pytest's assertion rewriting, so that a failing `assert` here reports
its values as it would in a test module.

Importing it imports no torch, numpy or MLflow (the root conftest.py imports it in every pytest process, and
the CPU kernels must be pinned before torch computes anything): those are imported where they are used.
Tests of a single tier keep their own machinery beside them: tests/cluster/harness.py (the one-node SLURM
cluster, built on the processes and the MLflow server here), tests/fingerprints/record.py, and the fake
dataset files of tests/fixtures/.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedskew.catalog import DatasetInfo

if TYPE_CHECKING:
    import torch

    from fedskew.fl.base import ClientContext

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# The tiny project (the `tiny_params` and `project` fixtures of conftest.py start from it)

# Small enough that one run trains in about a second on one core.
TINY_PARAMS = {
    "run": {"suites": ["tiny"]},
    "datasets": {
        "digits": {"source": "digits"},
        "synth": {"source": "synthetic", "lam": 1.0, "mu": 1.0, "clients": 12, "seed": 0},
    },
    "partitions": {
        "dir0.5": {"scheme": "dirichlet", "beta": 0.5, "clients": 4, "min_size": 5},
        "q2": {"scheme": "quantity", "alpha": 2, "clients": 5},
        "natural": {"scheme": "natural"},
    },
    "methods": {
        "fedavg": {"algorithm": "fedavg"},
        "fedprox": {"algorithm": "fedprox", "mu": 0.01},
        "fedlc": {"algorithm": "fedlc", "tau": 1.0},
    },
    "suites": {
        "tiny": {
            "settings": [{"dataset": "digits", "partitions": ["dir0.5", "q2"]}],
            "methods": ["fedavg", "fedlc"],
            "seeds": [0, 1],
        },
    },
    "training": {
        "tiny": {"model": "mlp", "rounds": 4, "participation": 0.5, "local_epochs": 1, "batch_size": 32,
                 "lr": 0.05, "eval_every": 2, "checkpoint_every": 2, "threads": 1},
    },
}

# A project with Fashion-MNIST alone (the tests of its local sources and of the OS package).
FASHION_PARAMS = {
    "run": {"suites": ["s"]},
    "datasets": {"fashionmnist": {"source": "fashionmnist"}},
    "partitions": {"iid": {"scheme": "iid", "clients": 2}},
    "methods": {},
    "suites": {"s": {"settings": [{"dataset": "fashionmnist", "partitions": ["iid"]}], "methods": ["fedavg"],
                     "seeds": [0]}},
    "training": {"s": {}},  # every suite says what it trains with: here the built-in defaults
}


def single_setting(params: dict) -> dict:
    """One partition (dir0.5) and one seed: the `project` fixture then prepares only that."""
    params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    params["suites"]["tiny"]["seeds"] = [0]
    return params


def method_config(params: dict, method: str, training: dict | None = None, label: str | None = None,
                  **hyperparameters):
    """The tiny digits/dir0.5 seed-0 run of any registered method (paper defaults unless overridden)."""
    import dataclasses

    from fedskew.algorithms import ALGORITHMS
    from fedskew.config import load_params

    base = load_params(params).run("tiny", "digits", "dir0.5", params["suites"]["tiny"]["methods"][0], 0)
    spec = {"algorithm": method, **ALGORITHMS[method].defaults, **hyperparameters}
    return dataclasses.replace(base, method=label or method, method_spec=spec,
                               training={**base.training, **(training or {})})


def venv_bin(name: str) -> str:
    """A console script of the environment running the tests (snakemake, dvc, ...)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


# ---------------------------------------------------------------------------------------------
# The method tests' pieces: a hand-checkable net, random digit-shaped data, client contexts, paper cells

DIGITS_INFO = DatasetInfo((1, 8, 8), 10, True, False)


def _tiny_net() -> type:
    from torch import nn

    class TinyNet(nn.Module):
        """logits = W x + b with an identity body: gradients are easy to write by hand."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Identity()
            self.head = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))

    TinyNet.__module__, TinyNet.__qualname__ = __name__, "TinyNet"
    return TinyNet


def __getattr__(name: str) -> Any:
    """`TinyNet` (logits = W x + b with an identity body, a torch module), defined on its first import: this
    module imports torch only when a test asks for something built on it."""
    if name == "TinyNet":
        globals()["TinyNet"] = cls = _tiny_net()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def random_digits(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """n digit-shaped inputs (seeded) with labels 0..9 repeating."""
    import torch

    g = torch.Generator().manual_seed(123)
    return torch.randn(n, 1, 8, 8, generator=g), torch.arange(n) % 10


def make_client(label_counts, indices=None, client_id: int = 0, seed: int = 0, round_: int = 1) -> ClientContext:
    """A client holding `label_counts` (indices 0..n-1 unless given), with a seeded generator."""
    import torch

    from fedskew.fl.base import ClientContext

    counts = torch.as_tensor(label_counts, dtype=torch.int64)
    if indices is None:
        indices = torch.arange(int(counts.sum()))
    return ClientContext(client_id, round_, torch.as_tensor(indices, dtype=torch.int64), counts,
                         torch.Generator().manual_seed(seed))


def assert_printed(table_id: str, row: str, column: str, value: float, pm: float | None) -> None:
    """A transcribed paper cell holds the printed number and ± (no ± where the paper prints none)."""
    import pytest

    from fedskew.reproduce.paper_tables import load_paper_table

    cell = load_paper_table(table_id).cell(row, column)
    assert cell.value == pytest.approx(value)
    assert cell.pm is None if pm is None else cell.pm == pytest.approx(pm)


# ---------------------------------------------------------------------------------------------
# A copied project and the commands run in it (the workflow, DVC, rebuild and reliability tests)


def make_copy(tmp_path: Path, params: dict) -> Path:
    """A fresh checkout-like folder: code, workflow and the given params.yaml."""
    root = tmp_path / "project"
    root.mkdir()
    for item in ("src", "workflow"):
        shutil.copytree(REPO / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def install_plugin(tmp_path: Path, distribution: str, entry_points: dict[str, dict[str, str]],
                   modules: dict[str, str]) -> Path:
    """A plugin package written into tmp_path and installed with pip into a folder of its own (`--target`),
    offline; that folder, for a command's PYTHONPATH (fedskew finds the entry points there, and the test's
    environment stays as it was). `entry_points`: group -> {name: "module:attribute"}; `modules`: file -> text."""
    package = tmp_path / distribution
    for relative, text in modules.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    groups = "".join(f'[project.entry-points."{group}"]\n' + "".join(f'{name} = "{value}"\n'
                                                                        for name, value in names.items())
                     for group, names in entry_points.items())
    (package / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{distribution}"\nversion = "0.1"\n\n{groups}')
    site = tmp_path / f"{distribution}-site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(site),
                           str(package)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def run(cmd: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """`cmd` in the copied project `cwd`, with its own src/ and as in an activated environment (dvc's stage
    commands find `snakemake` on PATH), no MLFLOW_TRACKING_URI, `env` on top; output captured, 900 s at most."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    environment = {**os.environ, "PYTHONPATH": str(cwd / "src"), "PATH": path, **env}
    environment.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(cmd, cwd=cwd, env=environment, capture_output=True, text=True, timeout=900)


def isolated_env(root: Path) -> dict:
    """The environment of a command in the copied project `root`: its own code (src/) and, with neither
    MLFLOW_TRACKING_URI nor FEDSKEW_TRACKING, its own MLflow store; the environment's scripts on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PATH": path}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("FEDSKEW_TRACKING", None)
    return env


def summary(root: Path, *targets: str) -> list[dict[str, str]]:
    """Snakemake's machine-readable plan for `targets` (`--detailed-summary`, a dry run): a row per output file,
    with its rule, its job's input files and whether it would be updated."""
    done = run([venv_bin("snakemake"), "--detailed-summary", *targets], root)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(csv.DictReader(io.StringIO(done.stdout), delimiter="\t"))


def planned(root: Path, *targets: str) -> dict[str, set[str]]:
    """What Snakemake would run for `targets`: each rule with an output to update, and those outputs."""
    plan: dict[str, set[str]] = {}
    for row in summary(root, *targets):
        if row["plan"] != "no update":
            plan.setdefault(row["rule"], set()).add(row["output_file"])
    return plan


def jobs(root: Path, *targets: str) -> list[dict]:
    """The jobs of a dry run for `targets` as Snakemake describes them in its job events (the `fedskew` logger
    plugin that `make run` reads): rule, input and output files, wildcards."""
    events = root / "dry-run-events.jsonl"
    events.unlink(missing_ok=True)
    done = run([venv_bin("snakemake"), "-n", "--logger", "fedskew", "--logger-fedskew-events-file", str(events),
                *targets], root)
    assert done.returncode == 0, done.stderr[-3000:]
    return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "job_info"]


@contextlib.contextmanager
def changed(path: Path):
    """`path` with a line appended, for a dry run to see; then its bytes as they were (a file that is newer but
    has the same content re-runs nothing: Snakemake compares the checksum it recorded)."""
    content = path.read_bytes()
    path.write_bytes(content + b"\n# changed\n")
    try:
        yield
    finally:
        path.write_bytes(content)


# ---------------------------------------------------------------------------------------------
# Processes that end with the test (the cluster tests and the tracking server below)

# A detached watcher: ends process group $2 when process $1 (the test) has gone or after $3 seconds,
# and ends itself as soon as the group has gone on its own.
WATCHDOG = """owner=$1 group=$2 deadline=$((SECONDS + $3))
while (( SECONDS < deadline )) && kill -0 "$owner" 2>/dev/null && kill -0 -- "-$group" 2>/dev/null; do sleep 2; done
kill -TERM -- "-$group" 2>/dev/null || exit 0
for _ in $(seq 40); do kill -0 -- "-$group" 2>/dev/null || exit 0; sleep 0.5; done
kill -KILL -- "-$group" 2>/dev/null || true"""


def watchdog(group: int, seconds: float) -> None:
    """End process group `group` when this process ends or after `seconds` (see WATCHDOG)."""
    subprocess.Popen(["bash", "-c", WATCHDOG, "watchdog", str(os.getpid()), str(group), str(int(seconds))],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def end_group(process: subprocess.Popen, first: int = signal.SIGTERM, grace_s: float = 60) -> None:
    """Signal a process's whole group (it leads its own session), then SIGKILL what is left after `grace_s`."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, first)
        except ProcessLookupError:
            return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # what is left of the group, the leader included
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def processes_in(root: Path) -> list[str]:
    """The live processes working in `root` or below it (Snakemake, its jobs, their tracking workers), as
    `pid: command`; zombies (ended, not yet reaped) are not counted. Linux's /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and (cwd == root or root in cwd.parents):
            found.append(f"{entry.name}: {command}")
    return found


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 1.0,
               alive: subprocess.Popen | None = None) -> Any:
    """Poll `condition` until it returns something true, at most `timeout_s` seconds; fail saying `what`.

    With `alive`, fail at once if that process ends first (a run that stopped cannot reach the state)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process ended first (exit code {alive.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        time.sleep(every_s)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# MLflow: a loopback tracking server, and what a live run recorded


@dataclass
class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a SQLite store and proxied artifacts, in `folder`."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers: fedskew has none
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.folder / "server.log", "a") as log:
            self.process = subprocess.Popen(
                [venv_bin("mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                 "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
                 "--artifacts-destination", str(self.folder / "artifacts")],
                cwd=self.folder, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        watchdog(self.process.pid, 7200)
        wait_until(self.healthy, timeout_s, f"the MLflow server on port {self.port}", 0.5, alive=self.process)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            end_group(self.process, signal.SIGTERM, grace_s=60)  # SIGTERM: uvicorn finishes requests in flight
            self.process = None

    def runs(self, experiment: str) -> list[Any]:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        found = client.get_experiment_by_name(experiment)
        return [] if found is None else list(client.search_runs([found.experiment_id], max_results=1000))

    def statuses(self, experiment: str) -> list[tuple[str, str]]:
        """(fedskew run id, status) of every MLflow run of the experiment, sorted."""
        return sorted((r.data.tags.get("fedskew.run_id", "?"), r.info.status) for r in self.runs(experiment))


LIVE_ROUNDS = 30
KILL_ROUNDS = 120  # long enough that the kill lands mid-run (seconds of training, 4x LIVE_ROUNDS)


def live_run(project, rounds=LIVE_ROUNDS, **training) -> object:
    """The first run of the tiny suite in `project` (the fixture), renamed so that each test has its own MLflow
    experiment (the server outlives a test, and a run id does not depend on the suite's name); evaluated and
    checkpointed every round."""
    import uuid

    from fedskew.config import load_params

    params = yaml.safe_load((project / "params.yaml").read_text())
    suite = f"live{uuid.uuid4().hex[:8]}"
    params["suites"] = {suite: params["suites"]["tiny"]}
    params["training"] = {suite: {**params["training"]["tiny"], "rounds": rounds, "eval_every": 1,
                                  "checkpoint_every": 1, **training}}
    params["run"]["suites"] = [suite]
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return load_params(project / "params.yaml").runs([suite])[0]


def mlflow_runs(uri, cfg) -> list:
    """The MLflow runs of the store at `uri` that record run `cfg` (its tag fedskew.run_id)."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []  # not created yet: a client here would create it, racing the job
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(f"fedskew/{cfg.suite}")
    if experiment is None:
        return []
    return [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("fedskew.run_id") == cfg.run_id]


def metric_steps(uri, run_id, metric="accuracy/test_acc") -> Counter:
    """How many times each step of `metric` was recorded in MLflow run `run_id` (1 each: no round twice)."""
    from mlflow.tracking import MlflowClient

    return Counter(p.step for p in MlflowClient(tracking_uri=uri).get_metric_history(run_id, metric))


def wait_for_checkpoint(project, cfg, job: subprocess.Popen) -> None:
    """Until the first checkpoint of run `cfg` exists; round 1 was sent to MLflow just before it was written.
    Fails the test if the training job `job` ends first or after 120 s."""
    import pytest

    from fedskew import paths

    checkpoint = project / cfg.path(paths.CHECKPOINT_DIR) / "last.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the job never wrote a checkpoint: {job.stderr.read()[-3000:]}")
        time.sleep(0.005)
