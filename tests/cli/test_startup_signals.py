"""Stop signals at any moment of `habitrun run`'s start-up: 130/143/129, one line on stderr, no traceback.

A grid of delays (0 to 2 s after the process is started) times SIGINT, SIGTERM
and SIGHUP, each sent to the process group of a real `habitrun run` of a small
study whose run lasts longer than the grid. Early delays land in the imports,
the recipe's validation and the plan; late ones in the run, where the runner's
own handlers let the running subjects finish. Each time: the exit status,
exactly one line on stderr, the resume command once a run folder exists, and no
process left behind (the early fork server and the operator check run in
sessions of their own, which a group signal does not reach).

SIGTERM's and SIGHUP's grids are marked ``slow`` (the whole suite runs them; .ci/matrix does not):
on the other Pythons SIGINT's grid (the signal the interpreter itself treats apart) and the console
script's SIGTERM below show the handlers come in at the start.

Before habitrun's first instruction only the interpreter's own start runs (about
20-50 ms here, ``site`` included; up to 0.25 s on a loaded machine), where no program has a say and the kernel's
default action applies (for SIGINT inside ``site``, Python's own fatal error); a trial whose signal left before habitrun's handlers
were in (read in ``/proc/<pid>/status`` just before sending) must end by that
default action, and from 0.4 s on every trial must find them in (the runner's own come
0.5-1.6 s after the start).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.engine.study import habitrun_cmd, make_study

DELAYS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 2.0)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXPECTED = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def _handled(pid: int) -> bool:
    """SIGTERM and SIGHUP are caught: habitrun's first instruction has run (Python itself catches only SIGINT)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGHUP - 1))
    return caught & wanted == wanted


def _one_trial(study: Path, delay: float, sig: signal.Signals) -> str:
    """Signal a fresh `habitrun run` ``delay`` s after it started; a failure's description, or ''."""
    proc = subprocess.Popen(habitrun_cmd("run", "recipe.yaml"), cwd=study, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(delay)
        try:
            children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            children = []
        handled = _handled(proc.pid)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    lines = [line for line in text.splitlines() if line.strip()]
    runs = study / ".habitrun" / "runs"
    folder = runs.exists() and any(runs.iterdir())
    where = f"{sig.name} at {delay} s: exit {proc.returncode}, stderr {text!r}, stdout tail {out.decode()[-300:]!r}"
    left = wait_gone(children, timeout=10)
    if not handled:
        if delay >= 0.4:
            return f"{where}: habitrun's handlers were not in yet"
        # the interpreter's start: the default action (SIGINT inside `site` is Python's own
        # "Fatal Python error: init_import_site", status 1), or the handlers came in meanwhile
        if proc.returncode in (-sig, EXPECTED[sig]) or (sig == signal.SIGINT and proc.returncode == 1):
            return ""
        return where
    if proc.returncode != EXPECTED[sig]:
        return where
    if "Traceback" in text or len(lines) != 1:
        return where
    if folder and "habitrun resume recipe.yaml" not in lines[0]:
        return f"{where} (a run folder exists: the line must say how to continue)"
    if not folder and "nothing was run" not in lines[0]:
        return f"{where} (no run folder: the line must say nothing was run)"
    if left:
        return f"{where}: left behind {left}"
    return ""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [pytest.param(s, marks=() if s == signal.SIGINT else pytest.mark.slow) for s in SIGNALS],
                         ids=lambda s: s.name)
def test_stop_signal_at_any_moment_of_start_up(tmp_path: Path, sig: signal.Signals) -> None:
    """Every delay of the grid: the right status, one line (with the resume command once a run folder exists)."""
    failures = []
    for i, delay in enumerate(DELAYS):
        # 6 subjects of 1 s on 2 workers: the run lasts past the grid's last delay
        study = make_study(tmp_path / f"s{i}", subjects=6, square_params={"sleep": 1.0}).parent
        failure = _one_trial(study, delay, sig)
        if failure:
            failures.append(failure)
    assert not failures, "\n".join(failures)


def test_the_console_script_starts_with_the_handlers(tmp_path: Path) -> None:
    """`habitrun` (pyproject's script) is cli/entry.py's main: a SIGTERM in its imports ends it with 143 and a line."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '\nhabitrun = "habitrun.cli.entry:main"\n' in pyproject  # [project.scripts] (tomllib: 3.11+)
    study = make_study(tmp_path / "s", subjects=2).parent
    proc = subprocess.Popen([sys.executable, "-c", "from habitrun.cli.entry import main; main()", "run", "recipe.yaml"],
                            cwd=study, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _handled(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        os.killpg(proc.pid, signal.SIGTERM)  # at once: in the CLI's imports, long before the runner's handlers
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143
    assert err.decode() == "interrupted by SIGTERM while starting: nothing was run\n"
