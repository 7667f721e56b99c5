"""What one SLURM command costs the runner: sbatch, squeue, scancel, scontrol through engine/slurm/commands.py.

The slurm backend submits one sbatch per array part (not per subject) and asks squeue once per
``slurm.poll_sec`` for all its arrays, so these latencies bound how fast it can submit a stage and how
cheaply it can poll. Each call is timed as the runner makes it (a Python subprocess, output parsed);
printed: the median and spread (min-max) of ``--repeat`` calls. Needs a SLURM (tests/cluster/slurm_up.sh
on the project's machine); its jobs are held (never run), named ``hr-cmds-bench``, and cancelled by name.

    python benchmarks/slurm_commands.py               # 10 calls of each
    python benchmarks/slurm_commands.py --repeat 30
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from habitrun.engine.slurm import commands
from habitrun.spec.policy import SlurmSettings

NAME = "hr-cmds-bench"


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def show(label: str, seconds: list[float]) -> None:
    ms = sorted(s * 1000 for s in seconds)
    print(f"{label:<46} median {statistics.median(ms):7.1f} ms   ({ms[0]:.1f}-{ms[-1]:.1f}, n={len(ms)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    reason = commands.why_unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "task.sh"
        script.write_text("#!/bin/bash\ntrue\n")
        argv = commands.sbatch_argv(SlurmSettings(mem="50M", time="1", extra=("--hold",)), workers=1,
                                    worker_threads=1, job_name=NAME, array="0-3", output="/dev/null",
                                    script=script, script_args=["0"])
        submitted: list[str] = []
        try:
            show("sbatch --array=0-3 (held)", timed(lambda: submitted.append(commands.submit(argv)), args.repeat))
            show(f"squeue -r of {len(submitted)} arrays ({4 * len(submitted)} tasks)",
                 timed(lambda: commands.live_tasks(submitted), args.repeat))
            show("squeue -r of 1 array (4 tasks)", timed(lambda: commands.live_tasks(submitted[:1]), args.repeat))
            show("scontrol show config (MaxArraySize, uncached)",
                 timed(lambda: commands.max_array_size.__wrapped__(), args.repeat))
            show("scancel of 1 array", timed(lambda: commands.cancel([submitted.pop()]), min(args.repeat, len(submitted))))
        finally:
            subprocess.run(["scancel", f"--name={NAME}"], timeout=60, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
