#!/usr/bin/env bash
# One piece of packed work on a GPU machine without network, reached by a command runner that carries
# the working tree there and brings back an output folder ($OUT); run there from the repository root
# (docs/gpu.md):
#   [WORKERS=4] [MAX_ROUNDS=n] bash scripts/device-piece.sh <seconds> <selection...>
# e.g. WORKERS=4 bash scripts/device-piece.sh 480 --suite scala_table --dataset fashionmnist --first scala fedavg splitfed_v1
# It installs the carried wheels (.whl, from scripts/device-prepare.sh), points fedskew at the carried
# dataset files (.data), trains the selection's unfinished runs for at most <seconds> (runs in progress
# are checkpointed there, on the machine, for the next piece), then ships the finished runs into $OUT
# (archives of at most 16 MiB, which the runner brings back; `fedskew packed import` adds them).
set -euo pipefail
limit=$1
shift
export PYTHONPATH=$PWD/src
if ! python3 -c 'import jsonschema' 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export FEDSKEW_DATA_DIRS=$PWD/.data FEDSKEW_TRACKING=0 PYTHONUNBUFFERED=1
# What the runs' provenance records as their commit: this copy of the tree has no .git.
export FEDSKEW_COMMIT=${FEDSKEW_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
status=0
python3 -m fedskew packed run "$@" --workers "${WORKERS:-1}" --time-limit "$limit" \
  ${MAX_ROUNDS:+--max-rounds "$MAX_ROUNDS"} || status=$?
python3 -m fedskew packed ship "$@" --out "${OUT:-shipped}"
mkdir -p "${OUT:-shipped}" && cp logs/packed/pieces.jsonl "${OUT:-shipped}/" 2>/dev/null || true
exit $status
