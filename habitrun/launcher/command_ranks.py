"""Command ranks: an argv (``args[rank]`` appended) exec'd directly, never through a shell.

The program is found before any rank starts (on the ranks' PATH, or as a path
from ``cwd``). Each rank starts through the lifeline trampoline, which makes it
die with the launcher before it execs the command. ``PYTHONFAULTHANDLER=1`` is
set unless the caller set it: a Python command that segfaults leaves its stack
in the rank's stderr (the one variable besides torchrun's that a rank gets).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import IO, Any

from habitrun.errors import LaunchError
from habitrun.launcher.group import ProcessContext, RankProcess
from habitrun.launcher.lifeline import TRAMPOLINE


class CommandProcess(RankProcess):
    """A started command rank: its Popen."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        super().__init__(proc.pid)

    def poll(self) -> int | None:
        return self.proc.poll()

    def _exit_fd(self) -> int:
        raise LaunchError("this system has no pidfd_open; command ranks need Linux 5.3+")


class CommandRanks(ProcessContext):
    """A rank group whose ranks run a command."""

    _program: str

    def _prepare(self) -> None:
        self._program = self._resolve_program()

    def _resolve_program(self) -> str:
        argv = list(self.spec.entrypoint)  # type: ignore[arg-type]
        if not argv or not all(isinstance(a, str) for a in argv):
            raise LaunchError(f"a command entrypoint is a non-empty list of strings, got {argv!r}")
        prog = argv[0]
        if os.sep in prog:
            full = prog if os.path.isabs(prog) else os.path.join(self.spec.cwd or os.getcwd(), prog)
            if not os.access(full, os.X_OK):
                raise LaunchError(f"command {prog!r}: {full} is not an executable file")
            return full
        found = shutil.which(prog, path=self.envs[0].get("PATH"))
        if found is None:
            raise LaunchError(f"command {prog!r} not found on the ranks' PATH")
        return prog

    def _spawn(self, rank: int) -> RankProcess:
        argv = [self._program, *list(self.spec.entrypoint)[1:], *map(str, self.args[rank])]  # type: ignore[arg-type]
        opened: list[IO[bytes] | int] = []
        targets: dict[str, Any] = {}
        for stream in ("out", "err"):
            wanted = self._stream_target(rank, stream)
            target: IO[bytes] | int | None = (
                open(wanted, "ab") if isinstance(wanted, str) else wanted  # noqa: SIM115 - closed right after Popen
            )
            if target is not None:
                opened.append(target)
            targets[stream] = target
        env = self.envs[rank]
        if "PYTHONFAULTHANDLER" not in env:  # a Python rank that segfaults leaves its stack in its stderr
            env = {**env, "PYTHONFAULTHANDLER": "1"}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", TRAMPOLINE, str(os.getpid()), *argv],
                env=env,
                cwd=self.spec.cwd,
                stdout=targets["out"],
                stderr=targets["err"],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start rank {rank} of {self.name!r}: {exc}") from exc
        finally:
            for f in opened:
                if isinstance(f, int):
                    os.close(f)
                else:
                    f.close()
        return CommandProcess(proc)
