#!/usr/bin/env bash
# One piece of packed work (docs/gpu.md) on a GPU host that may have no network, however it is reached
# (ssh, a batch job, a command runner of your own): run it there from the root of a copy of the working
# tree that holds .whl/ and .data/ from scripts/device-prepare.sh. It uses that host's python3 and torch.
#
#   bash scripts/device-piece.sh [--out DIR] [--workers N] [--max-rounds N] <seconds> <selection...>
#
#   <seconds>        how long the piece may train: runs in progress are checkpointed and paused
#                    before it ends (their checkpoints stay on the host, for the next piece)
#   <selection...>   what `fedskew packed run` selects: --suite, with --dataset, --method, --first, ...
#   --out DIR        where the finished runs' archives (at most 16 MiB each) and the piece's log
#                    (pieces.jsonl) go; bring this folder home for `fedskew packed import`.
#                    Default: shipped (in the tree's root)
#   --workers N      worker processes sharing the device (default 1)
#   --max-rounds N   train at most N rounds of each run (a slice, for measuring)
#
# e.g. bash scripts/device-piece.sh --workers 4 480 --suite scala_table --dataset fashionmnist --first scala fedavg splitfed_v1
#
# It installs the copied wheels where that python3 lacks them, points fedskew at the copied dataset
# files, trains the selection's unfinished runs for at most <seconds>, then ships the finished ones.
# It exits with the status of the training, so a piece whose runs failed says so after shipping the rest.
set -euo pipefail

usage="usage: bash scripts/device-piece.sh [--out DIR] [--workers N] [--max-rounds N] <seconds> <selection...>"
fail() { echo "device-piece: $1" >&2; exit 2; }

out=shipped
workers=1
max_rounds=
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] && [ -n "$2" ] || fail "--out needs a folder ($usage)"; out=$2; shift 2 ;;
    --workers) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "--workers needs a whole number of at least 1, not '${2:-}'"
      workers=$2; shift 2 ;;
    --max-rounds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "--max-rounds needs a whole number of at least 1, not '${2:-}'"
      max_rounds=$2; shift 2 ;;
    -h|--help) echo "$usage" && exit 0 ;;
    -*) fail "unknown option $1 before <seconds> ($usage)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || fail "no <seconds> given ($usage)"
[[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! $1 =~ ^0+([.]0+)?$ ]] || fail "<seconds> must be a positive number, not '$1' ($usage)"
limit=$1
shift
[ $# -ge 1 ] || fail "no selection given: name at least --suite <suite> ($usage)"
[ -f src/fedskew/__init__.py ] || fail "run it from the repository's root (no src/fedskew here: $PWD)"

export PYTHONPATH=$PWD/src
# The host's python3 has torch but may lack fedskew's other dependencies; the copied wheels hold them
# (.whl, no network needed). Installed into a scratch folder, never into that python's site-packages.
if ! python3 -c 'import jsonschema' 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/fedskew-device-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH=$site:$PYTHONPATH
fi
# .data holds the datasets' official files (fedskew verifies them as it would a download); no MLflow
# store there: `packed import` at home logs the runs.
export FEDSKEW_DATA_DIRS=$PWD/.data FEDSKEW_TRACKING=0 PYTHONUNBUFFERED=1
# What the runs' provenance records as their commit where the copy of the tree has no .git (git's own
# answer wins where it has one): pass FEDSKEW_COMMIT=$(git rev-parse HEAD) from home.
export FEDSKEW_COMMIT=${FEDSKEW_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
status=0
python3 -m fedskew packed run "$@" --workers "$workers" --time-limit "$limit" \
  ${max_rounds:+--max-rounds "$max_rounds"} || status=$?
python3 -m fedskew packed ship "$@" --out "$out"
mkdir -p "$out" && cp logs/packed/pieces.jsonl "$out/" 2>/dev/null || true
exit $status
