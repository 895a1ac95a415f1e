"""Run files shipped from a device machine in bounded archives, and verified before they join results/runs.

An archive is a gzipped plain (ustar) tar: `MANIFEST.json` first (the runs it holds, each with its run
id and provenance, and the sha256 and size of every file), then each run's config.yaml,
history.csv and metrics.json under their results/runs/... paths. Checkpoints stay on the
device machine: they are large (AlexNet's is about 115 MB) and only a run in progress
needs one, there.

An archive is read within bounds set before it is read (fedskew.packed.unpacking): its size, the manifest's,
and each member's against the manifest before a byte of it is inflated; members are hashed as they stream by.

Importing is all or nothing. Every archive of the call is read and verified, and each of its runs staged
whole in a scratch folder, before anything is placed; importing refuses, with nothing written: a member the
manifest does not list or whose size or digest differs, a path outside results/runs or of another shape, a
run params.yaml does not define or defines with another configuration (run id), run files whose own
integrity digests fail (fedskew.runfiles), and a run that two archives of the call hold with other bytes
(with the same bytes it is imported once). A run already present with the same bytes is skipped; one
present with other bytes is never overwritten. Then the new runs are placed, metrics.json last in each;
when a write fails (a full disk, a read-only folder), the runs this call placed are removed again and what
they replaced is put back, so the project is as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedskew import paths
from fedskew.config import Params, RunConfig
from fedskew.data.files import file_sha256, scratch_dir
from fedskew.numerics import cpu_pin
from fedskew.packed.unpacking import (
    FORMAT,
    MANIFEST,
    MAX_ARCHIVE_BYTES,
    MAX_MANIFEST_BYTES,
    ArchiveError,
    read_archive,
)
from fedskew.runfiles import RunFileError, atomic_write_text, read_metrics

RUN_FILES = ("config.yaml", "history.csv", "metrics.json")  # metrics.json last: it marks a run complete

def _run_files(cfg: RunConfig, root: Path) -> dict[str, bytes]:
    return {_member(cfg, name): (root / cfg.path(paths.RUN_DIR) / name).read_bytes() for name in RUN_FILES}


def _shipped_files(out_dir: Path) -> dict[str, tuple[str, Path]]:
    """Every run file the archives already in `out_dir` hold: its path → (sha256, the archive holding it)."""
    held: dict[str, tuple[str, Path]] = {}
    for archive in sorted(out_dir.glob("*.tar.gz")) if out_dir.is_dir() else []:
        manifest = read_archive(archive)
        held.update({name: (entry["sha256"], archive) for name, entry in manifest["files"].items()})
    return held


def archived_run_ids(out_dir: Path) -> set[str]:
    """The run ids that the archives in `out_dir` hold (each archive verified against its manifest)."""
    ids: set[str] = set()
    for archive in sorted(out_dir.glob("*.tar.gz")) if out_dir.is_dir() else []:
        manifest = read_archive(archive)
        ids.update(entry["run_id"] for entry in manifest["runs"])
    return ids


def archived_configs(archive: Path) -> list[dict]:
    """The config.yaml of every run an archive holds, parsed (the archive verified against its manifest first)."""
    with tempfile.TemporaryDirectory() as scratch:
        manifest = read_archive(archive, Path(scratch))
        return [yaml.safe_load((Path(scratch) / name).read_text()) for name in sorted(manifest["files"])
                if name.endswith("/config.yaml")]


def ship(runs: list[RunConfig], out_dir: Path, root: Path = Path("."), max_bytes: int = MAX_ARCHIVE_BYTES,
         stamp: str | None = None) -> list[Path]:
    """Pack the finished runs among `runs` into archives of at most `max_bytes` each; return their paths.

    Runs are packed whole and in order; an archive closes before a run that would push its
    uncompressed content past `max_bytes` (so the compressed file stays below it too). A run
    that an archive already in `out_dir` holds with the same bytes is not packed again, so
    shipping into a suite's committed folder (results/imported/<suite>/) after each stretch of
    training adds only the runs finished since; one held there with other bytes is refused.
    `max_bytes` is at most MAX_ARCHIVE_BYTES: importing refuses a larger archive.
    """
    if max_bytes > MAX_ARCHIVE_BYTES:
        raise ArchiveError(f"archives of at most {MAX_ARCHIVE_BYTES / 2**20:g} MiB can be imported; ship with a "
                           f"--max-mb of {MAX_ARCHIVE_BYTES / 2**20:g} or less")
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    finished = [cfg for cfg in runs if (root / cfg.path(paths.RUN_METRICS)).exists()]
    held = _shipped_files(out_dir)
    groups: list[list[tuple[RunConfig, dict[str, bytes]]]] = [[]]
    size = 0
    for cfg in finished:
        read_metrics(cfg, root)  # ship only intact runs
        files = _run_files(cfg, root)
        if _already_shipped(files, held):
            continue
        run_bytes = sum(len(b) for b in files.values())
        if run_bytes + 64 * 1024 > max_bytes:  # (a manifest's share)
            raise ArchiveError(f"{cfg.path(paths.RUN_DIR)} holds {run_bytes} bytes, more than one archive may "
                               f"({max_bytes}); raise --max-mb")
        if groups[-1] and size + run_bytes + 64 * 1024 * len(groups[-1]) > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((cfg, files))
        size += run_bytes
    out_dir.mkdir(parents=True, exist_ok=True)
    archives = []
    names = (out_dir / f"fedskew-runs-{stamp}-{k:02d}.tar.gz" for k in itertools.count(1))
    free = (path for path in names if not path.exists())  # never over an archive already there
    for group in (g for g in groups if g):
        path = next(free)
        _write_archive(path, group)
        archives.append(path)
    return archives


def _already_shipped(files: dict[str, bytes], held: dict[str, tuple[str, Path]]) -> bool:
    """Whether archives already hold this run's files with the same bytes (an error if with other bytes)."""
    if not any(name in held for name in files):
        return False
    for name, data in files.items():
        if name not in held or hashlib.sha256(data).hexdigest() != held[name][0]:
            where = next(held[n][1] for n in files if n in held)
            raise ArchiveError(f"{name.rsplit('/', 1)[0]} is already shipped in {where} with other bytes (it was "
                               f"trained again); a run is shipped once: import that folder's archives before training "
                               f"(`fedskew packed import`), which leaves finished runs alone")
    return True


def _write_archive(path: Path, group: list[tuple[RunConfig, dict[str, bytes]]]) -> None:
    manifest = {"format": FORMAT, "runs": [], "files": {}}
    for cfg, files in group:
        metrics = json.loads(files[_member(cfg, "metrics.json")])
        manifest["runs"].append({"run_id": cfg.run_id, **cfg.keys, "status": metrics.get("status"),
                                 "provenance": metrics.get("provenance", {})})
        manifest["files"].update({name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                                  for name, data in files.items()})
    manifest_bytes = json.dumps(manifest, indent=1, allow_nan=False).encode()
    if len(manifest_bytes) > MAX_MANIFEST_BYTES:  # never write what importing refuses
        raise ArchiveError(f"the manifest of {len(group)} runs takes {len(manifest_bytes)} bytes, more than an "
                           f"archive's may ({MAX_MANIFEST_BYTES}); ship with a smaller --max-mb (fewer runs each)")
    tmp = path.with_name(f".{path.name}.tmp")
    # Plain ustar: headers of one block each, which importing reads before any member (no pax or GNU extension).
    with tarfile.open(tmp, "w:gz", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in [(MANIFEST, manifest_bytes), *((n, d) for _, files in group for n, d in files.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            try:
                tar.addfile(info, io.BytesIO(data))
            except ValueError as error:  # a path that a ustar header cannot hold (over 255 characters)
                raise ArchiveError(f"{name}: {error}; shorten the names of its suite, dataset, partition or "
                                   "method in params.yaml") from error
    tmp.replace(path)


@dataclass
class ImportReport:
    imported: list[tuple[RunConfig, dict]] = field(default_factory=list)  # (run, its provenance), placed now
    already: list[RunConfig] = field(default_factory=list)                # present with the same bytes
    sources: dict[str, Path] = field(default_factory=dict)                # run id -> the (first) archive holding it
    stale: list[dict] = field(default_factory=list)                       # left out, out of date (skip_stale)


def _check_runs(path: Path, params: Params, manifest: dict, stale: list[dict] | None = None) -> list[RunConfig]:
    """Each run of the manifest as params.yaml defines it (same run id), its three files present. With `stale` (a
    list), a run whose id params.yaml and the code no longer give it is left out and recorded there instead of
    refused (fedskew.stale says why)."""
    checked, members = [], set()
    for entry in manifest["runs"]:
        try:
            keys = (entry["suite"], entry["dataset"], entry["partition"], entry["method"], int(entry["seed"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ArchiveError(f"{path}: the entry of run {entry['run_id']} in {MANIFEST} lacks its suite, dataset, "
                               f"partition, method or seed ({error!r})") from None
        try:
            cfg = params.run(*keys)
        except Exception as error:  # noqa: BLE001 - ConfigError or a KeyError of an unknown suite
            raise ArchiveError(f"{path}: run {'/'.join(map(str, keys))} is not a run of params.yaml ({error})") from error
        members.update(_member(cfg, n) for n in RUN_FILES)
        if cfg.run_id != entry["run_id"] and stale is not None:
            stale.append({"run": cfg.path(paths.RUN_DIR).as_posix(), "run_id": entry["run_id"],
                          "current_run_id": cfg.run_id, "archive": str(path)})
            continue
        if cfg.run_id != entry["run_id"]:
            why = ("FEDSKEW_CPU_KERNELS=native gives every run another id than its portable one: import it under "
                   "the portable kernels" if cpu_pin.kernels_in_run_id() else
                   "its configuration changed since; train it again")
            raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} was trained with run id {entry['run_id']}, but "
                               f"params.yaml gives it {cfg.run_id}: {why}")
        if any(_member(cfg, n) not in manifest["files"] for n in RUN_FILES):
            raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} lacks one of {', '.join(RUN_FILES)}")
        checked.append(cfg)
    if members != set(manifest["files"]):
        raise ArchiveError(f"{path}: it holds files of runs its manifest does not list")
    return checked


def _member(cfg: RunConfig, name: str) -> str:
    """The archive member (and results/... path) of one of a run's files."""
    return f"{cfg.path(paths.RUN_DIR).as_posix()}/{name}"


@dataclass
class _StagedRun:
    cfg: RunConfig
    provenance: dict          # what its metrics.json records
    folder: Path              # its three files, verified, in the scratch folder
    archive: Path             # the (first) archive holding it
    digests: dict[str, str]   # file name -> sha256


def _stage_runs(params: Params, archives: list[Path], scratch: Path,
                stale: list[dict] | None = None) -> dict[str, _StagedRun]:
    """Every run of every archive, read, verified and staged under `scratch` (by its results/runs path); with
    `stale`, the out-of-date runs are recorded there and left out (_check_runs)."""
    staged: dict[str, _StagedRun] = {}
    for k, path in enumerate(archives):
        stage = scratch / f"{k:04d}"
        manifest = read_archive(path, stage)
        for cfg in _check_runs(path, params, manifest, stale):
            try:
                record = read_metrics(cfg, stage)  # its own digests, before it counts
                for name in RUN_FILES:  # placed as text (fedskew.runfiles): refuse bytes that are not
                    (stage / _member(cfg, name)).read_bytes().decode("utf-8")
            except (RunFileError, UnicodeDecodeError) as error:
                raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} fails its own integrity check: "
                                   f"{error}") from error
            run = _StagedRun(cfg, record.get("provenance", {}), stage / cfg.path(paths.RUN_DIR), path,
                             {n: manifest["files"][_member(cfg, n)]["sha256"] for n in RUN_FILES})
            first = staged.setdefault(cfg.run_id, run)
            if first.digests != run.digests:
                raise ArchiveError(f"{cfg.path(paths.RUN_DIR)} is in {first.archive} and in {path} with other bytes "
                                   f"(it was trained twice); import only the archive whose run to keep")
    return staged


def import_archives(params: Params, archives: list[Path], root: Path = Path("."),
                    skip_stale: bool = False) -> ImportReport:
    """Import the runs of `archives` into `root`, all or none: every archive is verified and every run staged
    first, then the new runs' files are placed (metrics.json last in each), or taken back if a write fails.
    A run whose id params.yaml and the code no longer give it is refused; with `skip_stale` it is left out and
    named in the report's `stale` (what the reproduction does: its cells then say so)."""
    report = ImportReport()
    results = root / "results"
    results_existed = results.exists()
    try:
        with scratch_dir(results, ".import-") as scratch:
            staged = _stage_runs(params, archives, scratch, report.stale if skip_stale else None)
            new = []
            for run in staged.values():
                present = root / run.cfg.path(paths.RUN_DIR)
                if all((present / n).exists() for n in RUN_FILES):
                    if all(file_sha256(present / n) == run.digests[n] for n in RUN_FILES):
                        report.already.append(run.cfg)
                        continue
                    raise ArchiveError(f"{run.archive}: {present} already holds other run files; fedskew never "
                                       f"overwrites a result: move that folder aside to import this one")
                new.append(run)
            _place(new, root)
    finally:
        if not results_existed:  # an import that placed nothing leaves no results/ behind either
            with contextlib.suppress(OSError):  # (one that placed runs: it holds them)
                results.rmdir()
    report.imported = [(run.cfg, run.provenance) for run in new]
    report.sources = {run.cfg.run_id: run.archive for run in staged.values()}
    return report


def _place(runs: list[_StagedRun], root: Path) -> None:
    """Copy the staged runs into results/runs, metrics.json last in each; if a write fails, undo every write of
    this call (a file it replaced, left by a run whose files were never whole, is put back)."""
    written: list[tuple[Path, Path | None]] = []  # each file written, and where the file it replaced was moved
    created: list[Path] = []                      # the folders this call made
    target = root  # (named in the error)
    try:
        for run in runs:
            folder = root / run.cfg.path(paths.RUN_DIR)
            created += [p for p in (folder, *folder.parents) if not p.exists()]
            for name in RUN_FILES:
                target = folder / name
                aside = None
                if target.exists():
                    aside = target.with_name(f".{name}.before-import-{os.getpid()}")
                    os.replace(target, aside)
                written.append((target, aside))
                atomic_write_text(target, (run.folder / name).read_bytes().decode("utf-8"))
    except (OSError, ValueError) as error:  # ValueError: text the locale's encoding cannot write
        stuck = _undo(written, created)
        left = (f", but {', '.join(map(str, stuck))} could not be restored: put them right by hand" if stuck
                else ": the project is as it was")
        raise ArchiveError(f"writing {target} failed ({error}); the runs this import placed were removed again{left}. "
                           f"Free disk space or make {target.parent} writable, then import again") from error
    for _, aside in written:
        if aside is not None:
            with contextlib.suppress(OSError):  # the runs are placed: a hidden leftover is no reason to fail
                aside.unlink(missing_ok=True)


def _undo(written: list[tuple[Path, Path | None]], created: list[Path]) -> list[Path]:
    """Remove the files `_place` wrote and put back those it moved aside; return the paths it could not restore."""
    stuck = []
    for target, aside in reversed(written):
        try:
            if aside is None:
                target.unlink(missing_ok=True)
            else:
                os.replace(aside, target)
        except OSError:
            stuck.append(target)
    for folder in sorted(created, key=lambda p: len(p.parts), reverse=True):  # the deepest first
        with contextlib.suppress(OSError):  # gone already, or holding what could not be removed (named above)
            folder.rmdir()
    return stuck
