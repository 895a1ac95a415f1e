"""The first sources of a raw file: folders on this machine (fedskew.data.sources), the folders of
FEDSKEW_DATA_DIRS in order, then an OS package's folder such as Debian's dataset-fashion-mnist.

A file is copied, then the copy is verified; a copy that does not verify is skipped (it may be another
dataset's file of the same name) and named in the error if nothing else serves the file.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from fedskew.data.fetch.verify import DatasetCorruptError, SourceFile, verified
from fedskew.data.sources import ENV_VAR, LocalFolder, local_folders, named_folders

log = logging.getLogger(__name__)


def searched_folders(name: str) -> list[LocalFolder]:
    """The local folders that may hold `name`'s files, in the order they are searched; a folder named in
    FEDSKEW_DATA_DIRS that does not exist is warned about."""
    local = local_folders(name)
    for named in named_folders():
        if not named.is_dir():
            log.warning("%s: %s names %s, which is not a folder", name, ENV_VAR, named)
    return local


def copy_local(name: str, f: SourceFile, local: list[LocalFolder], dest: Path, refused: list[str]) -> dict | None:
    """Copy `f` to `dest` from the first local folder holding a copy that verifies; its marker entry, or None.

    The copy is what gets verified (not the original, which could change meanwhile). A copy that does
    not verify is skipped, its reason kept in `refused`: the next folder or the network may serve the file.
    """
    for source in local:
        original = source.path / f.filename
        if not original.is_file():
            continue
        try:
            shutil.copyfile(original, dest)
            entry = verified(name, f, dest, f"in {source.describe()}", source.record(original))
        except OSError as error:
            refused.append(f"{original}: cannot be read ({error})")
            dest.unlink(missing_ok=True)
            continue
        except DatasetCorruptError as error:
            log.warning("%s: skipping %s: %s", name, original, error)
            refused.append(str(error))
            dest.unlink(missing_ok=True)
            continue
        log.info("%s: %s from %s, verified by %s", name, f.filename, source.describe(), entry["verified_by"])
        return entry
    return None
