"""fedskew from Python (a notebook, a script): `import fedskew` trains with the command line's CPU kernels, or a
run is refused with what to do when numpy or torch chose their kernels first (docs/configuration.md)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedskew.numerics import cpu_pin

REPO = Path(__file__).resolve().parents[2]

# What a notebook does after its imports: the tiny project's run, trained through the package's names.
TRAIN = ("params = fedskew.load_params('params.yaml'); cfg = params.run('tiny', 'digits', 'dir0.5', 'fedavg', 0); "
         "fedskew.prepare_inputs(params, [cfg]); result = fedskew.run_training(cfg); "
         "from fedskew.numerics import gemm; import json, hashlib; "
         "print(json.dumps({'history': hashlib.sha256(json.dumps(result.history, sort_keys=True, default=repr)"
         ".encode()).hexdigest(), **cpu_pin_record(), **gemm.describe()}))")
RECORD = "def cpu_pin_record():\n    from fedskew.numerics import cpu_pin\n    return cpu_pin.describe()\n"

pytestmark = pytest.mark.skipif(not cpu_pin.is_x86_64(), reason="the pin applies to x86-64 CPUs")


def _python(project: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` in the project, in an environment without the pin's variables (a fresh notebook)."""
    clean = {k: v for k, v in os.environ.items() if k not in cpu_pin.PIN_VARIABLES and k != cpu_pin.ENV_VAR}
    return subprocess.run([sys.executable, "-c", RECORD + code], cwd=project, capture_output=True, text=True,
                          timeout=300, env={**clean, "PYTHONPATH": str(REPO / "src"), "FEDSKEW_TRACKING": "0", **env})


def _digest_here(project: Path) -> str:
    """The same run trained in this process, under the kernels `python -m fedskew` pins (tests/conftest.py)."""
    from fedskew.config import load_params
    from fedskew.engine.simulation import run_training

    shutil.rmtree(project / "results" / "checkpoints", ignore_errors=True)  # train it, do not resume the child's
    cfg = load_params(project / "params.yaml").run("tiny", "digits", "dir0.5", "fedavg", 0)
    history = run_training(cfg, root=project).history
    return hashlib.sha256(json.dumps(history, sort_keys=True, default=repr).encode()).hexdigest()


def _trained(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_fedskew_first_trains_with_the_kernels_of_the_command_line(project):
    record = _trained(_python(project, "import fedskew, numpy, torch\n" + TRAIN))
    assert (record["env_OPENBLAS_CORETYPE"], record["env_ATEN_CPU_CAPABILITY"]) == ("Haswell", "avx2")
    assert record["gemm_kernels"] == "Haswell" and record["cpu_capability"] in ("AVX2", "DEFAULT")
    assert record["torch_mkldnn"] == "False" and record["torch_nnpack"] == "False"
    assert record["history"] == _digest_here(project)


def test_numpy_imported_first_trains_the_same_run_or_says_what_to_do(project):
    """Whether numpy's OpenBLAS, loaded before the pin, took the Haswell kernels depends on the CPU: where it
    did, the run is the command line's; where it did not, the run is refused before it trains."""
    done = _python(project, "import numpy\nimport fedskew\n" + TRAIN)
    if done.returncode == 0:
        assert _trained(done)["history"] == _digest_here(project)
    else:
        assert "GemmSetupError" in done.stderr and "numpy was loaded before fedskew" in done.stderr
        assert "but numpy has OpenBLAS at its Haswell kernels" not in done.stderr


def test_numpy_loaded_at_other_kernels_is_refused_with_what_to_do(project):
    # OpenBLAS reads OPENBLAS_CORETYPE when numpy loads: this numpy has the Prescott kernels, as a CPU whose own
    # choice is not Haswell would give it; the variable is then gone, as in a notebook that never set it.
    done = _python(project, "import numpy, os\ndel os.environ['OPENBLAS_CORETYPE']\nimport fedskew\n" + TRAIN,
                   OPENBLAS_CORETYPE="Prescott")
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    # (OpenBLAS names the kernels OPENBLAS_CORETYPE=Prescott selects by their own name)
    assert re.match(r"fedskew\.numerics\.gemm\.GemmSetupError: the portable CPU kernels need numpy's OpenBLAS at "
                    r"its Haswell kernels, but numpy has OpenBLAS at its (?!Haswell)\w+ kernels: numpy was loaded "
                    r"before fedskew set OPENBLAS_CORETYPE: import fedskew before numpy and torch", message), message
    assert "OPENBLAS_CORETYPE=Haswell" in message and "FEDSKEW_CPU_KERNELS=native" in message
    assert not (project / "results" / "checkpoints").exists()  # refused before any round


def test_torch_computing_first_trains_the_same_run_or_says_what_to_do(project):
    """ATen fixes its kernels at its first computation: above AVX2 (a CPU with AVX-512) the run is refused."""
    done = _python(project, "import torch\n(torch.ones(3) + 1).sum()\nimport fedskew\n" + TRAIN)
    if done.returncode == 0:
        assert _trained(done)["history"] == _digest_here(project)
    else:
        message = done.stderr.strip().splitlines()[-1]
        assert message.startswith("fedskew.numerics.cpu_pin.PinTooLateError: the portable CPU kernels need torch's "
                                  "at AVX2, but torch computed at AVX512")
        assert "import fedskew before numpy and torch" in message
        assert not (project / "results" / "checkpoints").exists()


@pytest.mark.parametrize("environ, capability, refused", [
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX512", True),     # torch computed before the pin set the variable
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2", False),      # the pin in force
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "DEFAULT", False),   # a CPU without AVX2: as under `python -m fedskew`
    ({"ATEN_CPU_CAPABILITY": "avx512"}, "AVX512", False),  # the user's own choice, recorded in the provenance
])
def test_only_torch_kernels_chosen_before_the_pin_are_refused(environ, capability, refused):
    if refused:
        with pytest.raises(cpu_pin.PinTooLateError, match="before fedskew set ATEN_CPU_CAPABILITY"):
            cpu_pin.check_torch_kernels(environ, capability)
    else:
        cpu_pin.check_torch_kernels(environ, capability)


def test_the_package_import_stays_free_of_torch_and_numpy_and_keeps_an_unknown_choice_for_the_cli(tmp_path):
    code = "import sys, fedskew; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    done = _python(tmp_path, code, FEDSKEW_CPU_KERNELS="fast")
    assert done.returncode == 0 and done.stdout.strip().endswith("[]"), done.stderr[-2000:]
    cli = _python(tmp_path, "import sys; sys.argv = ['fedskew', 'validate']; from fedskew.__main__ import main; "
                            "sys.exit(main())", FEDSKEW_CPU_KERNELS="fast")
    assert cli.returncode == 2 and "FEDSKEW_CPU_KERNELS='fast' is not one of portable, native" in cli.stderr
