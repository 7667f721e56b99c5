#!/usr/bin/env bash
# A real one-node SLURM on this host, for the tests marked `slurm` (and for trying things by hand).
#
# Installs Debian's slurm-wlm and munge if missing, writes a minimal slurm.conf for this host
# (one node with its cores and memory, one partition `debug`), starts munged, slurmctld and
# slurmd as root, and waits until `sinfo` shows the node idle. Idempotent: what is installed or
# running already is left as it is. Needs root and apt; exits non-zero with a message otherwise.
# Undo with slurm_down.sh. apt runs under `flock /tmp/apt.lock` so parallel installs queue up.
set -euo pipefail

say() { echo "slurm_up: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts daemons as root)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sinfo >/dev/null; then
    command -v apt-get >/dev/null || die "slurm-wlm/munge are not installed and there is no apt-get"
    say "installing slurm-wlm and munge (apt)"
    export DEBIAN_FRONTEND=noninteractive
    flock /tmp/apt.lock apt-get update -q >/dev/null
    flock /tmp/apt.lock apt-get install -y -q slurm-wlm munge >/dev/null
fi

# --- munge: a key, the daemon as the munge user
install -d -o munge -g munge -m 700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "starting munged"
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged does not answer (munge -n | unmunge)"
fi

# --- slurm.conf for this host
host=$(hostname -s)
cpus=$(nproc --all)  # all online CPUs: nproc alone follows the caller's CPU affinity
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
max_array=${HABITRUN_SLURM_MAX_ARRAY_SIZE:-4}
def_mem=$((mem_mb / cpus / 2))
conf_dir=/etc/slurm
install -d "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
conf=$(cat <<CONF
# written by habitrun's tests/cluster/slurm_up.sh: one node, one partition
ClusterName=habitrun-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
Waittime=0
# Small on purpose: the slurm backend's tests see an array larger than this split into several
# (sites have 1001 and more). DefMemPerCPU: a job that passes no --mem takes this much per CPU,
# not the whole node, so array tasks run side by side.
MaxArraySize=$max_array
DefMemPerCPU=$def_mem
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
if [ "$(cat "$conf_dir/slurm.conf" 2>/dev/null)" != "$conf" ]; then
    printf '%s\n' "$conf" > "$conf_dir/slurm.conf"
    changed=1
else
    changed=0
fi

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ "$changed" = 1 ] && alive /run/slurmctld.pid; then
    say "slurm.conf changed: restarting the daemons"
    "$(dirname "$0")/slurm_down.sh" --keep-munge
fi
if ! alive /run/slurmctld.pid; then
    say "starting slurmctld"
    slurmctld || die "slurmctld did not start; see /var/log/slurm/slurmctld.log"
fi
if ! alive /run/slurmd.pid; then
    say "starting slurmd"
    slurmd || die "slurmd did not start; see /var/log/slurm/slurmd.log"
fi

# --- wait for the node
for _ in $(seq 300); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n1 || true)
    case "$state" in
        idle|mixed|allocated) say "node $host is $state"; exit 0 ;;
        down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.1
done
die "node $host did not become idle within 30 s (state: ${state:-unknown}); see /var/log/slurm/"
