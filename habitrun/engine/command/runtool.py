"""Running one command-line tool for a subject: its output in the subject's log, its failure in words.

Both a command stage and a Python operator call :func:`run_tool`. The tool is a
plain child of the process running the subject, in that process's group and
waited for, so everything habitrun does for a subject holds for it without a
line of its own here: a timeout or Ctrl-C ends the worker's group and every
process below it (``engine/process/reaper.py``), its CPU, peak memory and I/O
are charged to the subject (``engine/usage.py`` reads them from
``RUSAGE_CHILDREN`` and ``/proc/self/io`` once it is waited for), and a tool
that prints 100 MB is cut to head and tail like any subject's output.

Its stdout goes where the subject's output goes: in a worker, fd 1 is the
subject's capture file, so the tool writes there directly, at no cost;
where Python's ``sys.stdout`` is not fd 1 (the serial backend) it is copied
there. Its stderr passes through this process so that its last lines can be
quoted in the failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from habitrun.engine.usage import note_tool_peak
from habitrun.errors import ToolError

TAIL_BYTES = 4096  # of the tool's stderr kept for its failure message
TAIL_LINES = 3  # lines of it quoted in the failure line
_CHUNK = 1 << 16
_MAXRSS_KB = 1 / 1024 if sys.platform == "darwin" else 1  # ru_maxrss: kB on Linux, bytes on macOS


@dataclass(frozen=True)
class ToolResult:
    """How a tool ended: its argv, exit code (negative: killed by that signal), stderr's end, wall time."""

    argv: tuple[str, ...]
    returncode: int
    stderr_tail: str
    duration_sec: float

    def describe(self) -> str:
        """``exited with code 3`` or ``was killed by SIGKILL``."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"was killed by {name}"
        return f"exited with code {self.returncode}"


def _fd_of(stream: Any) -> int | None:
    try:
        return stream.fileno() if stream is not None and not stream.closed else None
    except (OSError, ValueError, AttributeError):
        return None


class _Copy(threading.Thread):
    """Copies one of the tool's pipes to a stream (or fd) and keeps the end of what passed."""

    def __init__(self, pipe: IO[bytes], fd: int | None, stream: Any) -> None:
        super().__init__(daemon=True, name="habitrun-tool-output")
        self.pipe, self.fd, self.stream = pipe, fd, stream
        self.tail = b""

    def run(self) -> None:
        read = os.read
        src = self.pipe.fileno()
        while chunk := read(src, _CHUNK):
            self.tail = (self.tail + chunk)[-TAIL_BYTES:]
            try:
                if self.fd is not None:
                    _write_all(self.fd, chunk)
                elif self.stream is not None:
                    self.stream.write(chunk.decode("utf-8", "replace"))
            except (OSError, ValueError):
                self.fd = self.stream = None  # a closed console: keep reading, the tool must not block


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def resolve_tool(name: str, path: str | None = None) -> str:
    """The executable ``name`` names (a path, or found on PATH); ToolError naming the PATH searched."""
    found = shutil.which(name, path=path)
    if found is None:
        searched = path if path is not None else os.environ.get("PATH", os.defpath)
        raise ToolError(f"tool {name!r} not found (PATH searched: {searched})")
    return found


def run_tool(argv: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None, check: bool = True) -> ToolResult:
    """Run ``argv`` (never through a shell) to its end for the subject being run.

    ``env`` is added to this process's environment. With ``check`` a non-zero exit or a
    signal raises :class:`~habitrun.errors.ToolError` whose one line names the tool, how it
    ended and the last lines of its stderr; otherwise the :class:`ToolResult` says it.
    """
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise ToolError("run_tool: an empty argv")
    full_env = {**os.environ, **env} if env else None
    out_fd = _fd_of(sys.stdout)
    err_fd = _fd_of(sys.stderr)
    for stream in (sys.stdout, sys.stderr):  # what the subject printed comes before the tool's output
        if stream is not None:
            stream.flush()
    stdout_to: Any = None if out_fd == 1 else subprocess.PIPE  # fd 1 is the subject's capture: inherit
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                stdout=stdout_to, stderr=subprocess.PIPE)
    except FileNotFoundError as exc:
        where = (full_env or os.environ).get("PATH", os.defpath)
        raise ToolError(f"tool {argv[0]!r} not found (PATH searched: {where})") from exc
    except PermissionError as exc:
        raise ToolError(f"tool {argv[0]!r} cannot be run: {exc.strerror}") from exc
    copies = [_Copy(proc.stderr, 2 if err_fd == 2 else None, sys.stderr)]  # type: ignore[arg-type]
    if proc.stdout is not None:
        copies.append(_Copy(proc.stdout, None, sys.stdout))
    for copy in copies:
        copy.start()
    try:
        code = _wait(proc)
    except BaseException:  # Ctrl-C in the serial backend: the tool ends with the subject
        proc.kill()
        proc.wait()
        raise
    finally:
        for copy in copies:
            copy.join()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    tail = copies[0].tail.decode("utf-8", "replace")
    result = ToolResult(argv=tuple(argv), returncode=code, stderr_tail=tail,
                        duration_sec=time.perf_counter() - start)
    if check and code != 0:
        raise ToolError(failure_line(result))
    return result


def _wait(proc: subprocess.Popen[bytes]) -> int:
    """Wait for the tool with ``wait4``, which gives its own peak memory for the subject's usage."""
    while True:
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere: its exit code is Popen's to tell
            return proc.wait()
    proc.returncode = os.waitstatus_to_exitcode(status)
    note_tool_peak(int(rusage.ru_maxrss * _MAXRSS_KB))
    return proc.returncode


def failure_line(result: ToolResult) -> str:
    """One line: the tool, how it ended, and the last lines of its stderr."""
    lines = [line.strip() for line in result.stderr_tail.splitlines() if line.strip()][-TAIL_LINES:]
    said = f"; stderr ends: {' | '.join(lines)}" if lines else "; nothing on stderr"
    return f"{os.path.basename(result.argv[0])} {result.describe()}{said}"
