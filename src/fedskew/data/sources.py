"""The folders on this machine that may hold a source's official files, searched before the network.

A source's raw files come from the first place that has a verified copy
(fedskew.data.fetch.ensure_files does the searching and verifying):

1. data/raw/<source>/ itself: verified before, or placed there by hand;
2. each folder named in the environment variable FEDSKEW_DATA_DIRS (a path list like PATH,
   ':'-separated), looked at as <folder>/<source>/<file>, then <folder>/<file>;
3. the folder an OS package installs the files into (Debian's and Ubuntu's
   `dataset-fashion-mnist` for fashionmnist);
4. the network.

A file found in 2 or 3 is copied into data/raw/<source>/ once it verified (the marker and the
tensor cache live there, and the copy cannot change under fedskew). One that does not verify is
skipped and named in the error if nothing else serves it: it may be another dataset's file of
the same name (MNIST and Fashion-MNIST name their files alike).

These are settings of the machine, not of an experiment: every source is verified against the
same official content, so where a file came from changes no result, and is kept out of
params.yaml and out of run ids. Nothing here imports torch: `python -m fedskew datasets` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "FEDSKEW_DATA_DIRS"


@dataclass(frozen=True)
class OsPackage:
    """An OS package that installs a source's official files into one folder."""

    name: str
    folder: Path


# Debian's dataset-fashion-mnist installs the four official archives, recompressed (their own md5s
# differ from the originals'; their decompressed contents carry the official md5s).
OS_PACKAGES: dict[str, OsPackage] = {
    "fashionmnist": OsPackage("dataset-fashion-mnist", Path("/usr/share/datasets/fashion-mnist")),
}


@dataclass(frozen=True)
class LocalFolder:
    """A folder that may hold a source's files: named in FEDSKEW_DATA_DIRS ("folder") or an OS package's."""

    kind: str  # "folder" or "os-package"
    path: Path
    package: str | None = None  # the OS package's name

    def describe(self) -> str:
        if self.kind == "os-package":
            return f"OS package {self.package} ({self.path})"
        return f"folder {self.path} (from {ENV_VAR})"

    def record(self, file: Path) -> dict:
        """Where a file came from, as VERIFIED.json records it."""
        return {"kind": self.kind, "path": str(file), **({"package": self.package} if self.package else {})}


def named_folders(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders FEDSKEW_DATA_DIRS names, in order: empty entries skipped, ~ expanded, relative ones
    taken from the working directory (the project root, for the CLI and the workflow)."""
    value = environ.get(ENV_VAR, "")
    return [Path(entry).expanduser().absolute() for entry in value.split(os.pathsep) if entry.strip()]


def local_folders(source: str, environ: Mapping[str, str] = os.environ) -> list[LocalFolder]:
    """Where to look for `source`'s files before the network, in order (see the module docstring)."""
    folders = []
    for folder in named_folders(environ):
        # <folder>/<source>/ first: a flat folder may hold another source's files of the same names
        folders += [LocalFolder("folder", folder / source), LocalFolder("folder", folder)]
    if source in OS_PACKAGES:
        package = OS_PACKAGES[source]
        folders.append(LocalFolder("os-package", package.folder, package.name))
    return folders


def holding(source: str, filenames: tuple[str, ...] | list[str],
            environ: Mapping[str, str] = os.environ) -> LocalFolder | None:
    """The first local folder that holds every one of `filenames` (present, not yet verified), or None."""
    if not filenames:
        return None
    for folder in local_folders(source, environ):
        if all((folder.path / name).is_file() for name in filenames):
            return folder
    return None


def how_to_provide(source: str) -> str:
    """The ways to give fedskew a source's files without the network, as lines for an error message."""
    lines = []
    if source in OS_PACKAGES:
        package = OS_PACKAGES[source]
        lines.append(f"Or install them from the OS package (Debian/Ubuntu, into {package.folder}): "
                     f"sudo apt-get install {package.name}")
    lines.append(f"Or put them in a folder of your own and name it in {ENV_VAR} (a ':'-separated list; "
                 f"fedskew looks in <folder>/{source}/ and <folder>/): export {ENV_VAR}=/path/to/folder")
    return "\n".join(lines)
