"""Builds small real studies on disk for end-to-end tests, and runs the real CLI on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

OPS_SOURCE = textwrap.dedent('''
    """Test operators: every invocation leaves a marker line (start and end, with time and pid)."""
    import os
    import time


    def _mark(marker_dir, stage, sid, what):
        with open(os.path.join(marker_dir, f"{stage}-{sid}.log"), "a") as f:
            f.write(f"{what} {time.time():.6f} {os.getpid()}\\n")


    def _wait_for_gate(gate, limit=120.0):
        deadline = time.monotonic() + limit
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            time.sleep(0.02)


    def square(subject, marker_dir, sleep=0.0, fail=(), flaky_dir=None, gate=None, gate_from=0):
        _mark(marker_dir, "square", subject.id, "start")
        if gate and int(subject.fields["n"]) >= gate_from:  # held until the test creates the file
            _wait_for_gate(gate)
        if sleep:
            time.sleep(sleep)
        if subject.id in fail:
            raise ValueError(f"subject {subject.id} is broken on purpose")
        n = int(subject.fields["n"])
        _mark(marker_dir, "square", subject.id, "end")
        return {"n": n, "square": n * n}


    def plus_one(subject, marker_dir, sleep=0.0):
        _mark(marker_dir, "plus_one", subject.id, "start")
        if sleep:
            time.sleep(sleep)
        value = subject.input("square")["square"] + 1
        _mark(marker_dir, "plus_one", subject.id, "end")
        return value


    def total(results):
        return {"sum": sum(results.values()), "n": len(results)}
''')


def make_study(folder: Path, *, subjects: int = 12, policy: dict[str, Any] | None = None,
               square_params: dict[str, Any] | None = None, plus_params: dict[str, Any] | None = None) -> Path:
    """A three-stage study (map, map, collect) whose operators record every invocation."""
    folder.mkdir(parents=True, exist_ok=True)
    markers = folder / "markers"
    markers.mkdir(exist_ok=True)
    (folder / "ops.py").write_text(OPS_SOURCE)
    lines = ["subject_id,n"] + [f"S{i:03d},{i}" for i in range(subjects)]
    (folder / "subjects.csv").write_text("\n".join(lines) + "\n")
    pol = {"backend": "process", "workers": 2, "subject_timeout_sec": 60, "graceful_shutdown_sec": 3}
    pol.update(policy or {})
    recipe = {
        "habitrun": 1,
        "name": "engine-test",
        "subjects": {"manifest": "subjects.csv"},
        "policy": pol,
        "stages": [
            {"name": "square", "operator": "ops:square",
             "params": {"marker_dir": str(markers), **(square_params or {})}},
            {"name": "plus_one", "operator": "ops:plus_one", "needs": ["square"],
             "params": {"marker_dir": str(markers), **(plus_params or {})}},
            {"name": "total", "kind": "collect", "operator": "ops:total", "needs": ["plus_one"]},
        ],
    }
    path = folder / "recipe.yaml"
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
    return path


def habitrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "habitrun.cli.app", *args]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(habitrun_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def markers(folder: Path) -> dict[str, list[tuple[str, float, int]]]:
    """(stage-subject) -> [(start|end, time, pid)] in order."""
    out: dict[str, list[tuple[str, float, int]]] = {}
    for file in sorted((folder / "markers").glob("*.log")):
        entries = []
        for line in file.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                entries.append((parts[0], float(parts[1]), int(parts[2])))
        out[file.stem] = entries
    return out


def events(folder: Path) -> list[dict[str, Any]]:
    """Every event of every run of the study, oldest run first."""
    found: list[dict[str, Any]] = []
    for run in sorted((folder / ".habitrun" / "runs").glob("*")):
        log = run / "events.jsonl"
        if log.exists():
            for line in log.read_text().splitlines():
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a torn last line after SIGKILL
    return found
