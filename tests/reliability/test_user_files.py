"""A researcher's own YAML files are data: read strictly, in bounded time and memory, and validated once per change.

params.yaml, the experiments and the claims files all go through one reader (fedskew.user_files): a key written
twice is refused with both lines; an alias bomb is refused from its node graph before anything expands it; a file
over 4 MiB is refused from its size; a folder, a pipe or a device is refused from its metadata, and a link is
followed only inside the project, so that a link to /dev/zero or to a pipe is refused without being opened; a file
that is not UTF-8 is refused with its line and byte; editors' lock and backup files are not experiments. Each
refusal is one line naming the file, the line and the key path. A claims file's magnitude `x` must be a finite
number >= 0, named by its line and key when it is not.

A configuration that passed validation is kept (fedskew.params_cache) under the hash of every byte validation
read, fedskew's code and the installed plugins, so that a job reads it again in well under 0.1 s; a cache that is
altered, truncated or stale is rebuilt, never trusted, and a failure is never kept: an invalid file or a broken
plugin is reported on every call.
"""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedskew import params_cache, user_files
from fedskew.cli import main
from fedskew.config import ConfigError, load_params
from tests.helpers import REPO, TINY_PARAMS, venv_bin

# Nine levels of nine aliases: a few hundred bytes that expand to 9^10 (about 3.5 billion) values.
BOMB = "\n".join(["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"
EXPERIMENT = {"suites": {"mine": {"settings": [{"dataset": "digits", "partitions": ["dir0.5"]}],
                                  "methods": ["fedavg"], "seeds": [0]}},
              "training": {"mine": {"inherit": "tiny"}}}
CLAIMS = """suite: tiny
claims:
  - id: c1
    statement: FedLC beats FedAvg by a point
    word: by X %
    x: 1.0
    subject: fedlc
    against: [fedavg]
    columns: [digits / dir0.5]
"""


def _project(root: Path, experiments: dict[str, str] | None = None) -> Path:
    """The tiny project in `root`, with experiment files (name -> text) in experiments/."""
    (root / "experiments").mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS, sort_keys=False))
    for name, text in (experiments or {}).items():
        (root / "experiments" / name).write_text(text)
    return root


def _validate(root: Path, capsys) -> tuple[int, str, str]:
    """`fedskew validate` of the project in `root`, in this process: exit code, stdout, stderr."""
    code = main(["--params", str(root / "params.yaml"), "validate"])
    out, err = capsys.readouterr()
    return code, out, err


def _fedskew(root: Path, *args: str, pythonpath: tuple[Path, ...] = (), timeout: float = 60):
    """`python -m fedskew` in the project `root` as a process of its own, bounded by `timeout`; with its time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (REPO / "src", *pythonpath)))}
    env.pop("MLFLOW_TRACKING_URI", None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done, time.monotonic() - start


def _refusal(err: str) -> str:
    """The one line a command printed to refuse its input."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- a key written twice -------------------------------------------------------------------------------------------

def test_a_key_written_twice_in_params_yaml_is_refused_with_its_key_path_and_both_lines(tmp_path, capsys) -> None:
    root = _project(tmp_path)
    text = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(text.replace("    lr: 0.05\n", "    lr: 0.05\n    lr: 0.5\n"))
    second = text[:text.index("    lr: 0.05\n")].count("\n") + 2
    code, _, err = _validate(root, capsys)
    assert code == 2
    assert (f"params.yaml: line {second}: training.tiny.lr: key 'lr' is written twice in one mapping, on lines "
            f"{second - 1} and {second}; keep one of them") in _refusal(err)


def test_a_key_written_twice_in_an_experiment_is_refused_naming_the_file_and_the_line(tmp_path, capsys) -> None:
    text = yaml.safe_dump(EXPERIMENT, sort_keys=False).replace("    seeds:\n", "    seeds: [1]\n    seeds:\n")
    code, _, err = _validate(_project(tmp_path, {"mine.yaml": text}), capsys)
    line = text[:text.index("    seeds:\n")].count("\n") + 1
    assert code == 2
    assert _refusal(err).endswith(f"experiments/mine.yaml: line {line}: suites.mine.seeds: key 'seeds' is written "
                                  f"twice in one mapping, on lines {line - 1} and {line}; keep one of them")


def test_a_key_written_twice_in_a_claims_file_is_refused_and_no_ledger_is_written(tmp_path, capsys,
                                                                                   monkeypatch) -> None:
    root = _project(tmp_path)
    (root / "experiments/claims").mkdir()
    (root / "experiments/claims/mine.yaml").write_text(CLAIMS.replace("    subject: fedlc\n",
                                                                      "    subject: fedlc\n    subject: fedavg\n"))
    monkeypatch.chdir(root)
    assert main(["claims", "--file", "experiments/claims/mine.yaml"]) == 2
    assert _refusal(capsys.readouterr().err).endswith(
        "experiments/claims/mine.yaml: line 8: claims[0].subject: key 'subject' is written twice in one mapping, on "
        "lines 7 and 8; keep one of them")
    assert not (root / "results").exists()


# --- bounded: aliases, size, what a file is ------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["params.yaml", "experiments/bomb.yaml"])
def test_an_alias_bomb_is_refused_before_it_expands_in_well_under_5_s(tmp_path, where) -> None:
    root = _project(tmp_path)
    (root / where).write_text(BOMB if where != "params.yaml" else (root / where).read_text() + BOMB)
    done, seconds = _fedskew(root, "validate")
    assert done.returncode == 2 and seconds < 5, (seconds, done.stderr[-2000:])
    line = _refusal(done.stderr)
    assert f"{where}: line " in line and "holds more than 200,000 values once its aliases (*name) are expanded" in line


def test_snakemake_refuses_an_alias_bomb_in_params_yaml_before_any_job(tmp_path) -> None:
    root = _project(tmp_path)
    (root / "params.yaml").write_text((root / "params.yaml").read_text() + BOMB)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([venv_bin("snakemake"), "-n", "-s", str(REPO / "workflow/Snakefile")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "params.yaml: line " in output and "once its aliases (*name) are expanded" in output, output
    assert not (root / "results").exists() and not (root / "data").exists()


@pytest.mark.parametrize("where", ["params.yaml", "experiments/big.yaml"])
def test_a_50_mb_file_is_refused_by_its_size_without_being_read(tmp_path, capsys, where) -> None:
    root = _project(tmp_path)
    with open(root / where, "ab") as file:
        file.truncate(50_000_000)  # sparse: 50 MB as the file system reports it
    start = time.monotonic()
    code, _, err = _validate(root, capsys)
    assert code == 2 and time.monotonic() - start < 5
    assert f"{where}: 50,000,000 bytes, more than the 4,194,304 a YAML file of fedskew may hold" in _refusal(err)


def test_a_link_to_dev_zero_or_to_a_pipe_is_refused_without_being_opened(tmp_path) -> None:
    root = _project(tmp_path / "project")
    (root / "experiments/zero.yaml").symlink_to("/dev/zero")
    done, seconds = _fedskew(root, "validate")
    assert done.returncode == 2 and seconds < 5, (seconds, done.stderr[-2000:])
    assert "experiments/zero.yaml: a link to /dev/zero, outside the project" in _refusal(done.stderr)
    # A pipe with no writer: opening it would wait forever, so a prompt refusal proves it was never opened.
    (root / "experiments/zero.yaml").unlink()
    os.mkfifo(tmp_path / "pipe")
    (root / "experiments/pipe.yaml").symlink_to(tmp_path / "pipe")
    done, seconds = _fedskew(root, "validate")
    assert done.returncode == 2 and seconds < 5
    assert "experiments/pipe.yaml: a link to " in _refusal(done.stderr)
    (root / "experiments/pipe.yaml").unlink()
    os.mkfifo(root / "experiments/pipe.yaml")  # inside the project: refused for what it is
    done, seconds = _fedskew(root, "validate")
    assert done.returncode == 2 and seconds < 5
    assert "experiments/pipe.yaml: a named pipe (FIFO), not a file" in _refusal(done.stderr)


def test_a_link_is_followed_inside_the_project_and_refused_outside_it(tmp_path, capsys) -> None:
    root = _project(tmp_path / "project")
    (root / "shared").mkdir()
    (root / "shared/mine.yaml").write_text(yaml.safe_dump(EXPERIMENT))
    (root / "experiments/mine.yaml").symlink_to("../shared/mine.yaml")
    code, out, _ = _validate(root, capsys)
    assert code == 0 and "1 experiment file(s) valid" in out
    (tmp_path / "elsewhere.yaml").write_text(yaml.safe_dump(EXPERIMENT))
    (root / "experiments/mine.yaml").unlink()
    (root / "experiments/mine.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    code, _, err = _validate(root, capsys)
    assert code == 2
    assert (f"experiments/mine.yaml: a link to {tmp_path / 'elsewhere.yaml'}, outside the project ({root}); fedskew "
            "follows links only within the project: copy the file into it") in _refusal(err)


def test_a_file_that_is_not_utf8_is_refused_naming_its_line_and_byte(tmp_path, capsys) -> None:
    text = yaml.safe_dump(EXPERIMENT, sort_keys=False).encode()
    at = text.index(b"mine", text.index(b"training"))
    root = _project(tmp_path)
    (root / "experiments/mine.yaml").write_bytes(text[:at] + b"m\xe9ne" + text[at + 4:])
    code, _, err = _validate(root, capsys)
    line = text[:at].count(b"\n") + 1
    assert code == 2
    assert f"experiments/mine.yaml: line {line}: byte {at + 1} (0xe9) is not UTF-8; save the file as UTF-8" in \
        _refusal(err)


def test_a_folder_named_like_an_experiment_is_refused_in_one_line_naming_it(tmp_path, capsys) -> None:
    root = _project(tmp_path)
    (root / "experiments/x.yaml").mkdir()
    code, _, err = _validate(root, capsys)
    assert code == 2 and "experiments/x.yaml: a folder, not a file" in _refusal(err)


def test_editors_lock_and_backup_files_are_not_experiments_nor_claims(tmp_path, capsys) -> None:
    root = _project(tmp_path, {"mine.yaml": yaml.safe_dump(EXPERIMENT)})
    for folder in (root / "experiments", root / "experiments/claims"):
        folder.mkdir(exist_ok=True)
        (folder / ".#x.yaml").symlink_to("user@host.12345:1700000000")  # Emacs' lock: a dangling link
        for name in ("#x.yaml#", "x.yaml~", ".x.yaml.swp", ".hidden.yaml"):
            (folder / name).write_bytes(b"\xff{not: [yaml")
    code, out, err = _validate(root, capsys)
    assert code == 0 and "1 experiment file(s) valid" in out, err
    from fedskew.reproduce.own_claims import claims_files

    assert claims_files(root / "experiments/claims") == []


# --- claims' numbers -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("x", "says"), [
    ("-1", "-1 is negative; x is the size of the gap the sentence quotes, >= 0"),
    (".nan", ".nan is not a finite number"),
    (".inf", ".inf is not a finite number"),
    ("'5'", "'5' is not a number"),
])
def test_a_claims_magnitude_that_is_negative_or_not_finite_is_refused_naming_file_line_and_key(
        tmp_path, capsys, monkeypatch, x, says) -> None:
    root = _project(tmp_path)
    (root / "experiments/claims").mkdir()
    (root / "experiments/claims/mine.yaml").write_text(CLAIMS.replace("x: 1.0", f"x: {x}"))
    monkeypatch.chdir(root)
    assert main(["claims", "--file", "experiments/claims/mine.yaml"]) == 2
    err = capsys.readouterr().err
    assert "fedskew claims: experiments/claims/mine.yaml is invalid (1 problem(s)):" in err
    assert f"  - line 6: claims[0].x: {says}" in err
    assert "Traceback" not in err and not (root / "results").exists()


def test_a_papers_claim_with_a_negative_magnitude_is_refused_naming_file_line_and_key(tmp_path, monkeypatch) -> None:
    from fedskew.reproduce import claim

    shipped = claim.CLAIMS_DIR / "fedlc.yaml"
    text = shipped.read_text()
    assert text.count("    x: 9.07\n") == 1
    (tmp_path / "fedlc.yaml").write_text(text.replace("    x: 9.07\n", "    x: -9.07\n"))
    line = text[:text.index("    x: 9.07\n")].count("\n") + 1
    monkeypatch.setattr(claim, "CLAIMS_DIR", tmp_path)
    claim.load_claims.cache_clear()
    try:
        with pytest.raises(claim.ClaimError, match=rf"fedlc.yaml: line {line}: claims\[1\].x \(claim fedlc-02\): "
                                                   r"-9.07 is negative"):
            claim.load_claims()
    finally:
        claim.load_claims.cache_clear()


# --- the validated configuration, kept -----------------------------------------------------------------------------

@pytest.fixture
def validations(monkeypatch) -> list[str]:
    """The labels of the files fedskew.config validates (not reads from the cache), in order."""
    import fedskew.config as config

    seen: list[str] = []
    validate = config._validated

    def counted(raw, label, sources, lines=None):
        seen.append(label)
        return validate(raw, label, sources, lines)

    monkeypatch.setattr(config, "_validated", counted)
    return seen


def test_a_current_cache_gives_the_configuration_in_under_0_1_s_without_validating(tmp_path, validations) -> None:
    root = _project(tmp_path, {"mine.yaml": yaml.safe_dump(EXPERIMENT)})
    first = load_params(root / "params.yaml")
    assert len(validations) == 1 and params_cache.cache_file(root / "params.yaml").is_file()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        again = load_params(root / "params.yaml")
        times.append(time.perf_counter() - start)
    assert len(validations) == 1 and min(times) <= 0.1, times
    assert again.raw == first.raw and again.origins == first.origins and again.inherits == first.inherits
    assert [c.run_id for c in again.runs()] == [c.run_id for c in first.runs()]


@pytest.mark.parametrize("damage", ["altered", "truncated", "stale", "not a cache"])
def test_a_damaged_or_stale_cache_is_never_trusted_and_is_rebuilt(tmp_path, validations, damage) -> None:
    root = _project(tmp_path)
    load_params(root / "params.yaml")
    kept = params_cache.cache_file(root / "params.yaml")
    data = kept.read_bytes()
    assert b'"rounds":4' in data
    if damage == "altered":  # the body changed, the checksum left as it was
        kept.write_bytes(data.replace(b'"rounds":4', b'"rounds":9'))
    elif damage == "truncated":
        kept.write_bytes(data[:len(data) // 2])
    elif damage == "stale":  # a valid cache of other bytes: its own checksum right, its key another
        header, _, body = data.partition(b"\n")
        body = body.replace(b'"rounds":4', b'"rounds":9').replace(b'"key":"', b'"key":"0')
        kept.write_bytes(f"{params_cache.HEADER} {hashlib.sha256(body).hexdigest()}\n".encode() + body)
    else:
        kept.write_bytes(b"\x00" * 100)
    params = load_params(root / "params.yaml")
    assert params.raw["training"]["tiny"]["rounds"] == 4 and len(validations) == 2
    assert kept.read_bytes() == data  # rebuilt as it was
    load_params(root / "params.yaml")
    assert len(validations) == 2


def test_a_failure_is_never_kept_and_every_change_is_validated_again(tmp_path, validations, monkeypatch) -> None:
    root = _project(tmp_path, {"mine.yaml": yaml.safe_dump(EXPERIMENT)})
    load_params(root / "params.yaml")
    broken = copy.deepcopy(EXPERIMENT)
    broken["suites"]["mine"]["methods"] = ["fedavgg"]
    (root / "experiments/mine.yaml").write_text(yaml.safe_dump(broken))
    for _ in range(2):  # refused on every call, the valid configuration kept before notwithstanding
        with pytest.raises(ConfigError, match=r"experiments/mine.yaml: line \d+: suites.mine.methods\[0\]: 'fedavgg'"):
            load_params(root / "params.yaml")
    assert len(validations) == 3
    (root / "experiments/mine.yaml").write_text(yaml.safe_dump(EXPERIMENT))  # the bytes validated first: kept
    load_params(root / "params.yaml")
    assert len(validations) == 3
    monkeypatch.setattr(params_cache, "code_digest", lambda: "other code")  # fedskew's code changed
    load_params(root / "params.yaml")
    assert len(validations) == 4


def test_the_cache_is_git_ignored() -> None:
    done = subprocess.run(["git", "check-ignore", "-q", ".fedskew/validated-params.yaml.json"], cwd=REPO,
                          timeout=30)
    assert done.returncode == 0


def _plugin_site(site: Path, module_text: str) -> Path:
    """A distribution declaring partition scheme `broken` (module broken_scheme), as pip installs it into `site`."""
    site.mkdir(exist_ok=True)
    (site / "broken_scheme.py").write_text(module_text)
    info = site / "fedskew_broken-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedskew-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedskew.partitions]\nbroken = broken_scheme:Broken\n")
    return site


def test_a_plugin_that_fails_to_load_is_reported_on_every_call_whatever_the_cache_holds(tmp_path) -> None:
    root = _project(tmp_path / "project")
    done, _ = _fedskew(root, "runs", "--suite", "tiny")
    assert done.returncode == 0, done.stderr[-2000:]
    site = _plugin_site(tmp_path / "site", "raise RuntimeError('broken on import')\n")
    for _ in range(2):
        done, _ = _fedskew(root, "runs", "--suite", "tiny", pythonpath=(site,))
        assert done.returncode == 2 and "entry point 'broken'" in _refusal(done.stderr), done.stderr[-2000:]


def test_a_plugin_edited_in_place_changes_the_cache_key(tmp_path, monkeypatch) -> None:
    site = _plugin_site(tmp_path / "site", "Broken = None\n")
    monkeypatch.syspath_prepend(str(site))
    before = params_cache.plugin_entries()
    assert [entry[:5] for entry in before] == [["fedskew.partitions", "broken", "broken_scheme:Broken",
                                                "fedskew-broken", "0.1"]]
    (site / "broken_scheme.py").write_text("Broken = None  # edited, same version\n")
    assert params_cache.plugin_entries() != before


def test_the_reader_is_the_same_for_every_file_and_bounded_in_depth() -> None:
    deep = ("a: " + "[" * 150 + "]" * 150 + "\n").encode()
    with pytest.raises(ConfigError, match=r"^deep.yaml: (line 1: a(\[0\])+: nested more than 100 levels deep|"
                                          r"nested too deeply)"):
        user_files.parse(deep, "deep.yaml")
    with pytest.raises(ConfigError, match=r"^loop.yaml: line 1: a\[0\]: an alias refers to a value that contains"):
        user_files.parse(b"a: &a [*a]\n", "loop.yaml")
    merged = user_files.parse(b"base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n", "merge.yaml")
    assert merged.data == {"base": {"x": 1, "y": 2}, "c": {"x": 1, "y": 3}}
    assert merged.line(("c", "y")) == 4 and merged.line(("c", "x")) == 1
