"""Every shell command the README, the docs and the examples' READMEs show names something real: a make target,
a `python -m fedskew` command, a file, a Snakemake rule or profile, a suite. A renamed target or
command then fails here instead of in a newcomer's terminal."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from fedskew.cli import build_parser
from tests.helpers import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
        "benchmarks/README.md", "data/README.md",
        *sorted(str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*/README.md"))]
SHELL_FENCES = ("bash", "sh", "shell")
# Inline code that is a command a reader would paste (the fenced blocks are all checked).
INLINE_PREFIXES = ("make ", "python -m fedskew ", "snakemake ", ".venv/bin/python ", "bash scripts/")
# Other programs the docs use, with the subcommands they may name (None: any).
EXTERNAL = {"dvc": {"repro", "status", "push", "pull", "commit", "remote", "metrics", "plots", "dag", "init"},
            "mlflow": {"ui", "server"}, "apt-get": {"install", "update"}, "git": None, "cd": None, "source": None,
            "export": None, "pip": None, "docker": None, "kubectl": None, "sbatch": None, "squeue": None,
            "sacct": None, "sinfo": None, "scancel": None, "scontrol": None, "qemu-x86_64": None,
            "mkdir": None, "cp": None}


def shell_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of a shell fence, and every inline command."""
    found = []
    for name in DOCS:
        text = (REPO / name).read_text()
        for match in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
            if match.group(1) not in SHELL_FENCES:
                continue
            body = re.sub(r"\\\n\s*", " ", match.group(2))  # join continued lines
            for line in body.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    found.append((name, line))
        for code in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
            if code.startswith(INLINE_PREFIXES) and "<" not in code.split()[1]:
                found.append((name, code))
    return found


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def fedskew_commands() -> dict[str, set[str]]:
    """The CLI's commands, and each command's own subcommands (packed's)."""
    commands: dict[str, set[str]] = {}
    subparsers = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in subparsers.choices.items():
        nested = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        commands[name] = set(nested[0].choices) if nested else set()
    return commands


def snakemake_rules() -> set[str]:
    text = "".join(p.read_text() for p in [REPO / "workflow/Snakefile", *(REPO / "workflow/rules").glob("*.smk")])
    return set(re.findall(r"^rule (\w+):", text, re.M))


SUITES = set(yaml.safe_load((REPO / "params.yaml").read_text())["suites"])


def problems_of(command: str) -> list[str]:
    """What in `command` names nothing real (empty when all is well)."""
    problems = []
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", command):
        part = re.sub(r"\$\([^)]*\)", "VALUE", part).replace("~", "HOME")  # $(git rev-parse HEAD) and the like
        words = shlex.split(part, posix=True) if part else []
        while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in ("sudo", "time", "nohup")):
            words = words[1:]  # VAR=value prefixes, sudo
        if not words:
            continue
        program, args = words[0], words[1:]
        for flag, value in zip(args, args[1:]):
            if flag == "--suite" and not value.startswith("<") and value not in SUITES:
                problems.append(f"--suite {value}: no such suite in params.yaml")
        if program == "make":
            problems += [f"make {t}: no such target" for t in args if "=" not in t and t not in make_targets()]
        elif program.endswith(("python", "python3")):
            problems += _python_problems(args)
        elif program == "bash" or program.endswith(".sh"):
            script = args[0] if program == "bash" else program
            if not (REPO / script).is_file():
                problems.append(f"{script}: no such file")
        elif program == "snakemake":
            problems += _snakemake_problems(args)
        elif program in EXTERNAL:
            allowed = EXTERNAL[program]
            if allowed is not None and args and args[0] not in allowed:
                problems.append(f"{program} {args[0]}: not a {program} command the docs should name")
        else:
            problems.append(f"{program}: not a known command (add it to EXTERNAL in this test if it is real)")
    return problems


def _python_problems(args: list[str]) -> list[str]:
    while args and args[0].startswith("-") and args[0] != "-m":
        args = args[1:]  # interpreter options
    if not args:
        return []
    if args[:2] == ["-m", "fedskew"]:
        commands = fedskew_commands()
        rest = args[2:]
        if not rest or rest[0] not in commands:
            return [f"python -m fedskew {' '.join(rest[:1])}: no such command ({', '.join(sorted(commands))})"]
        nested = commands[rest[0]]
        if nested and len(rest) > 1 and not rest[1].startswith("-") and rest[1] not in nested:
            return [f"python -m fedskew {rest[0]} {' '.join(rest[1:2])}: no such subcommand"]
        return []
    if args[:2] == ["-m", "pytest"]:
        paths = [a for a in args[2:] if a.startswith("tests")]
        return [f"{p}: no such test path" for p in paths if not (REPO / p).exists()]
    if args[0] == "-m":
        return []
    return [] if (REPO / args[0]).is_file() else [f"{args[0]}: no such file"]


def _snakemake_problems(args: list[str]) -> list[str]:
    problems = []
    for flag, value in zip(args, args[1:]):
        if flag == "--profile" and not (REPO / value).is_dir():
            problems.append(f"--profile {value}: no such profile folder")
    options_with_values = {"--cores", "--profile", "--report", "-j", "--jobs", "--forcerun", "--until"}
    for previous, word in zip(["", *args], args):
        if word.startswith("-") or previous in options_with_values or "=" in word:
            continue  # an option, its value, or a key=value pair (--default-resources, --config)
        if "/" not in word and "." not in word and word not in snakemake_rules():
            problems.append(f"snakemake {word}: no such rule")
    return problems


COMMANDS = shell_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) > 40 and {where for where, _ in COMMANDS} >= {"README.md", "docs/gpu.md"}


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}: {c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_names_something_real(where, command):
    assert problems_of(command) == [], f"{where}: `{command}`"


@pytest.mark.parametrize("command, problem", [
    ("make rnu", "make rnu: no such target"),
    ("python -m fedskew trian --suite default", "python -m fedskew trian: no such command"),
    ("python -m fedskew packed shipp", "python -m fedskew packed shipp: no such subcommand"),
    (".venv/bin/python benchmarks/nothing.py --rounds 2", "benchmarks/nothing.py: no such file"),
    ("snakemake --profile workflow/profiles/slurmm", "--profile workflow/profiles/slurmm: no such profile folder"),
    ("snakemake --cores all report_al", "snakemake report_al: no such rule"),
    ("python -m fedskew verify --suite defualt", "--suite defualt: no such suite in params.yaml"),
    ("fedskew-train x", "fedskew-train: not a known command"),
])
def test_a_wrong_command_is_caught(command, problem):
    assert any(p.startswith(problem) for p in problems_of(command)), problems_of(command)
