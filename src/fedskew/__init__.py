"""fedskew: a reproducible benchmark of federated and split-federated learning under label skew.

Importing the package sets the portable CPU kernels' variables (fedskew.numerics.cpu_pin.apply), as
`python -m fedskew` does first thing: numpy and torch read them once, when they load or first compute, so a
notebook or script that imports fedskew before them trains with the kernels of the command line. One that
loaded numpy's OpenBLAS at other kernels, or let torch compute, before importing fedskew is refused when a run
starts, with what to do (docs/configuration.md, "From Python"). The names a notebook needs are here, loaded on
first use so that this import stays free of torch and numpy:

    import fedskew                                # first, before numpy and torch
    params = fedskew.load_params("params.yaml")
    cfg = params.run("default", "digits", "q2", "fedavg", 0)
    fedskew.prepare_inputs(params, [cfg])         # its dataset and partition, where missing
    result = fedskew.run_training(cfg)            # result.history, result.final
"""

from importlib import import_module

from fedskew.numerics import cpu_pin as _cpu_pin

__version__ = "0.1.0"

try:
    _cpu_pin.apply()
except _cpu_pin.CpuPinError:
    pass  # an unknown FEDSKEW_CPU_KERNELS: `python -m fedskew`, the workflow and every run id report it

# name -> the module that defines it, imported when the name is first used
_LAZY = {"load_params": "fedskew.config", "prepare_inputs": "fedskew.packed.plan",
         "run_training": "fedskew.engine.simulation"}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'fedskew' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
