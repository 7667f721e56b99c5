"""The memory watchdog's samples of one worker: by /proc on Linux, by psutil where /proc cannot say."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from habitrun.engine.process import memory
from habitrun.engine.process.memory import Watched

HOLD = "import sys; block = bytearray(40 * 1024 * 1024); sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """A real process holding 40 MB until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("by", ["proc", "psutil"])
def test_a_live_worker_is_sampled_and_a_gone_one_is_not(holder: subprocess.Popen[str], by: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if by == "psutil":  # as on a kernel without /proc/PID/task/TID/children
        monkeypatch.setattr(memory, "_proc_children", lambda pid: None)
    watched = Watched(holder.pid)
    rss = watched.sample()
    assert rss is not None and rss >= 40
    holder.kill()
    holder.wait(timeout=30)
    assert watched.sample() is None


@pytest.mark.timeout(60)
def test_a_worker_gone_before_it_is_watched_is_never_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert Watched(proc.pid).sample() is None


SHORT_RUN = """
import sys
from habitrun.engine.process.memory import MemoryWatchdog
watchdog = MemoryWatchdog(None, kill_group=lambda pid: None)
watched = watchdog.watch(int(sys.argv[1]))
assert watched.sample() > 0
watchdog.close()
print("psutil" in sys.modules)
"""


@pytest.mark.timeout(60)
def test_a_run_shorter_than_one_interval_never_imports_psutil(holder: subprocess.Popen[str]) -> None:
    done = subprocess.run([sys.executable, "-c", SHORT_RUN, str(holder.pid)], capture_output=True, text=True,
                          timeout=30, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
