"""Where each dataset of params.yaml stands on this machine, for `python -m fedskew datasets`: prepared or not,
and where `download` would take its files from. Files are looked for, never read or verified (that is the
download's work, fedskew.data.fetch). Nothing here imports torch."""

from __future__ import annotations

import json
from pathlib import Path

from fedskew import paths
from fedskew.catalog import sources as catalog_sources
from fedskew.data import sources
from fedskew.data.packages import files_of


def prepared(dataset: str, spec: dict) -> tuple[str, dict | None]:
    """Whether data/raw/<dataset>/READY.json exists for this spec ("yes"; "no"; "other spec": prepared for
    another one; "damaged": unreadable), and the shapes it records."""
    ready = Path(paths.RAW_READY.format(dataset=dataset))
    if not ready.exists():
        return "no", None
    try:
        manifest = json.loads(ready.read_text())
        shapes = manifest["shapes"]
    except (OSError, ValueError, KeyError, TypeError):
        return "damaged", None
    if manifest.get("spec") != spec:  # as registry.load: a manifest of another spec is prepared again
        return "other spec", None
    return "yes", shapes


def raw_files_from(source: str) -> str:
    """Where the raw files of a fetched source would come from now: data/raw/<source>, a local folder
    (FEDSKEW_DATA_DIRS, an OS package) or the download host, per file as fedskew.data.fetch looks for them.
    Files are looked for, not verified (that is the download's work, and would cost seconds here)."""
    raw = Path(paths.RAW_DIR.format(dataset=source))
    local = sources.local_folders(source)
    package = sources.REGISTRY_PACKAGES.get(source)
    origins = []
    host = catalog_sources()[source].host
    for filename in catalog_sources()[source].raw_files:
        if (raw / filename).is_file():
            where = str(raw)
        else:
            download = f"download ({host})"
            if package is not None and filename in files_of(package):
                download = f"download ({package.describe()}, else {host})"
            where = next((folder.describe() for folder in local if (folder.path / filename).is_file()), download)
        if where not in origins:
            origins.append(where)
    return " + ".join(origins)


def available_from(dataset: str, spec: dict, prepared: str) -> str:
    """Whether `dataset` is available and where it would come from (see fedskew.listings.cmd_datasets' legend)."""
    source = spec["source"]
    if catalog_sources()[source].arrives == "embedded":
        return "embedded"
    if prepared == "yes":
        return f"prepared ({paths.RAW_DIR.format(dataset=dataset)})"
    if catalog_sources()[source].raw_files:
        return raw_files_from(source)
    if source == "femnist":
        folder = Path(paths.RAW_DIR.format(dataset=source))
        if any((folder / "train").glob("*.json")) and any((folder / "test").glob("*.json")):
            return str(folder)
        return f"not available: place LEAF's JSON files in {folder}/train/ and test/"
    if source == "imagenet_subset":
        if spec.get("imagenet_dir") and Path(spec["imagenet_dir"]).expanduser().is_dir():
            return f"folder {spec['imagenet_dir']}"
        return f"not available: set datasets.{dataset}.imagenet_dir to a local ILSVRC-2012 copy"
    # a source placed by hand that has no rule above: its module's docstring says where its files go
    return f"not shown here: see fedskew.data.datasets.{source} for where its files go"
