"""`habitrun status --watch`: the live view of a running study, refreshed until the run ends.

On a terminal the view is redrawn in place (rich ``Live``); otherwise (a pipe,
a log file) each refresh is printed as a block under a time stamp. When the
run ends, the final status is printed and its exit code returned; Ctrl-C
stops watching (the run goes on) with 130, the terminal's cursor restored.
Like `status`, it only reads: never the store lock, never a write.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from habitrun.cli.live import render, view_of
from habitrun.cli.status import gather, print_problems, print_run, run_state
from habitrun.cli.text import command, esc
from habitrun.spec.loader import LoadedRecipe
from habitrun.store.runs import RunFolder
from habitrun.study.facade import Study
from habitrun.study.which import About, selecting

EXIT_INTERRUPTED = 130


def frame(loaded: LoadedRecipe, run: RunFolder, outcome: str) -> Group:
    """One refresh: the run and its state now, then its live view."""
    head = Text.from_markup(f"[bold]run {esc(run.run_id)}[/]: {esc(outcome)} "
                            f"(at {datetime.now().astimezone().isoformat(timespec='seconds')})")
    return Group(head, render(view_of(loaded, run)))


def watch(console: Console, loaded: LoadedRecipe, run: RunFolder, target: Path, *, interval: float,
          verify: bool, show_all: bool) -> int:
    """Refresh until the run is no longer running, then print the final status; its exit code (130 on Ctrl-C)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # unwind: Live restores the terminal
    try:
        try:
            if console.is_terminal:
                with Live(console=console, auto_refresh=False, transient=True) as live:
                    while (outcome := run_state(run, loaded)[0]).startswith("running"):
                        live.update(frame(loaded, run, outcome), refresh=True)
                        time.sleep(interval)
            else:
                while (outcome := run_state(run, loaded)[0]).startswith("running"):
                    console.print(frame(loaded, run, outcome))
                    console.print()
                    console.file.flush()
                    time.sleep(interval)
        except KeyboardInterrupt:
            again = command("habitrun", "status", target, "--watch")
            console.print(f"stopped watching; the run goes on (watch it again with `{again}`)", highlight=False)
            return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)
    shown = gather(Study(loaded, About(run, selecting(loaded.overrides), "run")), verify=verify)
    print_run(console, shown, target)
    print_problems(console, shown, target, show_all=show_all)
    return shown.exit_code
