import logging
import os
import sys

from fedskew import cpu_pin

# Before torch picks a kernel: the same CPU results on any x86-64 CPU (fedskew.cpu_pin).
try:
    cpu_pin.apply()
except cpu_pin.CpuPinError as error:
    print(f"fedskew: error: {error}", file=sys.stderr)
    sys.exit(2)

from fedskew.cli import main  # noqa: E402 - after the pin, on purpose

code = main()
if len(sys.argv) > 1 and sys.argv[1] == "train":
    # A training job's files are written and fsynced, and its tracker has finished: skip the
    # interpreter's teardown with torch loaded (about 0.45 s per job, a sixth of its fixed cost).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
