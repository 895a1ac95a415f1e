#!/usr/bin/env bash
# Make sure ./.venv is a working fedskew environment, building what is missing.
#
# The heavy environment (torch with its CUDA libraries, snakemake, dvc, mlflow: about
# 5 GB) is built once per hash of requirements.lock (+ Python version) under
# $FEDSKEW_ENV_HOME (default ~/.cache/fedskew/envs/<hash>) and shared by every clone on
# the machine, so CI's fresh clones reuse it instead of filling the disk. Each clone
# gets a thin ./.venv (a few KB) that layers the clone's own src/ on top of the shared
# environment. Re-running is cheap: nothing is rebuilt unless the lock file changed.
#
# torch and torchvision must come from the same index: a machine's pip configuration
# may point at another index or a folder of wheels (a CPU-only torch, say), and mixing
# such a torch with torchvision from PyPI gives "operator torchvision::nms does not
# exist". We therefore ignore local pip configuration and wheel folders and install
# the exact pins of requirements.lock.
#
# It installs Python packages only: what the default suite (`make run`) needs. The OS packages
# that some suites and tests read datasets from are installed by scripts/system-packages.sh
# (`make system-packages`, which `make test` and `make test-fast` run), never by this script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lock="$root/requirements.lock"
python=${FEDSKEW_PYTHON:-python3}

"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "fedskew needs Python >= 3.11; '$python' is $("$python" --version 2>&1). Set FEDSKEW_PYTHON to a newer interpreter." >&2
  exit 1
}
pyver=$("$python" -c 'import sys, platform; print(f"{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}")')
hash=$( { cat "$lock"; echo "$pyver"; } | sha256sum | cut -c1-16)
env_home=${FEDSKEW_ENV_HOME:-$HOME/.cache/fedskew/envs}
shared="$env_home/$hash"
thin="$root/.venv"

# Up to date: the thin .venv points at this lock file's environment, from this folder
# (a moved clone gets a new .venv: its scripts hold absolute paths).
stamp="$shared $root"
if [ -f "$thin/fedskew-env" ] && [ "$(cat "$thin/fedskew-env")" = "$stamp" ] && [ -f "$shared/.complete" ]; then
  touch "$shared/.complete"   # records last use, for pruning
  exit 0
fi

mkdir -p "$env_home"
lockfile="$env_home/$hash.lock"
(
  # One builder per hash at a time: parallel clones wait instead of racing. A clone that waits says once what
  # for, with what the holder wrote into the lock file (which process, of which clone, since when), rather than
  # minutes of silence. The file is opened for appending, so that a waiter never erases what it says.
  if ! flock -n 9; then
    holder=$(head -c 300 "$lockfile" | tr -d '\n')
    echo "fedskew: waiting for the shared environment $shared: ${holder:-another process} holds its lock" \
      "($lockfile); going on once it is released" >&2
    flock 9
  fi
  trap ': > "$lockfile"' EXIT  # the holder's line goes with its hold, a failed build's too
  echo "process $$ of the clone $root (since $(date -u '+%Y-%m-%d %H:%M:%S UTC'))" > "$lockfile"
  if [ ! -f "$shared/.complete" ]; then
    echo "fedskew: building the shared environment $shared (once per requirements.lock; several minutes)" >&2
    rm -rf "$shared"
    "$python" -m venv "$shared"
    env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
      "$shared/bin/python" -m pip install --quiet --no-cache-dir --no-deps -r "$lock"
    "$shared/bin/python" -m pip check
    # The failure mode we guard against: a torchvision built for another torch.
    "$shared/bin/python" -c 'import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)'
    touch "$shared/.complete"
  fi
) 9>>"$lockfile"

# Thin per-clone environment: its own interpreter link, the shared site-packages, and src/.
rm -rf "$thin"
"$python" -m venv --without-pip "$thin"
site=$("$thin/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shared_site=$("$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf 'import site; site.addsitedir(%s)\n' "'$shared_site'" > "$site/fedskew-shared.pth"
echo "$root/src" > "$site/fedskew-src.pth"
# Console scripts (snakemake, dvc, mlflow, pytest, ...) re-pointed at the thin interpreter.
for script in "$shared"/bin/*; do
  name=$(basename "$script")
  [ -e "$thin/bin/$name" ] && continue
  if head -n1 "$script" | grep -q "^#!$shared/bin/python"; then
    { echo "#!$thin/bin/python"; tail -n +2 "$script"; } > "$thin/bin/$name"
    chmod +x "$thin/bin/$name"
  fi
done
echo "$stamp" > "$thin/fedskew-env"
touch "$shared/.complete"

# Prune shared environments of other lock files unused for 14 days.
find "$env_home" -mindepth 2 -maxdepth 2 -name .complete -mtime +14 -printf '%h\n' 2>/dev/null |
  while read -r old; do [ "$old" != "$shared" ] && rm -rf "$old" "$old.lock"; done
echo "fedskew: environment ready (.venv -> $shared)" >&2
