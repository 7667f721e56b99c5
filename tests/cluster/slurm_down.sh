#!/usr/bin/env bash
# Stop what slurm_up.sh started: cancel every job, stop slurmd, slurmctld and (unless
# --keep-munge) munged, by the pids in their pid files. The packages stay installed.
set -uo pipefail

stop() {  # pid file, name
    [ -s "$1" ] || return 0
    local pid
    pid=$(cat "$1")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "slurm_down: $2 (pid $pid) ignored SIGTERM for 10 s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    rm -f "$1"
}

if command -v scancel >/dev/null && [ -s /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
fi
stop /run/slurmd.pid slurmd
stop /run/slurmctld.pid slurmctld
if [ "${1:-}" != "--keep-munge" ]; then
    stop /run/munge/munged.pid munged
fi
exit 0
