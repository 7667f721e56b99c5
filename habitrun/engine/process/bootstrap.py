"""The first code of a process habitrun starts with a fresh interpreter: a spawned worker, or a fork server.

Both are started as ``python -c <a fixed line> ARGS`` with the interpreter
multiprocessing would use (``multiprocessing.set_executable`` is honoured) and
the runner's interpreter flags, read from ``sys.flags`` (public, unlike the
helpers multiprocessing and subprocess keep for it). A spawned worker reads
its request, a pickled ``(target, args)``, from a pipe, and calls
``target(fds, *args)`` with the descriptors it was given: the same call a fork
server's child makes (:func:`run_request`).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# The lines ``python -c`` runs: fixed text, the arguments follow on the command line.
SPAWNED = "from habitrun.engine.process.bootstrap import spawned; spawned()"


def executable() -> str:
    """The interpreter a new worker runs: multiprocessing's choice (``set_executable``), else ours.

    Only looked up if multiprocessing's spawn module is loaded: nobody can have set it otherwise,
    and importing it would cost the CLI's early fork server start a few milliseconds.
    """
    spawn = sys.modules.get("multiprocessing.spawn")
    chosen = spawn.get_executable() if spawn is not None else None
    return os.fsdecode(chosen or sys.executable)  # bytes on POSIX in some versions


def interpreter_flags() -> list[str]:
    """The command-line options of this interpreter that a child must share to behave the same."""
    flags = sys.flags
    args = []
    for letter, value in (("O", flags.optimize), ("B", flags.dont_write_bytecode), ("s", flags.no_user_site),
                          ("S", flags.no_site), ("E", flags.ignore_environment), ("b", flags.bytes_warning)):
        if value and not flags.isolated:
            args.append("-" + letter * int(value))
    if flags.isolated:
        args.append("-I")
    if flags.dev_mode:
        args += ["-X", "dev"]
    if flags.utf8_mode and not flags.dev_mode:
        args += ["-X", "utf8"]
    args += [f"-W{opt}" for opt in sys.warnoptions]
    return args


def command(line: str, *args: str) -> list[str]:
    """``python [flags] -c line args...`` for a fresh interpreter."""
    return [executable(), *interpreter_flags(), "-c", line, *args]


def add_search_path(paths: Sequence[str]) -> None:
    """Put the runner's import path in front, so habitrun and the study's modules import as they did there."""
    sys.path[:0] = [p for p in paths if p not in sys.path]


def run_request(target: Callable[..., Any], fds: list[int], args: tuple[Any, ...]) -> NoReturn:
    """Call ``target(fds, *args)`` and leave the process with its outcome, as a multiprocessing child does.

    No interpreter teardown, no ``atexit`` handler (the runner's, inherited by a
    fork, are not this process's to run): an exception prints its traceback and
    exits 1, ``SystemExit`` exits with its code.
    """
    code = 0
    try:
        target(fds, *args)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int) and done.code is not None:
            sys.stderr.write(f"{done.code}\n")
    except BaseException:  # noqa: BLE001 - reported as a multiprocessing child reports it
        traceback.print_exc()
        code = 1
    finally:
        flush_std()
    os._exit(code)


def flush_std() -> None:
    """Flush stdout and stderr before an ``os._exit`` (which skips the interpreter's own flush)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def spawned() -> NoReturn:
    """Entry of a spawned worker: ``argv`` = request fd, life fd, the runner's sys.path (JSON), the fds to hand on.

    The life fd is the write end of a pipe the runner watches where it has no pidfd: held
    open, and by this process alone (what it starts does not inherit it), until it exits.
    """
    request_fd, life_fd, search_path, *fds = sys.argv[1:]
    del sys.argv[1:]  # the subjects see ``sys.argv == ["-c"]``, as in a fork server's worker
    os.set_inheritable(int(life_fd), False)
    add_search_path(json.loads(search_path))
    with open(int(request_fd), "rb") as request:
        target, args = pickle.load(request)
    run_request(target, [int(fd) for fd in fds], args)
