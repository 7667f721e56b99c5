"""Store test helpers: run a small Python script as a real child process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def child(tmp_path: Path):
    """Start ``code`` in a fresh interpreter (stdout piped, line by line); killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(code: str, *args: str) -> subprocess.Popen:
        script = tmp_path / f"child_{len(procs)}.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def files_snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or the file itself) with its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
