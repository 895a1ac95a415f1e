"""The repository cites only what it holds: no file points readers to the methods notes that were never
part of it (an upper-case `METHODS` markdown file), and none to an issue tracker they cannot open ("issue"
followed by a number). A fact from either belongs in docs/methods.md or docs/design.md, or in the docstring
of the code it concerns, and is cited there.

Every file git knows of (tracked, or new and not ignored) is read, except results/, which the workflow
generates, and binary files. A failure names each file and line.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import REPO

# Built from pieces so that neither this file nor its compiled form matches its own patterns.
MISSING_NOTES = re.compile("METHODS" + r"\.md")
# The word issue or issues, then a number (with or without "#"), also with the number on the next line of a
# comment.
TRACKER = re.compile(r"\b[Ii]ssues?[ \t]*(?:\n[ \t]*(?:#|//|\*)?[ \t]*)?#?\d+")
GENERATED = ("results/",)


def repository_files() -> list[str]:
    """The files git knows of (tracked, and new ones not ignored), relative to the repository root."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                                cwd=REPO, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of the repository's files")
    return sorted({name for name in listed.stdout.decode().split("\0") if name})


def text_of(name: str) -> str | None:
    """The file's text, or None for a binary file (or one that is gone from the work tree)."""
    path = REPO / name
    if not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def citations_in(text: str) -> list[tuple[int, str]]:
    """(line, what) for every citation of the missing notes or of an issue number in `text`."""
    found = [(match.start(), match.group(0)) for pattern in (MISSING_NOTES, TRACKER)
             for match in pattern.finditer(text)]
    return sorted((text.count("\n", 0, start) + 1, " ".join(cited.split())) for start, cited in found)


def test_the_patterns_find_what_they_are_for() -> None:
    notes, issue = ".".join(("METHODS", "md")), "".join(("iss", "ue"))  # not folded into one constant
    assert citations_in(f"ok\nsee {notes}, Models\n") == [(2, notes)]
    text = f"a\n{issue.title()} 12's target\n({issue}s 9 and 22)\n{issue} #5\n"
    assert [line for line, _ in citations_in(text)] == [2, 3, 4]
    assert citations_in(f"# the target of\n# {issue}\n# 12 holds\n") == [(2, f"{issue} # 12")]
    assert citations_in(f"docs/methods.md, t{issue} 3, {issue}s of numerics, FL-bench's port\n") == []


def test_no_file_cites_the_missing_notes_or_an_issue_number() -> None:
    problems = []
    for name in repository_files():
        if name.startswith(GENERATED):
            continue
        text = text_of(name)
        if text is None:
            continue
        problems += [f"{name}:{line}: cites {cited!r}" for line, cited in citations_in(text)]
    assert not problems, ("say what is meant instead (the requirement, or a heading of docs/design.md or "
                          "docs/methods.md):\n" + "\n".join(problems))
