"""Check every stage's operator in a child process before anything runs.

Why a child: importing a study's modules runs their code. In the runner that
code would stay imported (and could exit, hang or start threads) in the
process that holds the store. One child imports every operator and entrypoint
of the recipe, checks each map/collect operator's params against its
signature, and answers; the parent meanwhile goes on loading the manifest.
The child is bounded by each stage's ``subject_spawn_timeout_sec`` per import
(the budget a worker has to import it), and any way it ends early — an
exception, ``sys.exit``, ``os._exit``, a signal, a hang — is reported as that
operator's error (a :class:`RecipeError`, exit 2).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from habitrun.errors import RecipeError

ATTRS = ("operator", "entrypoint")
STDERR_TAIL = 400  # characters of the child's stderr quoted when it ends early


class _Loaded(Protocol):
    """What the check needs of a LoadedRecipe (kept structural: no import of the loader)."""

    @property
    def recipe(self) -> Any: ...

    @property
    def search_path(self) -> tuple[str, ...]: ...

    def locate(self, path: tuple[Any, ...], *, key: bool = False) -> str: ...

    def stage_policy(self, name: str) -> Any: ...


@dataclass(frozen=True)
class _Target:
    index: int  # the stage's position in the recipe
    attr: str  # operator | entrypoint
    stage: str
    path: str
    params: dict[str, Any] | None  # None: not checked (an entrypoint takes none)
    timeout: float | None


def _targets(loaded: _Loaded) -> list[_Target]:
    out = []
    for i, stage in enumerate(loaded.recipe.stages):
        for attr in ATTRS:
            path = getattr(stage, attr)
            if path is None:
                continue
            # a command stage's operator is habitrun's own: its params are placeholders' values
            params = dict(stage.params) if attr == "operator" and not stage.runs_command else None
            out.append(_Target(i, attr, stage.name, path, params,
                               loaded.stage_policy(stage.name).subject_spawn_timeout_sec))
    return out


_early: tuple[subprocess.Popen[bytes], Any] | None = None


def _spawn(warm_recipe: Path | None) -> tuple[subprocess.Popen[bytes], Any]:
    stderr = tempfile.TemporaryFile()
    argv = [sys.executable, "-m", "habitrun.spec._opcheck_child"]
    if warm_recipe is not None:
        argv += ["--warm", str(warm_recipe), "--sys-path", json.dumps([p for p in sys.path if p])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            env={**os.environ, "HABITRUN_OPCHECK_PARENT": str(os.getpid())},
                            start_new_session=True)  # its own group: a hung import's children are stopped with it
    return proc, stderr


def start_early(recipe: Path) -> None:
    """Start the check's child now, before the command has loaded the recipe (``run``/``resume``).

    Meanwhile the child imports, speculatively, the modules the recipe file names
    as operators (found by a plain text scan), so that by the time the real request
    comes most of the import work is done: the check then costs the run almost no
    wall time. Nothing is decided by the scan: the request checks everything again.
    """
    global _early
    discard_early()
    try:
        _early = _spawn(recipe)
    except OSError:
        _early = None


def _take_early() -> tuple[subprocess.Popen[bytes], Any] | None:
    global _early
    early, _early = _early, None
    if early is not None and early[0].poll() is not None:  # it died already: start a fresh one
        early[0].wait()
        early[1].close()
        return None
    return early


def discard_early() -> None:
    """Stop an early child nobody used (the command failed before its check, or did not need one)."""
    global _early
    early, _early = _early, None
    if early is None:
        return
    proc, stderr = early
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the pid is still its own
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    stderr.close()


class OperatorCheck:
    """A running check: :meth:`start` it, do other work, then :meth:`problems` or :meth:`raise_problems`."""

    def __init__(self, loaded: _Loaded) -> None:
        self.loaded = loaded
        self.targets = _targets(loaded)
        self.proc: subprocess.Popen[bytes] | None = None
        self._result: list[str] | None = None
        if not self.targets:
            self._result = []
            return
        early = _take_early()
        if early is not None:
            self.proc, self._stderr = early
        else:
            self.proc, self._stderr = _spawn(None)
        request = {
            "sys_path": [p for p in sys.path if p],
            "search_path": list(loaded.search_path),
            "checks": [{"target": t.path, "stage": t.stage, "params": t.params} for t in self.targets],
        }
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request, default=str).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it ended already; problems() reports how

    @classmethod
    def start(cls, loaded: _Loaded) -> OperatorCheck:
        return cls(loaded)

    def _target_of(self, module: str) -> _Target | None:
        for target in self.targets:
            name = target.path.partition(":")[0] if ":" in target.path else target.path.rpartition(".")[0]
            if name == module:
                return target
        return None

    def _where(self, target: _Target, at: list[Any] | None, key: bool) -> str:
        path = ("stages", target.index, *(at if at else (target.attr,)))
        return self.loaded.locate(tuple(path), key=key)

    def problems(self) -> list[str]:
        """Wait for the child; one located problem per failure (empty: every operator is usable)."""
        if self._result is None:
            try:
                self._result = self._collect()
            finally:
                self.close()
        return self._result

    def raise_problems(self) -> None:
        problems = self.problems()
        if problems:
            raise RecipeError(problems)

    def _collect(self) -> list[str]:
        assert self.proc is not None and self.proc.stdout is not None
        out: list[str] = []
        # Until the child says which import it is in, its start-up is charged to the first
        # target (a worker's spawn budget covers starting it too), so nothing waits unbounded.
        first = self.targets[0]
        current: _Target | None = first
        deadline = None if first.timeout is None else time.monotonic() + first.timeout
        buffer = b""
        ended = False
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not ended:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not sel.select(wait):
                    assert current is not None
                    self._reap()
                    out.append(f"{self._where(current, None, False)}: stage {current.stage!r}: {current.attr} "
                               f"{current.path!r}: importing it did not finish within {current.timeout:g} s "
                               f"(policy.subject_spawn_timeout_sec)")
                    return out
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    reply = json.loads(line)
                    if "warm" in reply:  # an early child importing ahead: charge it to that module's target
                        current = self._target_of(reply["warm"]) or current
                        deadline = None if current is None or current.timeout is None else time.monotonic() + current.timeout
                    elif "start" in reply:
                        current = self.targets[reply["start"]]
                        deadline = None if current.timeout is None else time.monotonic() + current.timeout
                    elif "done" in reply:
                        target = self.targets[reply["done"]]
                        out.extend(f"{self._where(target, p['at'], p['key'])}: {p['message']}"
                                   for p in reply["problems"])
                        current, deadline = None, None
                    elif reply.get("end"):
                        ended = True
        if not ended:
            code = self._reap(grace=1.0)
            how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
                   else f"ended the process (exit code {code})")
            tail = self._stderr_tail()
            target = current or (self.targets[0] if self.targets else None)
            if target is None:  # pragma: no cover - no targets means no child
                return out
            out.append(f"{self._where(target, None, False)}: stage {target.stage!r}: {target.attr} {target.path!r}: "
                       f"importing it {how}" + (f"; it printed: {tail}" if tail else ""))
        return out

    def _stderr_tail(self) -> str:
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - STDERR_TAIL))
        text = self._stderr.read().decode("utf-8", "replace").strip()
        return " | ".join(line.strip() for line in text.splitlines()[-3:] if line.strip())

    def _exited(self, timeout: float) -> bool:
        """Has the child ended (within ``timeout``)? Looked at without reaping it."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return True
            except ChildProcessError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _reap(self, grace: float = 0.0) -> int:
        """Let the child end within ``grace``, then SIGKILL its group and reap it; its exit status.

        The group is signalled before the child is reaped, so its pid (the group's id)
        cannot belong to another process yet; this also stops anything its imports started.
        """
        assert self.proc is not None
        if self.proc.returncode is None:
            self._exited(grace)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return self.proc.wait()

    def close(self) -> None:
        """Stop the child if it still runs (the caller gave up on it) and release its pipes."""
        if self.proc is None:
            return
        self._reap(grace=0.5 if self._result is not None else 0.0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        self.proc = None

    def __enter__(self) -> OperatorCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
