#!/usr/bin/env bash
# Install the OS packages that hold datasets fedskew reads without a download: today one, Debian's
# and Ubuntu's dataset-fashion-mnist (about 30 MB: Fashion-MNIST's four official files in
# /usr/share/datasets/fashion-mnist; fedskew verifies them by the md5s of their content).
#
# Who needs it: the suites that train on Fashion-MNIST (scala_table) and the tests that read the
# real files (tests/unit/test_fashionmnist_os_package.py). The default suite (`make run`) does not,
# so scripts/env.sh never runs this; `make system-packages` does, and `make test` / `make test-fast`
# run that target first, so that CI's fresh machine exercises the real files.
#
# Where the package is installed it prints nothing and does nothing. Where it can install (root,
# apt-get) it says what it installs and why, then installs. Anywhere else it prints the one line to
# act on. It never fails: the tests that need the package are skipped without it, saying why, and a
# suite that needs it downloads the files where the network allows.
set -uo pipefail

package=dataset-fashion-mnist
folder=/usr/share/datasets/fashion-mnist
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

if [ $# -gt 0 ]; then
  echo "system-packages.sh: takes no arguments (got '$*'); it installs $package where it can" >&2
  exit 2
fi

installed() {
  local file
  for file in "${files[@]}"; do [ -f "$folder/$file" ] || return 1; done
}

advise() {
  echo "fedskew: Fashion-MNIST can come from the OS package instead of a download ($1): run" \
    "'sudo apt-get install $package', or put its four files in a folder and name it in FEDSKEW_DATA_DIRS" \
    "(docs/datasets.md); without it the tests that read the real files are skipped" >&2
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
echo "fedskew: installing the OS package $package with apt-get (about 30 MB into $folder):" \
  "Fashion-MNIST's official files, which the tests and the suites that read Fashion-MNIST take" \
  "offline instead of downloading; the default suite does not need it" >&2
if ! install && grep -q "Unable to locate package\|has no installation candidate" "$log"; then
  # No package lists yet (a fresh machine): fetch them once, then try again.
  echo "fedskew: apt-get has no package lists here yet; running 'apt-get update' first" >&2
  apt-get update -q -o DPkg::Lock::Timeout=120 >>"$log" 2>&1 && install
fi
if installed; then
  echo "fedskew: installed $package into $folder" >&2
else
  tail -n 3 "$log" | sed 's/^/  apt-get: /' >&2
  advise "installing it failed"
fi
exit 0
