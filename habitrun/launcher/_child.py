"""The first code a function rank runs: its own session, its lifeline, its env and streams.

Kept small and import-light: it runs in every rank before the user's code.
The user's function and arguments arrive pickled and are unpickled only after
the environment is in place, so their module's import-time code already sees
RANK, WORLD_SIZE and friends.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from typing import Any

from habitrun.launcher.errorfile import format_user_traceback, record, write_error_file
from habitrun.launcher.lifeline import die_with_parent


@dataclass
class FunctionRankSpec:
    """Everything a function rank needs, picklable under spawn."""

    payload: bytes  # pickle of (fn, args)
    env: dict[str, str]
    stdout: Any  # a path (str) to append to, a Connection (pipe end), or None (inherit)
    stderr: Any
    result_path: str
    parent_pid: int | None  # None under forkserver: the fork server is the parent
    close_fds: tuple[int, ...] = ()
    cwd: str | None = None


def _redirect(target: Any, fd: int) -> None:
    if target is None:
        return
    if isinstance(target, str):
        new = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    else:
        new = target.fileno()
    os.dup2(new, fd)
    if isinstance(target, str):
        os.close(new)
    else:
        target.close()


def _reopen_std_streams() -> None:
    """Line-buffered text streams on the new fds 1 and 2 (print order follows the program)."""
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def run_function_rank(spec: FunctionRankSpec) -> None:
    """Target of the rank's multiprocessing.Process."""
    try:
        os.setsid()
    except OSError:
        pass
    die_with_parent(spec.parent_pid)
    for fd in spec.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if spec.cwd:
        os.chdir(spec.cwd)
    os.environ.clear()
    os.environ.update(spec.env)
    _redirect(spec.stdout, 1)
    _redirect(spec.stderr, 2)
    _reopen_std_streams()
    # Before the user's module is imported (unpickling does it): a segfault there, or in the
    # function, leaves its Python stack in the rank's stderr log (record() finds it enabled).
    faulthandler.enable(file=sys.stderr, all_threads=True)
    try:
        fn, args = pickle.loads(spec.payload)
    except Exception as exc:  # noqa: BLE001 - reported through the error file
        write_error_file(exc)
        raise
    try:
        value = record(fn)(*args)
    except Exception as exc:  # noqa: BLE001 - recorded; the traceback goes to stderr without our frames
        sys.stderr.write(format_user_traceback(exc))
        sys.stderr.flush()
        raise SystemExit(1) from None
    try:
        data = pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001
        err = TypeError(f"rank {os.environ.get('RANK')} returned an unpicklable {type(value).__name__}: {exc}")
        write_error_file(err)
        raise err from None
    tmp = spec.result_path + ".tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, spec.result_path)
    sys.stdout.flush()
    sys.stderr.flush()
