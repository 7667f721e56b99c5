"""The console script's exit: its codes and messages, and output flushed (the interpreter's normal exit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_console_script_keeps_its_exit_codes_and_messages(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "validate", str(missing)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "no such recipe file" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "habitrun 0.1.0\n")
