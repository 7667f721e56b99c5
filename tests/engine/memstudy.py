"""A skewed study under a real memory limit: a cgroup v1 memory cgroup, made and removed here.

Each subject's input file says how much memory it takes: 1 KB of input, 1 MB
of memory, touched (``b"x" * n`` writes every page), held while it sleeps.
The cgroup holds only the ``habitrun`` process we start (its pid is written
from the child itself, before it runs anything) and, through it, its workers.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
OPS = '''
import os
import time


def hog(subject, sleep=0.2, scale=1.0):
    size = os.path.getsize(subject.fields["image"])
    block = b"x" * (int(size // 1024 * scale) << 20)  # 1 KB of input: 1 MB of memory (x scale), every page written
    time.sleep(float(subject.fields.get("hold") or sleep))
    return {"mb": len(block) >> 20}
'''
_names = itertools.count()


def make_skewed_study(folder: Path, *, small: int = 12, big: int = 3, small_mb: int = 50, big_mb: int = 600,
                      sleep: float = 0.1, policy: dict[str, Any] | None = None, hint: int | None = None,
                      big_from: int = 0, half_stage: bool = False, big_hold: float | None = None) -> Path:
    """The study's recipe: ``big`` subjects of ``big_mb`` from row ``big_from`` of the manifest, the other
    ``small`` of ``small_mb``.

    ``hint``: a manifest column ``hint`` holding this number for every subject (a hint that lies about the big ones).
    ``half_stage``: a second stage, ``half``, taking half the memory of the first.
    ``big_hold``: how long the big ones hold their memory (default: ``sleep``, as the small ones).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ops.py").write_text(OPS)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    rows = ["subject_id,image,hold" + (",hint" if hint is not None else "")]
    for i in range(big + small):
        is_big = big_from <= i < big_from + big
        mb = big_mb if is_big else small_mb
        hold = big_hold if is_big and big_hold is not None else ""
        path = data / f"s{i:02d}.img"
        path.write_bytes(b"\0" * (mb * 1024))
        rows.append(f"s{i:02d},data/{path.name},{hold}" + (f",{hint}" if hint is not None else ""))
    (folder / "subjects.csv").write_text("\n".join(rows) + "\n")
    recipe = {"habitrun": 1, "name": "skewed-memory",
              "subjects": {"manifest": "subjects.csv", "files": ["image"]},
              "policy": {"backend": "process", "workers": 4, "subject_timeout_sec": 120, **(policy or {})},
              "stages": [{"name": "hog", "operator": "ops:hog", "params": {"sleep": sleep}}]}
    if half_stage:
        recipe["stages"].append({"name": "half", "operator": "ops:hog", "needs": ["hog"],
                                 "params": {"sleep": sleep, "scale": 0.5}})
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def cgroup_v1_available() -> str | None:
    """Why a memory cgroup cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "not root"
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        return f"no cgroup v1 memory controller at {CGROUP_ROOT}"
    return None


class MemoryCgroup:
    """A cgroup v1 memory cgroup of ``limit_mb``, for the processes :meth:`run` starts; removed on exit."""

    def __init__(self, limit_mb: int) -> None:
        self.path = CGROUP_ROOT / f"habitrun-test-{os.getpid()}-{next(_names)}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_mb << 20))

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise AssertionError(f"no oom_kill counter in {self.path}/memory.oom_control (kernel too old?)")

    def peak_mb(self) -> float:
        return int((self.path / "memory.max_usage_in_bytes").read_text()) / (1 << 20)

    def reset_peak(self) -> None:
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def run(self, args: list[str], cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """``python -m habitrun.cli.app ARGS`` inside this cgroup (the child moves itself in before it execs)."""
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=enter)

    def remove(self) -> None:
        """rmdir once its processes are gone (they end with the run; a few seconds at most)."""
        deadline = time.monotonic() + 10.0
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
