"""The guides to a method of one's own show what runs: docs/own-method.md's server method (FedAvgM) and
docs/methods.md's fold are, line for line, the code of the files they come from, so a renamed hook, a changed
sign or a dropped line of the state fails here and not in a reader's package; and the commands of the guide and
of the examples' READMEs name what exists (the `new` command's options as fedskew's parser reads them, the
examples' folders and experiment files, a suite behind every table they build). test_doc_commands.py checks
that each command names a real program, command or rule; this checks what the guide's own commands name."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from fedskew.cli import build_parser
from tests.helpers import REPO
from tests.unit.test_doc_commands import shell_commands

GUIDE = "docs/own-method.md"
EXAMPLE_READMES = sorted(str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*/README.md"))

# Each Python block of the docs that shows real code, by its first line: the file it is taken from.
SHOWN = [
    (GUIDE, "from typing import Any", "examples/fedavgm/fedavgm/method.py"),
    (GUIDE, "    def state_dict(self) -> dict[str, Any]:", "examples/fedavgm/fedavgm/method.py"),
    ("docs/methods.md", "class _NormalizedFold(Fold):", "src/fedskew/fl/fednova.py"),
]


def python_blocks(doc: str) -> list[list[str]]:
    """The Python fences of `doc`, each as its lines without the fence's own indentation (a list item's)."""
    text = (REPO / doc).read_text()
    return [[line.removeprefix(match.group(1)) for line in match.group(2).splitlines()]
            for match in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M)]


def missing_lines(shown: list[str], source: list[str]) -> list[str]:
    """The lines of `shown` that are not, in their order and with their indentation, lines of `source` (blank
    lines aside: the docs may leave out docstrings and comments, never change a line)."""
    rest = iter(line.rstrip() for line in source)
    return [line for line in shown if line.strip() and line.rstrip() not in rest]


@pytest.mark.parametrize("doc, first, source", SHOWN, ids=[f"{d}: {f.strip()}" for d, f, _ in SHOWN])
def test_a_block_of_code_in_the_docs_is_its_files_code_line_for_line(doc, first, source) -> None:
    blocks = [block for block in python_blocks(doc) if block and block[0] == first]
    assert len(blocks) == 1, f"{doc} has no single Python block starting {first!r}"
    assert len([line for line in blocks[0] if line.strip()]) >= 8
    assert missing_lines(blocks[0], (REPO / source).read_text().splitlines()) == []


def test_a_changed_or_reordered_line_is_caught() -> None:
    source = ["def f(x):", "    y = x - 1", "    return y"]
    assert missing_lines(["def f(x):", "", "    return y"], source) == []
    assert missing_lines(["def f(x):", "    y = 1 - x"], source) == ["    y = 1 - x"]
    assert missing_lines(["    return y", "    y = x - 1"], source) == ["    y = x - 1"]
    assert missing_lines(["def f(x):", "y = x - 1"], source) == ["y = x - 1"]  # its indentation is part of it


def _commands(*docs: str) -> list[tuple[str, list[str]]]:
    """(doc, words) of every command line of `docs`, split at && and ;."""
    return [(doc, shlex.split(part)) for doc, command in shell_commands() if doc in docs
            for part in re.split(r"\s*(?:&&|;)\s*", command) if part]


def test_the_guides_new_commands_parse_as_fedskew_reads_them() -> None:
    news = [words for _, words in _commands(GUIDE) if words[:4] == ["python", "-m", "fedskew", "new"]]
    assert ["--kind", "server"] == next(w[w.index("--kind"):][:2] for w in news if "--kind" in w)
    for words in news:
        args = build_parser().parse_args(words[3:])  # a wrong option exits here, naming it
        assert args.kind == "method" and args.name in ("fedfocal", "fedavgm")


def test_the_examples_the_docs_install_and_copy_exist() -> None:
    named = [(doc, word) for doc, words in _commands(GUIDE, *EXAMPLE_READMES) if words[:1] in (["pip"], ["cp"])
             for word in words[1:] if word.startswith("examples/")]
    assert {word for _, word in named} >= {"examples/fedavgm", "examples/fedavgm/experiments/momentum.yaml",
                                           "examples/fedfocal", "examples/fedfocal/experiments/focal.yaml"}
    assert [f"{doc}: {word}" for doc, word in named if not (REPO / word).exists()] == []


def _suites_of(path: Path) -> set[str]:
    return set(yaml.safe_load(path.read_text())["suites"])


def test_every_table_the_examples_build_is_a_suite_of_their_experiments() -> None:
    experiments = {path.parents[1].name: _suites_of(path) for path in (REPO / "examples").glob("*/experiments/*.yaml")}
    assert experiments == {"fedfocal": {"focal"}, "fedavgm": {"momentum"}}
    generated = {words[5] for _, words in _commands(GUIDE) if words[3:5] == ["new", "method"]}  # their suite's name
    known = set().union(*experiments.values()) | generated | _suites_of(REPO / "params.yaml")
    for doc in (GUIDE, *EXAMPLE_READMES):
        targets = [word for _, words in _commands(doc) if words[:1] == ["snakemake"] for word in words
                   if word.startswith("results/tables/")]
        assert targets, f"{doc} builds no table"
        suites = {re.fullmatch(r"results/tables/(?:compare/)?([\w.-]+)\.md", t).group(1) for t in targets}
        assert suites <= known, f"{doc}: {sorted(suites - known)} is no suite"
    readme = (REPO / "examples/fedavgm/README.md").read_text()
    assert "results/tables/momentum.md" in readme and "results/tables/compare/momentum.md" in readme
