"""An operator that says when its process was forked and when its subject ran (seconds since boot)."""

import os
import time


def _since_boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _forked_at() -> float:
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    return start_ticks / os.sysconf("SC_CLK_TCK")


def timed(subject):
    started = _since_boot()
    time.sleep(float(subject.fields.get("sec", 0)))
    return {"pid": os.getpid(), "forked": _forked_at(), "started": started, "ended": _since_boot(),
            "device": os.environ.get("CUDA_VISIBLE_DEVICES")}
