"""The portable CPU kernels (fedskew.numerics.cpu_pin): which variables, when, and what a run records."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedskew.numerics import cpu_pin
from tests.helpers import REPO


def test_portable_kernels_set_every_variable_that_is_unset():
    environ: dict[str, str] = {}
    added = cpu_pin.apply(environ, machine="x86_64")
    assert added == environ == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                                "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}


def test_a_variable_the_user_set_is_kept_and_recorded():
    environ = {"MKL_CBWR": "AVX2"}
    cpu_pin.apply(environ, machine="x86_64")
    assert environ["MKL_CBWR"] == "AVX2" and environ["ATEN_CPU_CAPABILITY"] == "avx2"
    record = cpu_pin.describe(environ, machine="x86_64")
    assert record["cpu_kernels"] == "portable" and record["env_MKL_CBWR"] == "AVX2"


@pytest.mark.parametrize("environ, machine", [({"FEDSKEW_CPU_KERNELS": "native"}, "x86_64"),
                                              ({"FEDSKEW_CPU_KERNELS": " Native "}, "x86_64"),
                                              ({}, "aarch64")])
def test_native_kernels_and_other_architectures_set_nothing(environ, machine):
    before = dict(environ)
    assert cpu_pin.apply(environ, machine=machine) == {} and environ == before
    kernels = cpu_pin.describe(environ, machine=machine)["cpu_kernels"]
    assert kernels == ("native" if machine == "x86_64" else "own (aarch64: nothing to pin)")


def test_an_unknown_choice_is_refused_with_what_is_allowed():
    with pytest.raises(cpu_pin.CpuPinError, match="'fast' is not one of portable, native"):
        cpu_pin.apply({"FEDSKEW_CPU_KERNELS": "fast"}, machine="x86_64")
    done = subprocess.run([sys.executable, "-m", "fedskew", "validate"], cwd=REPO, capture_output=True, text=True,
                          env={"FEDSKEW_CPU_KERNELS": "fast", "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert done.returncode == 2 and "FEDSKEW_CPU_KERNELS='fast' is not one of portable, native" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("environ, machine, recorded", [({}, "x86_64", None),
                                                       ({"FEDSKEW_CPU_KERNELS": "portable"}, "x86_64", None),
                                                       ({"FEDSKEW_CPU_KERNELS": " Native "}, "x86_64", "native"),
                                                       ({"FEDSKEW_CPU_KERNELS": "native"}, "aarch64", None)])
def test_a_run_id_records_native_kernels_only_where_the_pin_applies(environ, machine, recorded):
    assert cpu_pin.kernels_in_run_id(environ, machine=machine) == recorded


def test_a_run_id_refuses_an_unknown_choice():
    with pytest.raises(cpu_pin.CpuPinError, match="'fast' is not one of portable, native"):
        cpu_pin.kernels_in_run_id({"FEDSKEW_CPU_KERNELS": "fast"}, machine="aarch64")


@pytest.mark.skipif(not cpu_pin.is_x86_64(), reason="the pin applies to x86-64 CPUs")
def test_a_fedskew_process_uses_the_pinned_kernels():
    """`python -m fedskew` pins before torch computes: ATen at AVX2, oneDNN and NNPACK off for training."""
    code = ("from fedskew.numerics import cpu_pin; cpu_pin.apply(); import json, torch; cpu_pin.configure_torch(); "
            "print(json.dumps(cpu_pin.describe()))")
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    record = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                       check=True, timeout=120).stdout)
    assert record["cpu_capability"] == "AVX2" and record["env_MKL_CBWR"] == "COMPATIBLE"
    assert record["torch_mkldnn"] == "False" and record["torch_nnpack"] == "False"
