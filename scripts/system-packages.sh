#!/usr/bin/env bash
# Install the OS packages that hold datasets fedskew reads without a download: Debian's and
# Ubuntu's dataset-fashion-mnist (about 30 MB: Fashion-MNIST's four official files in
# /usr/share/datasets/fashion-mnist; fedskew verifies them by the md5s of their content).
#
# Runs where it can install (root, apt-get); anywhere else it prints the one line to act on.
# It never fails: a dataset it could not install is still downloaded when the network allows.
# scripts/env.sh calls it, so `make env` / `make test` install the package on a fresh machine.
set -uo pipefail

package=dataset-fashion-mnist
folder=/usr/share/datasets/fashion-mnist
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

installed() {
  local file
  for file in "${files[@]}"; do [ -f "$folder/$file" ] || return 1; done
}

advise() {
  echo "fedskew: Fashion-MNIST can come from the OS package instead of a download ($1): run" \
    "'sudo apt-get install $package', or put its four files in a folder and name it in FEDSKEW_DATA_DIRS" \
    "(docs/datasets.md)" >&2
}

installed && exit 0
if [ "$EUID" != 0 ]; then advise "not root here"; exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then advise "no apt-get here"; exit 0; fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
reinstall=()  # installed, but its files were deleted: apt-get would do nothing without --reinstall
if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed"; then reinstall=(--reinstall); fi
install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${reinstall[@]}" \
    -o DPkg::Lock::Timeout=120 "$package" >"$log" 2>&1
}
echo "fedskew: installing the OS package $package (Fashion-MNIST's official files, about 30 MB)" >&2
if ! install && grep -q "Unable to locate package\|has no installation candidate" "$log"; then
  # No package lists yet (a fresh machine): fetch them once, then try again.
  apt-get update -q -o DPkg::Lock::Timeout=120 >>"$log" 2>&1 && install
fi
if installed; then
  echo "fedskew: installed $package into $folder" >&2
else
  tail -n 3 "$log" | sed 's/^/  apt-get: /' >&2
  advise "installing it failed"
fi
exit 0
