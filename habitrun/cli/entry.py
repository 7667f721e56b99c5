"""The `habitrun` process's first instructions: stop signals are handled before anything is imported.

A run installs its own SIGINT/SIGTERM/SIGHUP handlers (engine/signals.py) only
once it has loaded the recipe and planned, which takes 0.1-1.6 s of imports
(pydantic, the engine) and reading. A stop signal in that time used to print a
``KeyboardInterrupt`` traceback (or a pydantic ``SchemaError`` wrapping it), or
end the process by the signal's default action, with no word and a -15 status.
:func:`install` (the console script's first call, and ``python -m
habitrun.cli.app``'s first statement) puts in a handler that ends the command at
once with 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP) and one line on stderr.
It raises nothing into the code it interrupts (an exception raised inside an
import or a pydantic validator is what became a traceback) and exits with
``os._exit``: what start-up writes (the store, its lock, an empty run root) is
made to survive a SIGKILL at any instruction, and ending here is no worse. The
early fork server and the operator check end by their own lifelines (a pipe
that closes with this process). The runner's handlers replace this one when the
run starts and put it back when it ends (no gap between them); once a run
folder exists the line names the command that continues it.

Only the standard library is imported here: this runs before everything else.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_state: dict[str, object] = {"command": None, "run": None, "resume": None, "ended": False}
_fallback: list[Callable[[str], None]] = []  # where the line goes when stderr is closed


def exit_status(signum: int) -> int:
    """130 for SIGINT (the design's 'interrupted'), 128+N for the others (SIGTERM 143, SIGHUP 129)."""
    return 130 if signum == signal.SIGINT else 128 + int(signum)


def install() -> None:
    """Handle SIGINT, SIGTERM and SIGHUP from now on by ending the command at once (main thread only)."""
    word = sys.argv[1] if len(sys.argv) > 1 else ""
    note_command(word if word.isalpha() else None)
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started under nohup (SIGHUP ignored) or in a script's background: the caller chose
        signal.signal(sig, _on_stop_signal)


def ignore_stop_signals() -> None:
    """The outcome is printed and only the exit is left: a stop signal has nothing to stop now."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def note_command(name: str | None) -> None:
    """The command being run (`run` and `resume` start runs; the others are only interrupted)."""
    _state["command"] = name


def note_run(folder: str, resume: str) -> None:
    """A run folder exists from now on; ``resume`` is the command that continues it."""
    _state.update(run=folder, resume=resume, ended=False)


def note_ended() -> None:
    """The run has recorded its outcome: a signal now only cuts the summary short."""
    _state["ended"] = True


def on_closed_stderr(write: Callable[[str], None]) -> None:
    """Where the stop line goes when stderr is closed (the run folder's console.log)."""
    _fallback[:] = [write]


def stop_line(signum: int) -> str:
    """The one line a stop signal leaves: what was done, and how to go on."""
    name = _name(signum)
    command = _state["command"]
    if command not in (None, "run", "resume"):
        return f"habitrun {command}: interrupted by {name}"
    if _state["run"] is None:
        return f"interrupted by {name} while starting: nothing was run"
    if _state["ended"]:
        return f"interrupted by {name} after the run ended; its outcome is recorded in {_state['run']}"
    return (f"interrupted by {name}: what finished is stored in {_state['run']}; "
            f"continue with: {_state['resume']}")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _on_stop_signal(signum: int, frame: object) -> None:
    """Say what was done and end the process now, without unwinding the code it interrupted."""
    for stream in (sys.stdout, sys.stderr):  # what was printed before goes out first, if it can
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a reentrant flush or a closed pipe: nothing more to do
            pass
    line = stop_line(signum) + "\n"
    try:
        os.write(2, line.encode("utf-8", "backslashreplace"))
    except OSError:
        for write in _fallback:
            try:
                write(line)
            except Exception:  # noqa: BLE001 - the line is lost, the exit status still says it
                pass
    os._exit(exit_status(signum))


def main() -> None:
    """The console script: the handlers first, then the CLI (whose imports they now cover)."""
    install()
    from habitrun.cli.app import main as app_main

    app_main()
