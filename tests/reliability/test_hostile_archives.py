"""Archives from elsewhere are data, read within bounds: `packed import` refuses a decompression bomb before it
inflates it, and imports all of a call's runs or none of them, then logs every one of them to MLflow.

The bombs are small gzipped tars of a shipped run's real manifest and files around a gibibyte of zeros
(written without ever holding the zeros: a MiB of zeros deflates, after a full flush, to the same block every
time). Each one is imported in a fresh process whose peak memory is measured.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from fedskew import paths
from fedskew.config import load_params
from fedskew.packed import archive
from fedskew.packed.archive import MANIFEST, MAX_ARCHIVE_BYTES, ArchiveError, import_archives, ship
from fedskew.packed.commands import cmd_import
from fedskew.runfiles import write_run_files
from fedskew.tracking import RUN_KEY_TAG

RUN_FILES = ("config.yaml", "history.csv", "metrics.json")
GIB_IN_MIB = 1024
MIB_OF_ZEROS = bytes(2**20)


def _train(cfgs, root: Path, acc: float = 0.5, device: str = "cpu") -> None:
    """Run files as a finished training writes them (no training: the numbers are made up)."""
    for cfg in cfgs:
        write_run_files(cfg, [{"round": 1, "test_acc": acc, "test_loss": 1.0}],
                        {"status": "finished", "final_acc": acc, "final_loss": 1.0, "provenance": {"device": device}},
                        root)


def _shipped(params, cfgs, tmp_path: Path, name: str, **trained) -> Path:
    """One archive holding `cfgs`, trained in their own folder."""
    there = tmp_path / f"trained-{name}"
    _train(cfgs, there, **trained)
    [one] = ship(cfgs, tmp_path / f"out-{name}", there, stamp=name)
    return one


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path, "r:gz") as tar:  # an archive ship() wrote: small
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _project(tmp_path: Path) -> Path:
    """An empty project folder to import into."""
    home = tmp_path / "home"
    home.mkdir()
    return home


def _placed(root: Path) -> list[Path]:
    return sorted(p for p in (root / "results").rglob("*") if p.is_file()) if (root / "results").exists() else []


# --- bombs --------------------------------------------------------------------------------------------------

def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE, format: int = tarfile.USTAR_FORMAT) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    return info.tobuf(format)


def _file(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def _gzip(path: Path, pieces: list[bytes | int]) -> Path:
    """A valid gzip file of `pieces`: bytes, or an int for that many MiB of zeros."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip header and trailer are written here
    crc, size = 0, 0
    with open(path, "wb") as out:
        out.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
        for piece in pieces:
            if isinstance(piece, bytes):
                out.write(deflate.compress(piece))
                crc, size = zlib.crc32(piece, crc), size + len(piece)
                continue
            out.write(deflate.flush(zlib.Z_FULL_FLUSH))
            block = deflate.compress(MIB_OF_ZEROS) + deflate.flush(zlib.Z_FULL_FLUSH)
            out.write(block * piece)
            for _ in range(piece):
                crc = zlib.crc32(MIB_OF_ZEROS, crc)
            size += piece * len(MIB_OF_ZEROS)
        out.write(deflate.flush())
        out.write(struct.pack("<II", crc, size % 2**32))
    return path


def test_the_bomb_writer_writes_valid_gzip(tmp_path) -> None:
    import gzip

    path = _gzip(tmp_path / "small.gz", [b"head", 3, b"tail"])
    assert gzip.decompress(path.read_bytes()) == b"head" + bytes(3 * 2**20) + b"tail"


def _bombs(shipped: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """Each bomb, with the refusal it must meet."""
    members = dict(_members(shipped))
    manifest = json.loads(members[MANIFEST])
    config, history, metrics = (next(n for n in members if n.endswith(f"/{f}")) for f in RUN_FILES)
    real = _file(MANIFEST, members[MANIFEST])
    boasting = json.loads(members[MANIFEST])
    boasting["files"][history]["size"] = GIB_IN_MIB * 2**20
    gib, end = GIB_IN_MIB * 2**20, bytes(2 * tarfile.BLOCKSIZE)
    cases = {
        "manifest claims a GiB": ([_header(MANIFEST, gib), GIB_IN_MIB, end],
                                  rf"its {MANIFEST} claims {gib} bytes, more than a manifest may"),
        "member claims a GiB": ([real, _file(config, members[config]), _header(history, gib), GIB_IN_MIB, end],
                                rf"{history} holds {gib} bytes, but {MANIFEST} says {len(members[history])}"),
        "member and manifest claim a GiB": (
            [_file(MANIFEST, json.dumps(boasting).encode()), _header(history, gib), GIB_IN_MIB, end],
            rf"its files would take {gib + sum(len(members[n]) for n in (config, metrics))} bytes, more than"),
        # The header says the member's real size, a GiB of zeros follows it: never read as a member.
        "header understates its member": ([real, _file(config, members[config]), _file(history, members[history]),
                                           GIB_IN_MIB, _file(metrics, members[metrics]), end],
                                          rf"members and manifest disagree \(missing: \['{metrics}'\]\)"),
        # Extension headers that tarfile itself would read into memory whole.
        "GNU long name of a GiB": ([real, _header("././@LongLink", gib, tarfile.GNUTYPE_LONGNAME, tarfile.GNU_FORMAT),
                                    GIB_IN_MIB, end], r"member '././@LongLink' is not a regular file"),
        "pax header of a GiB": ([real, _header("././@PaxHeader", gib, tarfile.XHDTYPE), GIB_IN_MIB, end],
                                r"member '././@PaxHeader' is not a regular file"),
    }
    assert manifest["files"][history]["size"] == len(members[history])
    return {name: (_gzip(folder / f"bomb-{k}.tar.gz", pieces), refusal)
            for k, (name, (pieces, refusal)) in enumerate(cases.items())}


_IMPORT_EACH = """
import json, resource, sys, tracemalloc
from pathlib import Path
from fedskew.config import load_params
from fedskew.packed.archive import ArchiveError, import_archives

params, root, archives = load_params(json.loads(sys.argv[1])), Path(sys.argv[2]), sys.argv[3:]
import_archives(params, [], root)  # every module loaded before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
refusals = {}
for path in archives:
    try:
        import_archives(params, [Path(path)], root)
        refusals[path] = None
    except ArchiveError as error:
        refusals[path] = str(error)
peak_python = tracemalloc.get_traced_memory()[1]  # what Python and zlib allocated, at most, meanwhile
growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # what the process held beyond its peak
print(json.dumps({"peak_mib": peak_python / 2**20, "growth_mib": growth_kib / 1024, "refusals": refusals}))
"""


def test_decompression_bombs_are_refused_within_a_few_megabytes(tiny_params, tmp_path) -> None:
    params = load_params(tiny_params)
    [cfg] = [c for c in params.suite_runs("tiny") if (c.partition, c.method, c.seed) == ("dir0.5", "fedavg", 0)]
    bombs = _bombs(_shipped(params, [cfg], tmp_path, "real"), tmp_path)
    assert all(path.stat().st_size < 3 * 2**20 for path, _ in bombs.values())  # small files, each a GiB inflated
    home = _project(tmp_path)
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(tiny_params), str(home),
                           *(str(path) for path, _ in bombs.values())], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for name, (path, refusal) in bombs.items():
        message = result["refusals"][str(path)]
        assert message is not None and message.startswith(f"{path}: "), name
        assert re.search(refusal, message), (name, message)
    assert result["peak_mib"] < 8 and result["growth_mib"] < 24, f"importing the bombs took too much memory: {result}"
    assert not any(home.iterdir())  # nothing written, not even a scratch folder


def test_an_archive_file_larger_than_the_bound_is_refused_unread(tiny_params, tmp_path) -> None:
    huge, home = tmp_path / "huge.tar.gz", _project(tmp_path)
    with open(huge, "wb") as out:
        out.truncate(MAX_ARCHIVE_BYTES + 1)  # a sparse file: no disk taken
    with pytest.raises(ArchiveError, match=rf"huge.tar.gz: it holds {MAX_ARCHIVE_BYTES + 1} bytes, more than an "
                                           rf"archive may \({MAX_ARCHIVE_BYTES}\)"):
        import_archives(load_params(tiny_params), [huge], home)
    assert not any(home.iterdir())


def _rewritten(target: Path, members: list[tuple[tarfile.TarInfo | str, bytes]]) -> Path:
    with tarfile.open(target, "w:gz", format=tarfile.USTAR_FORMAT) as out:
        for info, data in members:
            if isinstance(info, str):
                info = tarfile.TarInfo(info)
                info.size = len(data)
            out.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return target


def test_a_member_larger_than_its_manifest_says_is_refused_and_nothing_is_written(tiny_params, tmp_path) -> None:
    params = load_params(tiny_params)
    cfg = params.suite_runs("tiny")[0]
    shipped = _shipped(params, [cfg], tmp_path, "one")
    members = _members(shipped)
    history = next(n for n, _ in members if n.endswith("/history.csv"))
    home = _project(tmp_path)
    longer = _rewritten(tmp_path / "longer.tar.gz",
                        [(n, d + b"1,0.9,0.1\n" if n == history else d) for n, d in members])
    with pytest.raises(ArchiveError, match=rf"{history} holds {len(dict(members)[history]) + 10} bytes, but "
                                           rf"{MANIFEST} says {len(dict(members)[history])}; the archive is damaged"):
        import_archives(params, [longer], home)
    assert not any(home.iterdir())


def _link(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, "/etc/passwd"
    return info


@pytest.mark.parametrize("case, refusal", [
    ("symlink", r"member '.*/history.csv' is not a regular file"),
    ("hard link", r"member '.*/history.csv' is not a regular file"),
    ("twice", r"member '.*/config.yaml' appears twice"),
    ("manifest sizes as text", r"MANIFEST.json: `files` is not a sha256 and a size for each file"),
    ("manifest not first", r"MANIFEST.json is not its first member"),
    ("cut short", r"cannot be read as a gzipped tar \(.*\); ship it again"),
    ("path climbing out", r"'results/runs/(\.\./){4}seed0/history.csv' is not a run file under results/runs/"),
])
def test_what_ship_never_writes_is_refused(tiny_params, tmp_path, case, refusal) -> None:
    params = load_params(tiny_params)
    shipped = _shipped(params, params.suite_runs("tiny")[:1], tmp_path, "one")
    members = _members(shipped)
    if case in ("symlink", "hard link"):
        kind = tarfile.SYMTYPE if case == "symlink" else tarfile.LNKTYPE
        members = [(_link(n, kind), b"") if n.endswith("history.csv") else (n, d) for n, d in members]
    elif case == "twice":
        members = members[:2] + members[1:]
    elif case == "manifest sizes as text":
        manifest = json.loads(members[0][1])
        for entry in manifest["files"].values():
            entry["size"] = str(entry["size"])
        members = [(MANIFEST, json.dumps(manifest).encode()), *members[1:]]
    elif case == "manifest not first":
        members = members[1:] + members[:1]
    elif case == "path climbing out":  # listed so in the manifest too: staged by its name, it would leave the stage
        history = next(n for n, _ in members if n.endswith("/history.csv"))
        climbing = "results/runs/../../../../seed0/history.csv"
        members = [(MANIFEST, members[0][1].replace(history.encode(), climbing.encode())),
                   *((climbing if n == history else n, d) for n, d in members[1:])]
    home = _project(tmp_path)
    crafted = _rewritten(tmp_path / "crafted.tar.gz", members)
    if case == "cut short":  # a copy that stopped part way
        crafted.write_bytes(shipped.read_bytes()[:shipped.stat().st_size // 2])
    with pytest.raises(ArchiveError, match=refusal):
        import_archives(params, [crafted], home)
    assert not any(home.iterdir())


# --- all or nothing -----------------------------------------------------------------------------------------

def test_two_archives_of_one_run_with_other_bytes_are_refused_naming_both(tiny_params, tmp_path) -> None:
    params = load_params(tiny_params)
    one, other = params.suite_runs("tiny")[:2]
    first = _shipped(params, [one, other], tmp_path, "first")
    again = _shipped(params, [one], tmp_path, "again", device="another machine")  # trained twice
    home = _project(tmp_path)
    with pytest.raises(ArchiveError, match=rf"{one.path(paths.RUN_DIR)} is in {first} and in {again} with "
                                           r"other bytes \(it was trained twice\); import only the archive whose run "
                                           r"to keep"):
        import_archives(params, [first, again], home)
    assert not any(home.iterdir())  # not even `other`, which only the first archive holds


def test_two_archives_of_one_run_with_the_same_bytes_import_it_once(tiny_params, tmp_path) -> None:
    params = load_params(tiny_params)
    cfg = params.suite_runs("tiny")[0]
    first = _shipped(params, [cfg], tmp_path, "first")
    copy = shutil.copy(first, tmp_path / "copy.tar.gz")
    repacked = ship([cfg], tmp_path / "repacked", tmp_path / "trained-first", stamp="2")[0]  # other gzip bytes
    home = tmp_path / "home"
    report = import_archives(params, [first, Path(copy), repacked], home)
    assert [c for c, _ in report.imported] == [cfg] and report.already == []
    assert report.sources == {cfg.run_id: first}
    for name in RUN_FILES:
        assert (home / cfg.path(paths.RUN_DIR) / name).read_bytes() == \
            (tmp_path / "trained-first" / cfg.path(paths.RUN_DIR) / name).read_bytes()
    assert len(_placed(home)) == 3


def test_a_failure_placing_the_second_run_leaves_the_project_as_it_was(tiny_params, tmp_path, monkeypatch) -> None:
    params = load_params(tiny_params)
    one, two = params.suite_runs("tiny")[:2]
    shipped = _shipped(params, [one, two], tmp_path, "both")
    home = tmp_path / "home"
    # What was there before: another suite's result, and the config.yaml of a write of `two` that crashed.
    keep = home / "results" / "runs" / "other" / "keep.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("kept\n")
    leftover = home / two.path(paths.RUN_CONFIG)
    leftover.parent.mkdir(parents=True)
    leftover.write_text("a crashed write\n")
    before = {p: p.read_bytes() for p in _placed(home)}

    writes = []
    real_write = archive.atomic_write_text

    def disk_full_at_the_fifth_write(path: Path, text: str) -> None:
        writes.append(path)
        if len(writes) == 5:  # the second run's history.csv: its config.yaml is already placed
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, text)

    monkeypatch.setattr(archive, "atomic_write_text", disk_full_at_the_fifth_write)
    with pytest.raises(ArchiveError, match=rf"writing {home / two.path(paths.RUN_HISTORY)} failed \(\[Errno 28\] No "
                                           r"space left on device\); the runs this import placed were removed again: "
                                           r"the project is as it was\. Free disk space or make .* writable"):
        import_archives(params, [shipped], home)
    assert writes[:3] == [home / one.path(paths.RUN_DIR) / n for n in RUN_FILES]  # the first run was placed whole
    assert {p: p.read_bytes() for p in _placed(home)} == before
    assert not (home / one.path(paths.RUN_DIR)).exists()
    assert sorted(p.name for p in leftover.parent.iterdir()) == ["config.yaml"]  # nothing set aside is left

    monkeypatch.setattr(archive, "atomic_write_text", real_write)
    report = import_archives(params, [shipped], home)  # with the disk freed: both runs
    assert [c for c, _ in report.imported] == [one, two]


# --- MLflow -------------------------------------------------------------------------------------------------

def _recorded(store: Path) -> dict[str, tuple[str, str]]:
    """fedskew run id -> (MLflow status, the archive it was imported from), for every MLflow run of the store."""
    with sqlite3.connect(store) as db:
        rows = db.execute("select r.status, k.value, f.value from runs r join tags k on k.run_uuid = r.run_uuid "
                          "and k.key = ? left join tags f on f.run_uuid = r.run_uuid and f.key = "
                          "'fedskew.imported_from'", (RUN_KEY_TAG,)).fetchall()
    assert len(rows) == len({key for _, key, _ in rows}), "a run was logged twice"
    return {key: (status, source) for status, key, source in rows}


def test_an_import_logs_its_runs_and_the_present_runs_mlflow_lacks(tiny_params, tmp_path, migrated_store,
                                                                  monkeypatch, capsys) -> None:
    params = load_params(tiny_params)
    one, two = params.suite_runs("tiny")[:2]
    first, second = _shipped(params, [one], tmp_path, "first"), _shipped(params, [two], tmp_path, "second")
    home = _project(tmp_path)
    shutil.copy(migrated_store, home / "mlflow.db")
    monkeypatch.chdir(home)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    monkeypatch.setenv("FEDSKEW_TRACKING", "0")  # imported once with tracking off: in place, not in MLflow
    cmd_import(params, argparse.Namespace(archive=[str(first)], skip_stale=False, mark=None))
    assert _recorded(home / "mlflow.db") == {}

    monkeypatch.setenv("FEDSKEW_TRACKING", "1")
    capsys.readouterr()
    cmd_import(params, argparse.Namespace(archive=[str(first), str(second)], skip_stale=False, mark=None))
    out = capsys.readouterr().out
    assert "1 run(s) added to results/runs, 1 already there" in out and "2 run(s) logged to MLflow" in out
    assert _recorded(home / "mlflow.db") == {one.run_id: ("FINISHED", first.name),
                                             two.run_id: ("FINISHED", second.name)}

    # all recorded: nothing logged again
    cmd_import(params, argparse.Namespace(archive=[str(first), str(second)], skip_stale=False, mark=None))
    assert "logged to MLflow" not in capsys.readouterr().out
    assert set(_recorded(home / "mlflow.db")) == {one.run_id, two.run_id}


def test_a_logging_failure_keeps_the_files_and_names_the_track_command(tiny_params, tmp_path, monkeypatch) -> None:
    from fedskew import job, tracking

    params = load_params(tiny_params)
    cfg = params.suite_runs("tiny")[0]
    shipped = _shipped(params, [cfg], tmp_path, "one")
    home = _project(tmp_path)
    monkeypatch.chdir(home)
    monkeypatch.setenv("FEDSKEW_TRACKING", "1")
    monkeypatch.setattr(tracking, "recorded_runs", lambda uri, experiment: {})

    def unreachable(cfg, tags):
        raise RuntimeError("the tracking server is down")

    monkeypatch.setattr(job, "log_run_files", unreachable)
    with pytest.raises(job.TrackingError, match=r"1 imported run\(s\) could not be logged to MLflow; their files are "
                                                r"in place: `python -m fedskew track --suite tiny` logs them later"):
        cmd_import(params, argparse.Namespace(archive=[str(shipped)], skip_stale=False, mark=None))
    assert len(_placed(home)) == 3


def test_ship_writes_no_archive_that_import_refuses(tiny_params, tmp_path) -> None:
    params = load_params(tiny_params)
    cfgs = params.suite_runs("tiny")[:1]
    _train(cfgs, tmp_path)
    with pytest.raises(ArchiveError, match=r"archives of at most 16 MiB can be imported; ship with a --max-mb of 16"):
        ship(cfgs, tmp_path / "out", tmp_path, max_bytes=MAX_ARCHIVE_BYTES + 1)
    assert not (tmp_path / "out").exists()
