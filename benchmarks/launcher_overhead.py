"""Rank-group overhead: how long habitrun's launcher takes to start, finish and stop rank groups.

    python benchmarks/launcher_overhead.py              # 5 repeats
    python benchmarks/launcher_overhead.py --torchrun   # also time torchrun on the same command

Columns (median of the repeats, seconds):
- ``ok``: launch() of ranks that return at once, start to result (processes,
  logs, tee pump, watchdog, reaping);
- ``fail->stopped``: one rank raises, the other sleeps; from the raise to the
  group's result (reaction + SIGTERM + reap), the event-driven path;
- ``per restart``: extra wall time of one restart of a failing group.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from habitrun.launcher import launch  # noqa: E402


def noop() -> int:
    return 0


def fail_fast(stamp_dir: str) -> None:
    if os.environ["RANK"] == "1":
        Path(stamp_dir, f"raised{os.environ['TORCHELASTIC_RESTART_COUNT']}").write_text(repr(time.time()))
        raise RuntimeError("boom")
    time.sleep(60)


def quiet(line: str) -> None:
    pass


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torchrun", action="store_true")
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("spawn", "forkserver", "fork", "command"):
            for nprocs in (1, 2, 4):
                entry = [sys.executable, "-c", "pass"] if kind == "command" else noop
                method = "spawn" if kind == "command" else kind
                ok = [launch(entry, nprocs=nprocs, log_dir=tmp, start_method=method, console=quiet).duration_sec
                      for _ in range(opts.repeats)]
                react, restart = [], []
                if nprocs == 2 and kind != "command":
                    for i in range(opts.repeats):
                        stamps = Path(tmp, f"s{kind}{i}")
                        stamps.mkdir()
                        result = launch(fail_fast, nprocs=2, log_dir=tmp, args=(str(stamps),), start_method=method,
                                        grace=5, console=quiet)
                        done = time.time()
                        react.append(done - float((stamps / "raised0").read_text()))
                        one = result.duration_sec
                        result = launch(fail_fast, nprocs=2, log_dir=tmp, args=(str(stamps),), start_method=method,
                                        grace=5, max_restarts=1, console=quiet)
                        restart.append(result.duration_sec - one)
                rows.append((kind, nprocs, statistics.median(ok),
                             statistics.median(react) if react else None,
                             statistics.median(restart) if restart else None))
        if opts.torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "this"]
            tr = [timed(lambda: subprocess.run(cmd, capture_output=True, check=True)) for _ in range(opts.repeats)]
            rows.append(("torchrun (-m this)", 2, statistics.median(tr), None, None))

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    print(f"{'entrypoint':<20} {'ranks':>5} {'ok':>8} {'fail->stopped':>14} {'per restart':>12}")
    for kind, n, ok, react, restart in rows:
        print(f"{kind:<20} {n:>5} {fmt(ok):>8} {fmt(react):>14} {fmt(restart):>12}")


if __name__ == "__main__":
    main()
