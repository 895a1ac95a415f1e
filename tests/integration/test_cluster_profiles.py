"""The cluster profiles (workflow/profiles/slurm, workflow/profiles/kubernetes) and the job image (Dockerfile).

Offline: nothing here reaches a cluster, a bucket or a registry, and nothing builds the image.
The SLURM profile also runs for real, on a one-node SLURM, in tests/cluster/ (`pytest -m cluster`).

What runs where:
- SLURM: snakemake-executor-plugin-slurm is in the environment, so `snakemake -n --profile
  workflow/profiles/slurm` plans the workflow with the profile exactly as it is.
- Kubernetes: snakemake-executor-plugin-kubernetes and snakemake-storage-plugin-s3 are not in
  requirements.lock (the submit host installs workflow/profiles/kubernetes/requirements.txt). Even
  with them installed, a dry run of the full profile would ask the S3 bucket which outputs exist,
  i.e. need the network and credentials. So the dry run always uses a copy of the profile without
  its executor and storage options (`executor`, `kubernetes-*`, `default-storage-*`, `storage-*`)
  and must plan the same jobs as the SLURM profile: this proves every other setting (resources,
  threads, GPU request, envvars, ...) is valid. When both plugins are importable, Snakemake must
  also accept the full profile (`--list-rules` parses every option, plugin settings included,
  and contacts neither the cluster nor the bucket); otherwise the plugin options are checked
  against the settings of the pinned plugin versions, recorded below.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, venv_bin

PROFILES = REPO / "workflow" / "profiles"
KUBERNETES = PROFILES / "kubernetes"
SLURM = PROFILES / "slurm"
DOCKERFILE = REPO / "Dockerfile"

# ExecutorSettings of snakemake-executor-plugin-kubernetes 0.5.1 (as --kubernetes-<name> options)
# and the settings of snakemake-storage-plugin-s3 0.3.6 (as --storage-s3-<name>): the versions
# pinned in workflow/profiles/kubernetes/requirements.txt.
KUBERNETES_PLUGIN_OPTIONS = {"namespace", "cpu-scalar", "service-account-name", "privileged",
                             "persistent-volumes", "omit-job-cleanup"}
S3_PLUGIN_OPTIONS = {"max-requests-per-second", "endpoint-url", "region", "access-key", "secret-key", "token",
                     "signature-version", "retries"}
PLUGIN_PINS = {"snakemake-executor-plugin-kubernetes": "0.5.1", "snakemake-storage-plugin-s3": "0.3.6"}

# Executor and storage options left out of the Kubernetes profile's dry run (see the docstring).
CLUSTER_ONLY = ("executor", "kubernetes-", "default-storage-", "storage-")


def load(profile: Path) -> dict:
    config = yaml.safe_load((profile / "config.yaml").read_text())
    assert isinstance(config, dict) and config, f"{profile}/config.yaml is not a mapping"
    return config


def workflow_rules() -> set[str]:
    files = [REPO / "workflow" / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    return {m.group(1) for f in files for m in re.finditer(r"^rule (\w+)\s*:", f.read_text(), re.M)}


def plugins_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None
               for m in ("snakemake_executor_plugin_kubernetes", "snakemake_storage_plugin_s3"))


def has_option(help_text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-])--{re.escape(option)}(?![\w-])", help_text) is not None


def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    """`snakemake ARGS` in cwd, with the copy's code and no tracking server unless given."""
    environment = {**os.environ, "PYTHONPATH": str(cwd / "src")}
    environment.pop("MLFLOW_TRACKING_URI", None)
    environment.update(env)
    return subprocess.Popen([venv_bin("snakemake"), *args], cwd=cwd, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def snakemake(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return finish(start(args, cwd, **env))


def job_stats(output: str) -> dict[str, int]:
    """The `Job stats` table of a (dry) run: rule -> number of jobs."""
    table = output[output.index("Job stats:"):].splitlines()[3:]
    stats = {}
    for line in table:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        stats[parts[0]] = int(parts[1])
    return stats


def project_copy(tmp_path: Path, name: str) -> Path:
    """Code, workflow and the real params.yaml, without any data or results."""
    root = tmp_path / name
    root.mkdir()
    for item in ("src", "workflow"):
        shutil.copytree(REPO / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    return root


# ---------------------------------------------------------------------------------------------
# 1. The profiles name only rules and options that exist


@pytest.mark.parametrize("profile", [SLURM, KUBERNETES], ids=["slurm", "kubernetes"])
def test_profile_names_only_rules_of_the_workflow(profile):
    config = load(profile)
    rules = workflow_rules()
    assert {"download", "partition", "train", "aggregate"} <= rules
    for key in ("set-threads", "set-resources"):
        named = set(config.get(key) or {})
        assert named, f"{profile.name}: no {key}"
        assert named <= rules, f"{profile.name}: {key} names unknown rules {sorted(named - rules)}"
    for rule, resources in config["set-resources"].items():
        assert isinstance(resources, dict) and resources, (profile.name, rule)
    for resources in [config["default-resources"], *config["set-resources"].values()]:
        for name in ("mem_mb", "runtime", "disk_mb"):
            if name in resources:
                assert isinstance(resources[name], int) and resources[name] > 0, (profile.name, name)


@pytest.mark.parametrize("profile", [SLURM, KUBERNETES], ids=["slurm", "kubernetes"])
def test_profiles_leave_training_threads_to_params(profile):
    """A training job's thread count changes its numbers in the last bits (and the run id leaves it out),
    so no cluster profile may override the `training.<suite>.threads` that a local run uses: cluster and
    local results are equal."""
    config = load(profile)
    training_rules = {"train"} | {f"train_seeds_{suite}" for suite in yaml.safe_load(
        (REPO / "params.yaml").read_text())["suites"]}
    assert not training_rules & set(config["set-threads"]), config["set-threads"]
    assert not any("threads" in str(resources) for resources in config["set-resources"].values())


@pytest.mark.slow
def test_profile_options_are_snakemake_options():
    help_text = snakemake(["--help"], REPO).stdout
    assert has_option(help_text, "default-storage-provider") and has_option(help_text, "envvars")
    with_plugins = plugins_installed()
    for profile in (SLURM, KUBERNETES):
        for key in load(profile):
            if key.startswith("kubernetes-") and not with_plugins:
                assert key.removeprefix("kubernetes-") in KUBERNETES_PLUGIN_OPTIONS, key
            elif key.startswith("storage-s3-") and not with_plugins:
                assert key.removeprefix("storage-s3-") in S3_PLUGIN_OPTIONS, key
            else:
                assert has_option(help_text, key), f"{profile.name}: `{key}` is no option of `snakemake --help`"


# ---------------------------------------------------------------------------------------------
# 2. The profiles plan the workflow


@pytest.mark.slow
def test_slurm_and_kubernetes_profiles_plan_the_same_jobs(tmp_path):
    # The Kubernetes profile without its executor and storage options (a copy, see the docstring).
    local = {k: v for k, v in load(KUBERNETES).items() if not k.startswith(CLUSTER_ONLY)}
    assert "set-resources" in local and "envvars" in local
    copy = tmp_path / "kubernetes-local"
    copy.mkdir()
    (copy / "config.yaml").write_text(yaml.safe_dump(local, sort_keys=False))

    # Three dry runs at once, each in its own copy of the project.
    runs = {"slurm": start(["-n", "--profile", str(SLURM)], project_copy(tmp_path, "slurm")),
            "unset": start(["-n", "--profile", str(copy)], project_copy(tmp_path, "unset")),
            "kubernetes": start(["-n", "--profile", str(copy)], project_copy(tmp_path, "kubernetes"),
                                MLFLOW_TRACKING_URI="http://mlflow.invalid:5000")}
    slurm, unset, kubernetes = (finish(runs[name]) for name in ("slurm", "unset", "kubernetes"))

    assert slurm.returncode == 0, slurm.stderr[-3000:]
    planned = job_stats(slurm.stdout)
    assert planned.get("train", 0) > 0 and planned.get("download", 0) > 0, planned
    # envvars: an unset MLFLOW_TRACKING_URI stops Snakemake before any job.
    assert unset.returncode != 0 and "MLFLOW_TRACKING_URI" in unset.stdout + unset.stderr
    assert kubernetes.returncode == 0, kubernetes.stderr[-3000:]
    assert job_stats(kubernetes.stdout) == planned
    # Every training job asks for one NVIDIA GPU, the way the plugin reads it.
    trains = re.findall(r"^rule train:\n(?:    .*\n)*?    resources: (.*)$", kubernetes.stdout, re.M)
    assert len(trains) == planned["train"]
    assert all("gpu=1" in r.split(", ") and "gpu_manufacturer=nvidia" in r.split(", ") for r in trains)

    if plugins_installed():  # the full profile as it is, plugin settings included
        full = snakemake(["--profile", str(KUBERNETES), "--list-rules"], tmp_path / "kubernetes")
        assert full.returncode == 0, full.stderr[-3000:]
        assert "train" in full.stdout.split()


# ---------------------------------------------------------------------------------------------
# The Kubernetes profile agrees with itself, its volume and its pinned plugins


def test_kubernetes_profile_links_agree_with_the_bucket_and_the_volume():
    config = load(KUBERNETES)
    assert config["executor"] == "kubernetes"
    assert config["default-storage-provider"] == "s3"
    assert config["keep-storage-local-copies"] is True  # the pods' copies are the shared volume's files
    assert "MLFLOW_TRACKING_URI" in config["envvars"]
    bucket, prefix = re.fullmatch(r"s3://([^/]+)/(.+?)/?", config["default-storage-prefix"]).groups()
    [volume] = config["kubernetes-persistent-volumes"]
    claim, mount = volume.split(":")
    assert claim and mount.startswith("/")

    commands = [shlex.split(c) for c in config["precommand"].split("&&")]
    links = {c[-1]: c[-2] for c in commands if c[:2] == ["ln", "-sfn"]}
    made = {path for c in commands if c[:2] == ["mkdir", "-p"] for path in c[2:]}
    # A pod's copy of a bucket file lies under .snakemake/storage/s3/<bucket>/<prefix>/: the working directory.
    assert links[f".snakemake/storage/s3/{bucket}/{prefix}"] == "$(pwd)"
    assert str(Path(f".snakemake/storage/s3/{bucket}/{prefix}").parent) in made
    # The files the rules do not declare live on the shared volume.
    shared = {"data/raw": f"{mount}/data/raw", "data/partitions": f"{mount}/data/partitions",
              "results/runs": f"{mount}/results/runs", "results/checkpoints": f"{mount}/results/checkpoints"}
    for link, target in shared.items():
        assert links[link] == target and target in made, link
        assert str(Path(link).parent) in {".", *made}
    # Git-tracked files come with every job's sources; none may land on the shared volume.
    tracked = subprocess.run(["git", "ls-files", *shared], cwd=REPO, capture_output=True, text=True)
    assert tracked.returncode == 0 and tracked.stdout == "", tracked.stdout

    train = config["set-resources"]["train"]
    assert train["gpu"] >= 1 and train["gpu_manufacturer"] in ("nvidia", "amd")  # the plugin needs both


def test_kubernetes_plugins_are_pinned_beside_the_lock():
    pins = pinned(KUBERNETES / "requirements.txt")
    lock = pinned(REPO / "requirements.lock")
    assert {name: pins.get(name) for name in PLUGIN_PINS} == PLUGIN_PINS
    assert all(lock.get(name, version) == version for name, version in pins.items()), "conflicts with the lock"
    header = (KUBERNETES / "config.yaml").read_text().split("\n", 1)[0]
    assert f"snakemake-executor-plugin-kubernetes {PLUGIN_PINS['snakemake-executor-plugin-kubernetes']}" in header


def pinned(path: Path) -> dict[str, str]:
    """name -> version of a requirements file in which every requirement is `name==version`."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
            assert match, f"{path.name}: not an exact pin: {line}"
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


# ---------------------------------------------------------------------------------------------
# 3. The Dockerfile installs the locked environment


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.lstrip().startswith("#"):
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            lines.append(current.strip())
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def copies() -> dict[str, str]:
    """COPY source -> destination (relative destinations resolved against WORKDIR)."""
    result, workdir = {}, "/"
    for name, args in instructions():
        if name == "WORKDIR":
            workdir = args
        elif name == "COPY":
            *sources, destination = [a for a in shlex.split(args) if not a.startswith("--")]
            target = destination if destination.startswith("/") else f"{workdir}/{destination}"
            for source in sources:
                into = target.endswith("/") and not source.endswith("/")  # a file copied into a folder
                result[source] = os.path.normpath(f"{target}/{Path(source).name}" if into else target)
    return result


def env_sh_install() -> tuple[list[str], set[str]]:
    """scripts/env.sh's `pip install`: the environment it runs in (`env -u ... PIP_CONFIG_FILE=...`) and its flags."""
    text = (REPO / "scripts" / "env.sh").read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if "pip install" in line]
    words = shlex.split(line)
    interpreter = words.index("-m") - 1  # env ... "$shared/bin/python" -m pip install ...
    return words[:interpreter], {w for w in words[interpreter:] if w.startswith("--")}


def test_dockerfile_installs_exactly_the_lock_like_env_sh():
    runs = [args for name, args in instructions() if name == "RUN"]
    assert instructions()[0] == ("FROM", "python:3.11-slim")  # the Python of requires-python >= 3.11
    lock = copies()["requirements.lock"]
    extras = copies()["workflow/profiles/kubernetes/requirements.txt"]

    installs = [shlex.split(part) for run in runs for part in run.split("&&") if "pip install" in part]
    assert installs, "no pip install"
    # env.sh's environment (local pip configuration and extra indexes ignored, so the default index,
    # PyPI, serves torch and torchvision as a pair) and its flags (--no-deps, --no-cache-dir, ...).
    environment, flags = env_sh_install()
    assert environment[0] == "env" and "PIP_CONFIG_FILE=/dev/null" in environment and "--no-deps" in flags
    for words in installs:
        assert words[:len(environment)] == environment, words
        assert flags <= set(words), f"pip install without {flags - set(words)}"
        assert not {"--index-url", "-i", "--extra-index-url", "--find-links", "-f"} & set(words)
        # No unpinned installs: only requirement files, each of exact pins.
        requirements = [words[i + 1] for i, w in enumerate(words) if w == "-r"]
        packages = [w for w in words[words.index("install") + 1:] if not w.startswith("-") and w not in requirements]
        assert packages == [], f"unpinned: {packages}"
        assert set(requirements) <= {lock, extras}
    assert any(lock in words for words in installs), "requirements.lock is not installed"
    assert any("pip check" in run for run in runs)

    # The wheels Snakemake's per-job plugin install uses come from the same pins, after the install.
    downloads = [shlex.split(p) for run in runs for p in run.split("&&") if "pip download" in p]
    for words in downloads:
        assert f"-c {lock}" in " ".join(words) and f"-r {extras}" in " ".join(words)
        assert "--no-index" not in words
        assert words[:len(environment)] == environment, words
    assert downloads, "no wheels for the per-job plugin install"
    offline = [i for i, (name, args) in enumerate(instructions()) if name == "ENV" and "PIP_NO_INDEX" in args]
    last_pip = max(i for i, (name, args) in enumerate(instructions()) if name == "RUN" and "pip" in args)
    assert offline and min(offline) > last_pip  # set after the install, which needs the index


def test_dockerfile_copies_existing_files_and_runs_as_a_user():
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for entry in (".venv", "data", "results", "mlflow.db", ".snakemake", "logs"):
        assert entry in ignored, f".dockerignore does not exclude {entry}"
    sources = copies()
    assert {"requirements.lock", "src/", "workflow/", "params.yaml"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        assert Path(source).parts[0] not in ignored and source.rstrip("/") not in ignored, f"{source} is ignored"

    env = " ".join(args for name, args in instructions() if name == "ENV")
    venv = re.search(r"VIRTUAL_ENV=(\S+)", env).group(1)
    assert f"PATH={venv}/bin:$PATH" in env  # `python`, `pip`, `snakemake` of the jobs: the locked ones
    assert f"PYTHONPATH={sources['src/'].rstrip('/')}" in env
    users = [args for name, args in instructions() if name == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    # The plugin starts every job as `/bin/sh -c ...`: no ENTRYPOINT in the way, a CMD of the venv.
    assert "ENTRYPOINT" not in [name for name, _ in instructions()]
    [cmd] = [yaml.safe_load(args) for name, args in instructions() if name == "CMD"]
    assert cmd[:3] == ["python", "-m", "fedskew"] and (REPO / "src" / "fedskew" / "__main__.py").exists()


def test_profile_image_is_built_from_the_dockerfile():
    image = load(KUBERNETES)["container-image"]
    repository, tag = image.rsplit(":", 1)
    assert repository.rsplit("/", 1)[-1] == "fedskew" and tag
    built = re.search(r"docker build -t ([^\s:]+):", DOCKERFILE.read_text())
    assert built and built.group(1).rsplit("/", 1)[-1] == "fedskew"
