"""The commit a run records (fedskew.provenance.commit): the checkout's HEAD, marked when the sources differ."""

from __future__ import annotations

import subprocess

import pytest

from fedskew import provenance


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    """A git checkout whose src/fedskew is the source root provenance reads."""
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    source = tmp_path / "src" / "fedskew"
    source.mkdir(parents=True)
    (source / "method.py").write_text("RATE = 1\n")
    (tmp_path / "notes.md").write_text("notes\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    monkeypatch.setattr(provenance, "SOURCE_ROOT", source)
    provenance.commit.cache_clear()
    yield source, git("rev-parse", "HEAD")
    provenance.commit.cache_clear()


def test_a_clean_checkout_records_its_head(checkout):
    _, head = checkout
    assert provenance.commit() == head


def test_changed_or_new_sources_mark_the_commit_dirty(checkout):
    source, head = checkout
    (source / "method.py").write_text("RATE = 2\n")
    assert provenance.commit() == f"{head}+dirty"
    provenance.commit.cache_clear()
    (source / "method.py").write_text("RATE = 1\n")
    (source / "new_method.py").write_text("")
    assert provenance.commit() == f"{head}+dirty"


def test_changes_outside_the_sources_leave_the_commit_clean(checkout):
    source, head = checkout
    (source.parent.parent / "notes.md").write_text("edited\n")
    assert provenance.commit() == head


def test_without_git_the_commit_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "SOURCE_ROOT", tmp_path)
    monkeypatch.setenv("FEDSKEW_COMMIT", "abc123")
    provenance.commit.cache_clear()
    try:
        assert provenance.commit() == "abc123"
    finally:
        provenance.commit.cache_clear()
