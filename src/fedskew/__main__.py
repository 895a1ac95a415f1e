"""fedskew's entry point, for `python -m fedskew` and the installed `fedskew` script alike.

Both must pin the portable CPU kernels (fedskew.numerics.cpu_pin) before torch or numpy is imported, since the
libraries read the pin's variables once, when they load: so this module imports nothing heavy before
`main` has applied it, and the CLI only afterwards. (Importing the package applies the pin already, for use
from Python; `main` applies it again to report an unknown FEDSKEW_CPU_KERNELS, which the import leaves to it.)
"""

import logging
import os
import sys

from fedskew.numerics import cpu_pin


def main() -> int:
    # Before torch picks a kernel: the same CPU results on any x86-64 CPU (fedskew.numerics.cpu_pin).
    try:
        cpu_pin.apply()
    except cpu_pin.CpuPinError as error:
        print(f"fedskew: error: {error}", file=sys.stderr)
        return 2
    # Before any message or job: a password in MLFLOW_TRACKING_URI moves to MLflow's credential variables, so
    # that neither fedskew, nor the jobs it starts, nor MLflow's own lines print it (fedskew.tracking.store).
    # What is left of secrets in the URI (its query, its fragment) is masked in every line this process prints.
    from fedskew.tracking import redaction
    from fedskew.tracking.store import move_credentials_out_of_uri

    redaction.install()
    if warning := move_credentials_out_of_uri():
        print(f"fedskew: {warning}", file=sys.stderr)

    from fedskew.cli import main as cli_main  # after the pin, on purpose

    code = cli_main()
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        # A training job's files are written and fsynced, and its tracker has finished: skip the
        # interpreter's teardown with torch loaded (about 0.45 s per job, a sixth of its fixed cost).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
