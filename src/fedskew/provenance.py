"""Where a run's numbers were computed: device, library versions, precision and code.

A run's numbers depend only on its resolved config (its run id), which names its
precision; GPU results still differ in the last bits between GPU models, drivers and
library versions. So every run records what computed it, in metrics.json (`provenance`)
and, when it is tracked, as MLflow tags. The commit comes from git where the code is a
checkout, else from FEDSKEW_COMMIT (a machine that received a copy of the working tree
without .git: say which commit it is); `code_sha256` identifies the code either way.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from functools import cache
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent  # src/fedskew


@cache
def code_sha256() -> str:
    """sha256 over fedskew's source files (path and bytes, in path order): the code that ran, with or without git."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_ROOT.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yaml"):
            digest.update(str(path.relative_to(SOURCE_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@cache
def commit() -> str:
    """The git commit of the code, FEDSKEW_COMMIT when git cannot tell, else "unknown".

    A commit whose fedskew sources (src/fedskew) differ from the working tree's is marked `+dirty`:
    the run was computed by code that commit does not hold (its `code_sha256` says which)."""
    head = _git("rev-parse", "--verify", "HEAD")
    if not head:
        return os.environ.get("FEDSKEW_COMMIT", "unknown")
    changed = _git("status", "--porcelain", "--untracked-files=normal", "--", ".")
    return f"{head}+dirty" if changed else head


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_provenance(device: str, precision: str, model: str | None = None) -> dict[str, str]:
    """What computed a run of `model` on `device` ("cpu", "cuda", "cuda:1") in `precision`: every value a
    string. Written into every run's metrics.json (`provenance`) and logged as `fedskew.provenance.*` tags."""
    import torch

    from fedskew.numerics import cpu_pin, gemm

    on_gpu = device.startswith("cuda")
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if on_gpu else cpu_model(),
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda) if on_gpu else "none",
        "cudnn": str(torch.backends.cudnn.version()) if on_gpu else "none",
        "precision": precision,
        "commit": commit(),
        "code_sha256": code_sha256(),
        "python": platform.python_version(),
        **cpu_pin.describe(),  # the CPU kernels' instruction set: what makes CPU results portable
        **gemm.describe(),  # numpy's BLAS, which computes the layers' products under the portable kernels
        **({"cpu_kernel_recipe": f"{cpu_pin.kernel_recipe(model)}: {cpu_pin.RECIPES[cpu_pin.kernel_recipe(model)]}"}
           if model else {}),
    }
