"""Run files shipped from a device machine in bounded archives, and verified before they join results/runs.

An archive is a gzipped tar: `MANIFEST.json` first (the runs it holds, each with its run
id and provenance, and the sha256 and size of every file), then each run's config.yaml,
history.csv and metrics.json under their results/runs/... paths. Checkpoints stay on the
device machine: they are large (AlexNet's is about 115 MB) and only a run in progress
needs one, there.

Importing refuses, before anything is written: a member the manifest does not list or whose
digest differs, a path outside results/runs or of another shape, a run params.yaml does not
define or defines with another configuration (run id), and run files whose own integrity
digests fail (fedskew.runfiles). A run already present with the same bytes is skipped; one
present with other bytes is never overwritten.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import paths
from fedskew.config import Params, RunConfig
from fedskew.data.files import scratch_dir
from fedskew.runfiles import RunFileError, atomic_write_text, read_metrics

FORMAT = "fedskew-runs/1"
MANIFEST = "MANIFEST.json"
RUN_FILES = ("config.yaml", "history.csv", "metrics.json")  # metrics.json last: it marks a run complete
MAX_ARCHIVE_BYTES = 16 * 2**20  # what one file coming back from a device machine may hold here
_RUN_PATH = re.compile(r"results/runs/([^/]+)/([^/]+)/([^/]+)/([^/]+)/seed(\d+)/(config\.yaml|history\.csv|"
                       r"metrics\.json)")


class ArchiveError(RuntimeError):
    """An archive is damaged, or does not match this project's params.yaml; nothing was imported from it."""


def _run_files(cfg: RunConfig, root: Path) -> dict[str, bytes]:
    return {f"{cfg.path(paths.RUN_DIR).as_posix()}/{name}": (root / cfg.path(paths.RUN_DIR) / name).read_bytes()
            for name in RUN_FILES}


def _shipped_files(out_dir: Path) -> dict[str, tuple[str, Path]]:
    """Every run file the archives already in `out_dir` hold: its path → (sha256, the archive holding it)."""
    held: dict[str, tuple[str, Path]] = {}
    for archive in sorted(out_dir.glob("*.tar.gz")) if out_dir.is_dir() else []:
        manifest, _ = _read_archive(archive)
        held.update({name: (entry["sha256"], archive) for name, entry in manifest["files"].items()})
    return held


def archived_run_ids(out_dir: Path) -> set[str]:
    """The run ids that the archives in `out_dir` hold (each archive verified against its manifest)."""
    ids: set[str] = set()
    for archive in sorted(out_dir.glob("*.tar.gz")) if out_dir.is_dir() else []:
        manifest, _ = _read_archive(archive)
        ids.update(entry["run_id"] for entry in manifest.get("runs", []))
    return ids


def ship(runs: list[RunConfig], out_dir: Path, root: Path = Path("."), max_bytes: int = MAX_ARCHIVE_BYTES,
         stamp: str | None = None) -> list[Path]:
    """Pack the finished runs among `runs` into archives of at most `max_bytes` each; return their paths.

    Runs are packed whole and in order; an archive closes before a run that would push its
    uncompressed content past `max_bytes` (so the compressed file stays below it too). A run
    that an archive already in `out_dir` holds with the same bytes is not packed again, so
    shipping into a suite's committed folder (results/imported/<suite>/) after each stretch of
    training adds only the runs finished since; one held there with other bytes is refused.
    """
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
        metrics = json.loads(files[f"{cfg.path(paths.RUN_DIR).as_posix()}/metrics.json"])
        manifest["runs"].append({"run_id": cfg.run_id, **cfg.keys, "status": metrics.get("status"),
                                 "provenance": metrics.get("provenance", {})})
        manifest["files"].update({name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                                  for name, data in files.items()})
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode()),
                           *((n, d) for _, files in group for n, d in files.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


@dataclass
class ImportReport:
    imported: list[tuple[RunConfig, dict]] = field(default_factory=list)  # (run, its provenance)
    already: list[RunConfig] = field(default_factory=list)                # present with the same bytes


def _read_archive(path: Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every file of an archive, each checked against the manifest."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            if not members or members[0].name != MANIFEST:
                raise ArchiveError(f"{path}: {MANIFEST} is not its first member; it is not a fedskew run archive")
            files: dict[str, bytes] = {}
            for member in members:
                if not member.isfile():
                    raise ArchiveError(f"{path}: member {member.name!r} is not a regular file")
                if member.name in files:
                    raise ArchiveError(f"{path}: member {member.name!r} appears twice")
                files[member.name] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ArchiveError(f"{path}: cannot be read as a gzipped tar ({error}); ship it again") from error
    try:
        manifest = json.loads(files.pop(MANIFEST))
    except ValueError as error:
        raise ArchiveError(f"{path}: {MANIFEST} is not JSON ({error})") from error
    if manifest.get("format") != FORMAT:
        raise ArchiveError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    listed = manifest.get("files", {})
    if set(listed) != set(files):
        extra, missing = sorted(set(files) - set(listed)), sorted(set(listed) - set(files))
        raise ArchiveError(f"{path}: members and manifest disagree (not listed: {extra}; missing: {missing})")
    for name, data in files.items():
        if not _RUN_PATH.fullmatch(name):
            raise ArchiveError(f"{path}: {name!r} is not a run file under results/runs/")
        if hashlib.sha256(data).hexdigest() != listed[name]["sha256"] or len(data) != listed[name]["size"]:
            raise ArchiveError(f"{path}: {name} does not match its digest in {MANIFEST}; the archive is damaged")
    return manifest, files


def _check_runs(path: Path, params: Params, manifest: dict, files: dict[str, bytes]) -> list[tuple[RunConfig, dict]]:
    """Each run of the manifest as params.yaml defines it (same run id), its three files present."""
    checked = []
    for entry in manifest.get("runs", []):
        keys = (entry["suite"], entry["dataset"], entry["partition"], entry["method"], int(entry["seed"]))
        try:
            cfg = params.run(*keys)
        except Exception as error:  # noqa: BLE001 - ConfigError or a KeyError of an unknown suite
            raise ArchiveError(f"{path}: run {'/'.join(map(str, keys))} is not a run of params.yaml ({error})") from error
        if cfg.run_id != entry["run_id"]:
            raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} was trained with run id {entry['run_id']}, but "
                               f"params.yaml gives it {cfg.run_id}: its configuration changed since; train it again")
        names = [f"{cfg.path(paths.RUN_DIR).as_posix()}/{n}" for n in RUN_FILES]
        if any(n not in files for n in names):
            raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} lacks one of {', '.join(RUN_FILES)}")
        checked.append((cfg, entry.get("provenance", {})))
    if {n for cfg, _ in checked for n in (f"{cfg.path(paths.RUN_DIR).as_posix()}/{f}" for f in RUN_FILES)} != set(files):
        raise ArchiveError(f"{path}: it holds files of runs its manifest does not list")
    return checked


def import_archives(params: Params, archives: list[Path], root: Path = Path(".")) -> ImportReport:
    """Verify every archive and run first, then place the new runs' files (metrics.json last)."""
    report = ImportReport()
    staged: list[tuple[RunConfig, dict, dict[str, bytes]]] = []
    for path in archives:
        manifest, files = _read_archive(path)
        checked = _check_runs(path, params, manifest, files)
        with scratch_dir(root / "results", ".import-") as scratch:  # each run's own digests, before it counts
            for cfg, provenance in checked:
                own = {n: files[f"{cfg.path(paths.RUN_DIR).as_posix()}/{n}"] for n in RUN_FILES}
                for name, data in own.items():
                    target = scratch / cfg.path(paths.RUN_DIR) / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                try:
                    read_metrics(cfg, scratch)
                except RunFileError as error:
                    raise ArchiveError(f"{path}: {cfg.path(paths.RUN_DIR)} fails its own integrity check: "
                                       f"{error}") from error
                present = root / cfg.path(paths.RUN_DIR)
                if all((present / n).exists() for n in RUN_FILES):
                    if all((present / n).read_bytes() == data for n, data in own.items()):
                        report.already.append(cfg)
                        continue
                    raise ArchiveError(f"{path}: {present} already holds other run files; fedskew never overwrites "
                                       f"a result: move that folder aside to import this one")
                staged.append((cfg, provenance, own))
    for cfg, provenance, own in staged:
        for name in RUN_FILES:  # metrics.json last: a run counts only once it is whole
            atomic_write_text(root / cfg.path(paths.RUN_DIR) / name, own[name].decode())
        report.imported.append((cfg, provenance))
    return report
