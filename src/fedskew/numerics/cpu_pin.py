"""Portable CPU kernels: the same CPU results on any x86-64 CPU, whichever one runs the job.

PyTorch picks its CPU kernels at run time by what the CPU offers, and each choice sums in its own
order. A 30-round CNN run then ends a test sample or two apart between CPU models. Measured on the
default suite's FedAvg on digits Q(2), seeds 0 / 1 / 2, on one Intel Xeon with AVX-512 and AMX: the
libraries' own choices give 82.78 / 80.00 / 68.33 %, ATen capped at AVX2 gives 82.78 / 80.00 / 68.61,
ATen and MKL at AVX2 82.50 / 80.00 / 68.61, and the tables committed before this pin (made on
another CPU) had 82.78 / 80.28 / 68.61. Capping instruction sets is not enough: oneDNN and NNPACK
choose their blocking by the CPU and promise no equality across CPUs, and MKL's AVX2 branch gave
other bits on an AMD CPU than on Intel ones (QEMU's EPYC-Rome model against Haswell and this Xeon;
benchmarks/README.md). So fedskew takes, for CPU work, only kernels whose arithmetic is fixed by
the instruction set:

- the matrix products of the models' layers (Linear forward and backward, Conv2d as unfold and one
  GEMM, the closed-form dense step) through numpy's OpenBLAS at its Haswell kernels
  (`OPENBLAS_CORETYPE=Haswell`) on one thread (`fedskew.numerics.gemm`): AVX2 and FMA code with one blocking,
  whose bits do not depend on the CPU (measured under QEMU's Intel and AMD models and on an AMD Zen 4)
  but do depend on OpenBLAS's thread count, which the recipe therefore fixes at one;
- ATen's own kernels at AVX2 (`ATEN_CPU_CAPABILITY=avx2`): compiled code, the same on every CPU
  with AVX2 (Intel since 2013, AMD since 2015);
- MKL's `COMPATIBLE` conditional-numerical-reproducibility branch (`MKL_CBWR=COMPATIBLE`): SSE2
  code that every x86-64 CPU runs, which gave the same bits on the emulated AMD CPU where MKL's
  AVX2 branch did not. It is three times slower than AVX2 code, so it keeps only the products that
  nothing else reaches: the models on recipe 1 (`RECIPE_1_MODELS`), products under `torch.func` transforms (vmap), and the autograd dense path of vectorised
  rounds;
- no oneDNN and no NNPACK for CPU training (`configure_torch`): convolutions then run as ATen's
  im2col and MKL's matrix products;
- the same OpenBLAS for the data generated with numpy (Synthetic(λ, μ)); oneDNN, where anything
  still reaches it, at AVX2;
- square roots through numpy's correctly rounded one (`fedskew.numerics.exact_math`, used by Adam, the FedOpt
  servers, FedDecorr and FL-FCR's sampling): torch's CPU sqrt is not correctly rounded under these
  variables, and its bits differ between an AMD Zen 4 with AVX-512 and CPUs without it.

The recipe has a version (`RECIPES`): a run's id covers the recipe its model runs under
(`kernel_recipe`), so that a run computed under an older recipe is retrained, never reused.

`FEDSKEW_CPU_KERNELS` chooses: `portable` (the default) applies all of this; `native` leaves the
libraries to choose (about twice as fast for the CNNs here, benchmarks/cpu_kernels.py; but CPU
results then move with the CPU model). On x86-64, where the pin applies, `native` is part of every
run id (`kernels_in_run_id`, fedskew.config.RunConfig.run_id): a native run is another run than the
portable one, never found in its place; portable ids are those they always were. Any other value
is refused (`CpuPinError`) by `python -m fedskew` and by the workflow before its first job. A variable
the user already set is left as it is. `import fedskew` applies the pin too, for use from Python; a run
started after numpy or torch chose their own kernels is refused with what to do (`PinTooLateError`:
`check_torch_kernels`, and fedskew.numerics.gemm.enabled for numpy's OpenBLAS). What was in force is recorded with every run (`describe()`:
metrics.json's `provenance`, MLflow's `fedskew.provenance.*` tags). On other architectures (aarch64)
there is nothing to pin: results there are their own. GPU kernels are not affected: GPU results vary
with the GPU model and the precision (docs/reliability.md).
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

ENV_VAR = "FEDSKEW_CPU_KERNELS"
CHOICES = ("portable", "native")
PIN_VARIABLES = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
                 "OPENBLAS_CORETYPE": "Haswell"}


# The portable recipes, by version. A model's runs carry the version they were computed under in
# their run id (fedskew.config.RunConfig.run_id), except version 1, which runs published before
# versions existed were computed under.
RECIPES = {
    1: "MKL COMPATIBLE for every matrix product",
    2: "the layers' matrix products through numpy's OpenBLAS (Haswell kernels, one thread); MKL COMPATIBLE for the rest",
}
RECIPE = 2
# Models whose products stay on recipe 1:
# - logreg: its products are batch × features × classes (10 × 60 × 10 on Synthetic), where a call
#   into numpy costs more than the product, and recipe 1 already runs it at native speed
#   (benchmarks/cpu_kernels.py);
RECIPE_1_MODELS = frozenset({"logreg"})


def kernel_recipe(model: str) -> int:
    """The version of the portable recipe that computes `model`'s CPU runs."""
    return 1 if model in RECIPE_1_MODELS else RECIPE


class CpuPinError(ValueError):
    """FEDSKEW_CPU_KERNELS holds a value fedskew does not know."""


class PinTooLateError(RuntimeError):
    """The portable kernels are asked for, but a library chose its kernels before the pin was applied."""


def how_to_pin() -> str:
    """What to do when the pin came too late, as every such error ends."""
    variables = " ".join(f"{name}={value}" for name, value in PIN_VARIABLES.items())
    return (f"import fedskew before numpy and torch (in a notebook: first, after restarting its kernel), which sets "
            f"the kernels as `python -m fedskew` does; or start Python with {variables} in its environment; or set "
            f"{ENV_VAR}=native (results that depend on the CPU model)")


def is_x86_64(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def requested(environ: MutableMapping[str, str] = os.environ) -> str:
    """The kernels FEDSKEW_CPU_KERNELS asks for (`portable` when unset); an unknown value is an error."""
    value = environ.get(ENV_VAR, "").strip().lower() or "portable"
    if value not in CHOICES:
        raise CpuPinError(f"{ENV_VAR}={environ.get(ENV_VAR)!r} is not one of {', '.join(CHOICES)}: use portable "
                          f"(the default: the same CPU results on any x86-64 CPU) or native (the CPU's own kernels, "
                          f"results that depend on the CPU model)")
    return value


def kernels_in_run_id(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> str | None:
    """What a run id records of the kernels: `native` where the pin applies (x86-64) but is turned off; None
    for the portable default and on other architectures, where there is nothing to pin."""
    kernels = requested(environ)
    return kernels if kernels != "portable" and is_x86_64(machine) else None


def active(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> bool:
    return requested(environ) == "portable" and is_x86_64(machine)


def apply(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> dict[str, str]:
    """Set the pin's variables in `environ` where they are unset; returns those this call set.

    Call it before torch and numpy compute anything: the libraries read these variables once, when
    they first choose a kernel. fedskew's entry point (`python -m fedskew`) does it first thing."""
    if not active(environ, machine):
        return {}
    added = {name: value for name, value in PIN_VARIABLES.items() if name not in environ}
    environ.update(added)
    return added


def configure_torch(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> None:
    """Turn off the CPU backends whose arithmetic depends on the CPU model (oneDNN, NNPACK), when the
    portable kernels are asked for, and refuse a torch that chose its own kernels before the pin
    (`check_torch_kernels`). Called by the engine before a run trains."""
    if not active(environ, machine):
        return
    import torch

    check_torch_kernels(environ, torch.backends.cpu.get_cpu_capability())
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)


def check_torch_kernels(environ: MutableMapping[str, str], capability: str) -> None:
    """PinTooLateError when ATen's kernels are above the pin's while the pin's own value is in force.

    ATen fixes its capability at its first computation, reading ATEN_CPU_CAPABILITY then: a process in which
    torch computed before fedskew set the variable (a notebook that imported torch and used it first) keeps
    the CPU's own kernels. Only a capability above the pin's is refused: a CPU without AVX2 reports less, as
    it would under `python -m fedskew`, and a value the user set is theirs (and recorded in the provenance)."""
    wanted = PIN_VARIABLES["ATEN_CPU_CAPABILITY"]
    if environ.get("ATEN_CPU_CAPABILITY", "").lower() == wanted and capability.upper().startswith("AVX512"):
        raise PinTooLateError(f"the portable CPU kernels need torch's at {wanted.upper()}, but torch computed at "
                              f"{capability} before fedskew set ATEN_CPU_CAPABILITY: {how_to_pin()}")


def describe(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> dict[str, str]:
    """What was in force, for a run's provenance and tags: the kernels asked for, each library's setting,
    and the capability torch's CPU kernels actually use (`AVX2`, `AVX512`, ... or `unknown`)."""
    try:
        kernels = requested(environ)
    except CpuPinError:
        kernels = f"invalid ({environ.get(ENV_VAR)})"
    if not is_x86_64(machine):
        kernels = f"own ({machine or platform.machine()}: nothing to pin)"
    record = {"cpu_kernels": kernels}
    record.update({f"env_{name}": environ.get(name, "unset") for name in PIN_VARIABLES})
    try:
        import torch

        record["cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
        record["torch_mkldnn"] = str(torch.backends.mkldnn.enabled)
        record["torch_nnpack"] = str(torch._C._get_nnpack_enabled())
    except Exception:  # noqa: BLE001 - a provenance field must never fail a run
        record["cpu_capability"] = "unknown"
    return record
