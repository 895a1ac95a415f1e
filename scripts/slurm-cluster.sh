#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, with job accounting, for running the SLURM profile
# (workflow/profiles/slurm) for real: tests/cluster/ uses it, and so can a person trying the profile.
#
#   scripts/slurm-cluster.sh start  [--dir DIR] [--owner-pid PID] [--max-seconds N]
#   scripts/slurm-cluster.sh env    [--dir DIR]    # export lines: SLURM_CONF, account, partition
#   scripts/slurm-cluster.sh status [--dir DIR]    # sinfo and squeue; exit 1 when the cluster is down
#   scripts/slurm-cluster.sh stop   [--dir DIR]    # cancels the jobs, stops every daemon; idempotent
#
# It runs as root (slurmd must, to start jobs as their users) and uses Debian's packages
# (slurm-wlm 22.05: slurmctld, slurmd, slurmdbd and the clients; munge; mariadb-server),
# installing them with apt-get where they are missing. Everything it writes lives under DIR
# (default $FEDSKEW_SLURM_DIR, else /tmp/fedskew-slurm; at most 60 characters, for SLURM's
# socket paths): configuration, MariaDB's data, spool folders, logs, pid files, munge's key and
# socket. Every daemon listens on 127.0.0.1 only, on ports free at start.
#
# One exception: /etc/slurm/slurm.conf, SLURM's default path, becomes a link to DIR's
# slurm.conf while the cluster runs (and only when the path is free or one of our links).
# snakemake-executor-plugin-slurm-jobstep 0.6.1 removes every SLURM_* variable, SLURM_CONF
# included, before the `srun` that starts a job's command inside its allocation, so that srun
# finds the configuration only at the default path (or through configless DNS records).
# Real clusters keep it there; a cluster elsewhere needs the link. So one cluster at a time
# per machine.
#
# Accounting is the real thing (slurmdbd on MariaDB): snakemake-executor-plugin-slurm 2.8.0
# asks `sacct` for the state of its jobs, and checks the profile's account with `sacctmgr`
# before it submits; both talk to slurmdbd. The cluster has one account (ACCOUNT below), which
# root may use, and one partition (PARTITION).
#
# Bounds: every wait has a limit in tries and seconds, and `start` leaves a watchdog that runs
# `stop` when the owner process (--owner-pid, default: the caller of this script) has gone, or
# after --max-seconds (default 3600), whichever comes first: a test that dies leaves no cluster.
set -euo pipefail

ACCOUNT=fedskew
PARTITION=fedskew
CLUSTER=fedskew
NODE=fedskew-node1
DB_USER=slurm
DB_PASS=fedskew-local-only   # a MariaDB bound to 127.0.0.1 inside DIR; not a secret
PACKAGES=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server mariadb-client)
# The marker every daemon of this cluster carries in its environment (with DIR as value), so
# that `stop` finds exactly this cluster's processes (and the job steps they started) by pid.
MARKER=FEDSKEW_SLURM_CLUSTER
DEFAULT_CONF=/etc/slurm/slurm.conf

script=$(readlink -f "$0")
die() { echo "slurm-cluster: $*" >&2; exit 1; }
say() { echo "slurm-cluster: $*" >&2; }

usage() {
  sed -n '2,9p' "$script" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

command=${1:-}
[ -n "$command" ] || usage
shift
dir=${FEDSKEW_SLURM_DIR:-/tmp/fedskew-slurm}
owner=$PPID
max_seconds=3600
while [ $# -gt 0 ]; do
  case $1 in
    --dir) [ $# -ge 2 ] || die "--dir needs a folder"; dir=$2; shift 2 ;;
    --owner-pid) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--owner-pid needs a process id, got '${2:-}'"; owner=$2; shift 2 ;;
    --max-seconds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--max-seconds needs a positive number, got '${2:-}'"
                   max_seconds=$2; shift 2 ;;
    -h|--help) usage ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
conf=$dir/etc/slurm.conf
run=$dir/run
logs=$dir/log

# ---------------------------------------------------------------------------------------------
# Helpers

# wait_for TRIES SLEEP DESCRIPTION COMMAND...: run COMMAND until it succeeds, at most TRIES times.
wait_for() {
  local tries=$1 pause=$2 what=$3 i
  shift 3
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep "$pause"
  done
  say "gave up waiting for $what after $tries tries, ${pause}s apart"
  return 1
}

alive() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# launch NAME COMMAND...: start a daemon in the foreground of its own session, in the background
# of this script, with the cluster's marker in its environment; record its pid.
launch() {
  local name=$1
  shift
  env "$MARKER=$dir" SLURM_CONF="$conf" setsid "$@" >>"$logs/$name.out" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

# The pids of this cluster: every process with the marker in its environment, and their
# descendants (job steps, whose environment is the submitter's). Never this script or its callers.
cluster_pids() {
  python3 - "$MARKER=$dir" "$$" <<'EOF'
import os, sys
marker, me = sys.argv[1].encode(), int(sys.argv[2])
parents, marked = {}, set()
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    pid = int(entry)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            parents[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/environ", "rb") as f:
            if marker in f.read().split(b"\0"):
                marked.add(pid)
    except (OSError, ValueError, IndexError):
        continue
ancestors, pid = set(), me
while pid > 1 and pid not in ancestors:
    ancestors.add(pid)
    pid = parents.get(pid, 0)
found, changed = set(marked), True
while changed:
    children = {p for p, parent in parents.items() if parent in found} - found
    found |= children
    changed = bool(children)
print(" ".join(str(p) for p in sorted(found - ancestors)))
EOF
}

show_logs() {
  local f
  for f in "$logs"/*; do
    [ -s "$f" ] || continue
    echo "--- $f (last 15 lines)" >&2
    tail -n 15 "$f" >&2
  done
}

# ---------------------------------------------------------------------------------------------
# install

apt_install() {  # apt_install PACKAGE...: quietly, without starting any service, within 15 minutes
  # Services must not start on install (they would take /run/munge and port 3306): Debian's
  # policy-rc.d says so in containers; where it is absent, RUNLEVEL=1 keeps invoke-rc.d quiet.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 timeout 900 \
    apt-get install -y -q --no-install-recommends "$@" >>"$logs/apt.out" 2>&1
}

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] ||
    die "missing Debian packages: ${missing[*]}; install them as root: apt-get install ${missing[*]}"
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]} with apt-get"
  if ! apt_install "${missing[@]}"; then
    say "apt-get install failed; updating the package lists once and trying again"
    timeout 300 apt-get update -q >>"$logs/apt.out" 2>&1 ||
      { tail -n 20 "$logs/apt.out" >&2; die "apt-get update failed"; }
    apt_install "${missing[@]}" || { tail -n 20 "$logs/apt.out" >&2; die "apt-get install ${missing[*]} failed"; }
  fi
}

# ---------------------------------------------------------------------------------------------
# configuration

# The link at SLURM's default path (see the header): ours when it points into a cluster folder
# of this script. A link of a cluster that no longer runs is replaced; anything else stops us.
link_default_conf() {
  local target
  if [ -L "$DEFAULT_CONF" ]; then
    target=$(readlink "$DEFAULT_CONF")
    if [ "$target" != "$conf" ]; then
      local other=${target%/etc/slurm.conf}
      [ -f "$other/.fedskew-slurm-cluster" ] ||
        die "$DEFAULT_CONF links to $target, which is not a cluster of this script; remove the link first"
      if [ -f "$other/run/slurmctld.pid" ] && kill -0 "$(cat "$other/run/slurmctld.pid")" 2>/dev/null; then
        die "another cluster of this script runs in $other; stop it first ($script stop --dir $other)"
      fi
    fi
  elif [ -e "$DEFAULT_CONF" ]; then
    die "$DEFAULT_CONF exists: this machine has a SLURM of its own; this script does not touch it"
  fi
  mkdir -p "$(dirname "$DEFAULT_CONF")"
  ln -sfn "$conf" "$DEFAULT_CONF"
}

unlink_default_conf() {
  if [ -L "$DEFAULT_CONF" ] && [ "$(readlink "$DEFAULT_CONF")" = "$conf" ]; then
    rm -f "$DEFAULT_CONF"
  fi
}

write_config() {
  local cpus memory host ctld_port slurmd_port dbd_port db_port
  # This machine's cores and memory as slurmd itself detects them, so the node registers as
  # configured (a node claiming more than slurmd finds is set INVALID and never runs jobs).
  read -r cpus memory < <(slurmd -C | awk '/^NodeName/ {for (i = 1; i <= NF; i++) {split($i, kv, "=");
    if (kv[1] == "CPUs") c = kv[2]; if (kv[1] == "RealMemory") m = kv[2]}; print c, m}')
  [[ $cpus =~ ^[0-9]+$ && $memory =~ ^[0-9]+$ ]] || die "slurmd -C did not report CPUs and RealMemory"
  host=$(hostname -s)
  ctld_port=$(free_port); slurmd_port=$(free_port); dbd_port=$(free_port); db_port=$(free_port)
  mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/munge" "$dir/mysql" "$run" "$logs"
  chmod 755 "$dir/munge"   # clients must reach the socket; the key itself is 0400

  cat >"$conf" <<EOF
# Written by scripts/slurm-cluster.sh: one node, this machine, loopback only.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$run/slurmctld.daemon.pid
SlurmdPidFile=$run/slurmd.daemon.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups here (a container): processes are tracked through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# Cores are consumable, memory is checked but not reserved: a job asking for more than the
# node has is refused, but the profile's memory sizes (16 GB for training, sized for the
# paper suites on real nodes) do not leave a 2-core machine running one job at a time.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Accounting: sacct and sacctmgr, as snakemake-executor-plugin-slurm needs.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
# With slurmdbd this is not a password but the munge socket for talking to slurmdbd: without
# it sacct, sacctmgr and slurmctld use /run/munge/munge.socket.2, which is not this cluster's.
AccountingStoragePass=$dir/munge/munge.socket
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# A cancelled job gets SIGTERM, then SIGKILL after KillWait seconds (time to record KILLED).
KillWait=30
MinJobAge=300
NodeName=$NODE NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

  cat >"$dir/etc/slurmdbd.conf" <<EOF
# Written by scripts/slurm-cluster.sh: accounting in a MariaDB inside $dir, loopback only.
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
LogFile=$logs/slurmdbd.log
PidFile=$run/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$dir/etc/slurmdbd.conf"   # slurmdbd refuses a readable one: it holds the password

  cat >"$dir/etc/cluster.env" <<EOF
export SLURM_CONF=$conf
export FEDSKEW_SLURM_DIR=$dir
export FEDSKEW_SLURM_ACCOUNT=$ACCOUNT
export FEDSKEW_SLURM_PARTITION=$PARTITION
export FEDSKEW_SLURM_NODE=$NODE
export FEDSKEW_SLURM_CPUS=$cpus
export FEDSKEW_SLURM_MEMORY_MB=$memory
EOF
  echo "$db_port" >"$dir/etc/db.port"
}

# ---------------------------------------------------------------------------------------------
# start

start_munge() {
  # A key of our own: munge authenticates the cluster's daemons and clients to each other.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  launch munged munged --foreground --force --socket="$dir/munge/munge.socket" \
    --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
    --seed-file="$dir/munge/munged.seed" --log-file="$logs/munged.log"
  wait_for 60 0.5 "munged" timeout 10 munge --socket="$dir/munge/munge.socket" -n
}

start_mariadb() {
  local port
  port=$(cat "$dir/etc/db.port")
  timeout 300 mariadb-install-db --no-defaults --datadir="$dir/mysql" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$logs/mariadb-install.out" 2>&1 ||
    { tail -n 20 "$logs/mariadb-install.out" >&2; die "mariadb-install-db failed"; }
  # Settings SLURM's accounting guide asks for (lock waits, log size); a small buffer pool.
  launch mariadbd mariadbd --no-defaults --datadir="$dir/mysql" --socket="$run/mysqld.sock" \
    --port="$port" --bind-address=127.0.0.1 --pid-file="$run/mysqld.daemon.pid" --user=root \
    --log-error="$logs/mariadb.log" --skip-log-bin --innodb-buffer-pool-size=64M \
    --innodb-log-file-size=64M --innodb-lock-wait-timeout=900
  wait_for 120 0.5 "MariaDB" timeout 10 mariadb --no-defaults --socket="$run/mysqld.sock" -uroot -e "SELECT 1"
  mariadb --no-defaults --socket="$run/mysqld.sock" -uroot <<EOF
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost';
EOF
}

start_slurmdbd() {
  launch slurmdbd slurmdbd -D
  # slurmdbd creates its tables on the first start: answers from sacctmgr mean it is done.
  wait_for 120 1 "slurmdbd" timeout 15 sacctmgr -n list cluster
  timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null
  timeout 30 sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description="fedskew tests" \
    Organization=fedskew >/dev/null
  timeout 30 sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
  timeout 30 sacctmgr -n -P list associations user=root format=account | grep -qx "$ACCOUNT" ||
    die "sacctmgr did not record account $ACCOUNT for root"
}

node_idle() { [ "$(timeout 15 sinfo -h -n "$NODE" -o %t 2>/dev/null)" = idle ]; }

start_slurm() {
  launch slurmctld slurmctld -D -i
  wait_for 120 0.5 "slurmctld" timeout 15 scontrol ping
  launch slurmd slurmd -D -N "$NODE"
  if ! wait_for 120 1 "node $NODE to be idle" node_idle; then
    sinfo -N -l >&2 || true
    return 1
  fi
}

start_watchdog() {
  # Runs `stop` once the owner is gone or the time is up; `stop` ends the watchdog itself.
  # shellcheck disable=SC2016  # the watchdog's own shell expands its variables
  setsid bash -c '
    owner=$1 deadline=$((SECONDS + $2)) script=$3 dir=$4
    while (( SECONDS < deadline )) && kill -0 "$owner" 2>/dev/null; do sleep 2; done
    exec "$script" stop --dir "$dir"' watchdog "$owner" "$max_seconds" "$script" "$dir" \
    >>"$logs/watchdog.out" 2>&1 </dev/null &
  echo $! >"$run/watchdog.pid"
}

on_failed_start() {
  local code=$?
  if [ "$code" -ne 0 ]; then
    say "start failed; stopping what started"
    show_logs
    cmd_stop >/dev/null 2>&1 || true
  fi
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "run as root: slurmd starts jobs as their users and munge and MariaDB run here as root"
  # slurmd makes a Unix socket per job step in DIR/spool/<node>/, named <node>_<job>.<step>, and a
  # socket path has at most 107 bytes: a longer DIR lets jobs start but not their steps (srun).
  [ ${#dir} -le 60 ] || die "--dir $dir is ${#dir} characters long; at most 60 keep SLURM's socket paths" \
    "within the 107 bytes a Unix socket allows (try a folder under /tmp)"
  kill -0 "$owner" 2>/dev/null || die "--owner-pid $owner is no running process"
  if alive slurmctld || alive slurmd || alive slurmdbd; then
    die "a cluster is already running in $dir; run '$script stop --dir $dir' first"
  fi
  # DIR is emptied first, but only when it is empty or one of ours (a stamp marks it).
  if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] && [ ! -f "$dir/.fedskew-slurm-cluster" ]; then
    die "$dir is neither empty nor a cluster folder of this script; name another one with --dir"
  fi
  rm -rf "$dir"
  mkdir -p "$dir" "$logs" "$run"
  touch "$dir/.fedskew-slurm-cluster"
  install_packages
  write_config
  link_default_conf
  export SLURM_CONF=$conf
  # From here on a failure (set -e or die) stops what has started and shows the daemons' logs.
  trap on_failed_start EXIT
  start_watchdog
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurm
  trap - EXIT
  say "cluster '$CLUSTER' is up: node $NODE idle, partition $PARTITION, account $ACCOUNT" \
      "(stops when pid $owner ends, or in ${max_seconds}s)"
  cat "$dir/etc/cluster.env"
}

# ---------------------------------------------------------------------------------------------
# stop, status, env

stop_pid() {  # stop_pid NAME: SIGTERM, up to 20 s, then SIGKILL
  local pid i
  [ -f "$run/$1.pid" ] || return 0
  pid=$(cat "$run/$1.pid")
  if [ "$pid" != "$$" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$run/$1.pid"
}

cmd_stop() {
  local i left
  [ -d "$dir" ] || return 0
  export SLURM_CONF=$conf
  if alive slurmctld; then
    # Jobs first, while slurmctld can still tell slurmd to end them cleanly.
    timeout 20 scancel --full --quiet --user=root 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do
      [ -z "$(timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 1
    done
  fi
  for name in slurmd slurmctld slurmdbd mariadbd munged; do stop_pid "$name"; done
  # What is left of this cluster (job steps that outlived slurmd): by pid, from the marker.
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null || true
    sleep 2
    left=$(cluster_pids)
    # shellcheck disable=SC2086
    [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
  fi
  unlink_default_conf
  stop_pid watchdog
  say "cluster in $dir stopped"
}

cmd_status() {
  [ -f "$conf" ] || die "no cluster in $dir"
  export SLURM_CONF=$conf
  if ! alive slurmctld || ! alive slurmd; then say "not running (dir $dir)"; return 1; fi
  timeout 20 sinfo -N -l
  timeout 20 squeue
}

cmd_env() {
  [ -f "$dir/etc/cluster.env" ] || die "no cluster in $dir (start one first)"
  cat "$dir/etc/cluster.env"
}

case $command in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) die "unknown command '$command': start, stop, status or env" ;;
esac
