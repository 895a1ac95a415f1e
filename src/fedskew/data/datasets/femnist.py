"""FEMNIST from LEAF (Caldas et al. 2019), as FedLC uses it: 62 classes, 28x28 gray, one client per writer.

Source: LEAF builds FEMNIST from NIST Special Database 19 with its own scripts; there is
no stable official download of the preprocessed files, so fedskew does not download
anything here: it reads the JSON files LEAF writes, placed by hand. To make them:

    git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist
    ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample    # downloads NIST SD19 itself
    # LEAF's small benchmark version uses --sf 0.05; -t sample gives every writer a train and a test split

then copy leaf/data/femnist/data/train/*.json to data/raw/femnist/train/ and
leaf/data/femnist/data/test/*.json to data/raw/femnist/test/.

On disk: data/raw/femnist/train/*.json, data/raw/femnist/test/*.json (LEAF format:
{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}),
VERIFIED.json (sha256, size and mtime of every JSON file: LEAF's output depends on its
sampling seeds, so no digest can be pinned; the files are hashed at every load, their digests
key the cache and the decode checks the bytes it reads against them), the
decoded cache of all writers tensors.pt + tensors.json, and for a writer subset the
folder writers<k>-seed<s>/ with its own tensors.pt + tensors.json.

Decoding decisions:
* LEAF stores pixel v/255 for v in 0..255 (white background = 1.0); fedskew stores
  round(255 * x) as uint8 [N, 1, 28, 28] (exact), without inverting; a value that is not
  such a multiple of 1/255 (to 1e-3) is an error;
* labels are LEAF's 0..61 (digits, upper-case, lower-case letters);
* writers are the users of the train files, sorted by name; `natural_groups[i]` is the
  index of sample i's writer, so partition scheme `natural` gives one client per writer;
  samples are ordered by writer, then in file order; a user listed twice in one split is
  an error;
* spec `writers` (default 100, FedLC's 100 FEMNIST clients; null = every writer) keeps a
  subset of that many writers drawn with numpy.random.default_rng(seed) (spec `seed`,
  default 0) without replacement among the writers with training samples, then sorted;
* test set = LEAF's per-user test splits pooled over the kept writers. If none of the kept
  writers has test samples (LEAF run with `-t user`, whose test users are disjoint from the
  train users), the test splits of all test users are pooled instead (logged). With
  `writers: null` every test user is pooled.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from fedskew.data.datasets.base import FileSource
from fedskew.declarations import Hyperparameter
from fedskew.data.fetch import MARKER, DatasetCorruptError, DatasetUnavailableError, Reach
from fedskew.data.fetch.reading import read_verified
from fedskew.data.files import digest_of, remove_stale_temporaries, tree_digests
from fedskew.data.tensors import CACHE, cached_tensors, split_problems

log = logging.getLogger(__name__)

NAME = "femnist"
NUM_CLASSES = 62
IMAGE_SHAPE = (1, 28, 28)
PREPROCESSING = "femnist-v1"
HOW_TO_GET = """FEMNIST is built by LEAF's scripts from NIST SD19; fedskew does not download it. Run
    git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist
    ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample
(LEAF's smaller benchmark uses --sf 0.05), then copy leaf/data/femnist/data/train/*.json into
<folder>/train/ and leaf/data/femnist/data/test/*.json into <folder>/test/. Each file is LEAF JSON:
{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats in 0..1]], "y": [labels 0..61]}}}."""


def raw_dir(raw_root: Path) -> Path:
    return Path(raw_root) / NAME


def _json_files(folder: Path) -> dict[str, Path]:
    """relative name -> path of every train/*.json and test/*.json; DatasetUnavailableError if a split has none."""
    files, empty = {}, []
    for split in ("train", "test"):
        found = sorted((folder / split).glob("*.json")) if (folder / split).is_dir() else []
        if not found:
            empty.append(f"{(folder / split).resolve()}/*.json")
        files.update({f"{split}/{p.name}": p for p in found})
    if empty:
        raise DatasetUnavailableError(
            f"dataset 'femnist' is not available: no LEAF JSON files in {' and '.join(empty)}.\n"
            + HOW_TO_GET.replace("<folder>", str(folder.resolve())))
    return files


def _read_split(paths: list[tuple[Path, str]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """user -> (uint8 [n, 1, 28, 28], int64 [n]) over LEAF JSON files (path, the sha256 just recorded)."""
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path, sha256 in paths:
        raw = read_verified(path, sha256)  # a file that changed since it was hashed is refused
        try:
            data = json.loads(raw)
            names, user_data = data["users"], data["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DatasetCorruptError(f"{path} is not a LEAF JSON file ({error!r})") from error
        for user in names:
            if user in users:
                raise DatasetCorruptError(f"user {user!r} appears twice in the {path.parent.name} files ({path})")
            try:
                x = np.asarray(user_data[user]["x"], dtype=np.float64)
                y = np.asarray(user_data[user]["y"], dtype=np.int64)
            except (KeyError, TypeError, ValueError) as error:
                raise DatasetCorruptError(f"{path}: user {user!r} has malformed x/y ({error!r})") from error
            if x.ndim != 2 or x.shape[1] != 784 or y.shape != (len(x),):
                raise DatasetCorruptError(f"{path}: user {user!r} has x {x.shape} and y {y.shape}, expected "
                                          f"[n, 784] and [n]")
            scaled = x * 255.0
            pixels = np.rint(scaled)
            if len(x) and (np.abs(scaled - pixels).max() > 1e-3 or pixels.min() < 0 or pixels.max() > 255):
                raise DatasetCorruptError(f"{path}: user {user!r} has pixel values that are not LEAF's v/255")
            if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
                raise DatasetCorruptError(f"{path}: user {user!r} has labels outside 0..{NUM_CLASSES - 1}")
            users[user] = (pixels.astype(np.uint8).reshape(-1, *IMAGE_SHAPE), y)
    return users


def _decode(files: dict[str, Path], digests: dict[str, str]) -> dict[str, torch.Tensor]:
    """All writers: x/y train and test, natural_groups (train writer index) and test_groups (-1: not a train writer).
    `digests`: the sha256 of each file, just hashed, which its bytes must still have."""
    splits = {s: _read_split([(p, digests[k]) for k, p in sorted(files.items()) if k.startswith(f"{s}/")])
              for s in ("train", "test")}
    writers = sorted(u for u, (_, y) in splits["train"].items() if len(y))
    index = {w: i for i, w in enumerate(writers)}
    out = {}
    for split, group_key in (("train", "natural_groups"), ("test", "test_groups")):
        users = sorted(splits[split])
        parts = [splits[split][u] for u in users]
        out[f"x_{split}"] = torch.from_numpy(np.concatenate([x for x, _ in parts]) if parts else
                                             np.zeros((0, *IMAGE_SHAPE), np.uint8))
        out[f"y_{split}"] = torch.from_numpy(np.concatenate([y for _, y in parts]) if parts else np.zeros(0, np.int64))
        ids = np.array([index.get(u, -1) for u in users], dtype=np.int64)
        out[group_key] = torch.from_numpy(np.repeat(ids, [len(y) for _, y in parts]))
    return out


def select_writers(full: dict[str, torch.Tensor], writers: int | None, seed: int) -> dict[str, torch.Tensor]:
    """Keep `writers` writers (all when None) drawn with default_rng(seed); groups renumbered 0..k-1."""
    available = int(full["natural_groups"].max()) + 1
    if writers is None:
        chosen = np.arange(available)
    elif writers > available:
        raise DatasetUnavailableError(f"femnist: writers={writers}, but the LEAF files hold only {available} "
                                      f"writers with training samples; lower `writers` or place more LEAF files")
    else:
        chosen = np.sort(np.random.default_rng(seed).choice(available, size=writers, replace=False))
    new_id = np.full(available, -1, dtype=np.int64)
    new_id[chosen] = np.arange(len(chosen))
    groups = new_id[full["natural_groups"].numpy()]
    keep_train = torch.from_numpy(groups >= 0)
    test_groups = full["test_groups"].numpy()
    keep_test = np.where(test_groups >= 0, new_id[np.maximum(test_groups, 0)] >= 0, False)
    if not keep_test.any():
        log.warning("femnist: none of the kept writers has test samples (LEAF -t user?): pooling every test user")
        keep_test = np.ones(len(test_groups), dtype=bool)
    keep_test = torch.from_numpy(keep_test)
    return {
        "x_train": full["x_train"][keep_train].contiguous(),
        "y_train": full["y_train"][keep_train].contiguous(),
        "natural_groups": torch.from_numpy(groups[groups >= 0]),
        "x_test": full["x_test"][keep_test].contiguous(),
        "y_test": full["y_test"][keep_test].contiguous(),
    }


def problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    issues = split_problems(tensors, torch.uint8, IMAGE_SHAPE, NUM_CLASSES)
    groups = tensors.get("natural_groups")
    if not isinstance(groups, torch.Tensor) or groups.dtype != torch.int64 or groups.shape != tensors["y_train"].shape:
        issues.append("natural_groups is missing or not int64 [N_train]")
    elif len(groups) and (int(groups.min()) < 0 or len(torch.unique(groups)) != int(groups.max()) + 1):
        issues.append("natural_groups are not the contiguous writer ids 0..K-1")
    return issues


def load_tensors(spec: dict, raw_root: Path,
                 reach: Reach = Reach.NETWORK) -> tuple[Path, dict[str, torch.Tensor]]:
    """Decode the hand-placed LEAF files once, keep the spec's writers; return the cache path and the tensors.

    `reach` is accepted for a uniform interface (FileSource.load_tensors); nothing is ever downloaded.
    """
    folder = raw_dir(raw_root)
    files = _json_files(folder)
    remove_stale_temporaries(folder, ".*.tmp-*")
    digests = tree_digests(files, folder / MARKER)  # of the bytes on disk now: they key the cache
    full_key = {"preprocessing": PREPROCESSING, "inputs": digest_of(digests)}
    full = cached_tensors(NAME, folder, full_key, problems, lambda: _decode(files, digests))
    writers, seed = spec.get("writers"), int(spec.get("seed", 0))
    if writers is None:
        return folder / CACHE, full
    subset_dir = folder / f"writers{writers}-seed{seed}"
    if subset_dir.is_dir():
        remove_stale_temporaries(subset_dir, ".*.tmp-*")
    key = {**full_key, "writers": writers, "seed": seed}
    return subset_dir / CACHE, cached_tensors(NAME, subset_dir, key, problems,
                                              lambda: select_writers(full, writers, seed))


class FEMNIST(FileSource):
    name = NAME
    input_shape = IMAGE_SHAPE
    num_classes = NUM_CLASSES
    natural_partition = True
    arrives = "by hand"
    # writers kept (one client each), drawn with seed; null: all
    options = {"writers": Hyperparameter(100, schema={"type": ["integer", "null"], "minimum": 1, "maximum": 131072}),
               "seed": Hyperparameter(0, ref="seed")}
    estimated_sizes = (20430, 2270)  # 100 LEAF writers of about 227 samples, 90/10 per writer
    load_tensors = staticmethod(load_tensors)
