"""Function ranks: a picklable function run in a ``multiprocessing`` child, one argument tuple per rank.

The function and its arguments are pickled here (so an unpicklable one fails
before any rank starts) and unpickled in the child only after its environment
is in place (``_child``); the return value comes back through a file.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
from typing import Any

from habitrun.errors import LaunchError
from habitrun.launcher._child import FunctionRankSpec, run_function_rank
from habitrun.launcher.group import ProcessContext, RankProcess


class FunctionProcess(RankProcess):
    """A started function rank: a ``multiprocessing`` process and the file its return value lands in."""

    def __init__(self, proc: mp.process.BaseProcess, result_path: str) -> None:
        self.proc = proc
        self.result_path = result_path
        super().__init__(proc.pid)

    def poll(self) -> int | None:
        return self.proc.exitcode

    def _exit_fd(self) -> int:
        return int(self.proc.sentinel)

    def return_value(self) -> Any:
        try:
            with open(self.result_path, "rb") as f:
                return pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return None

    def close(self) -> None:
        super().close()
        self.proc.close()


class FunctionRanks(ProcessContext):
    """A rank group whose ranks call ``fn(*args[rank])`` (spawn by default)."""

    _payloads: dict[int, bytes]

    def _prepare(self) -> None:
        entrypoint = self.spec.entrypoint
        self._payloads = {}
        for rank in range(self.nprocs):
            try:
                self._payloads[rank] = pickle.dumps((entrypoint, tuple(self.args[rank])))
            except Exception as exc:  # noqa: BLE001
                raise LaunchError(
                    f"the function entrypoint {getattr(entrypoint, '__qualname__', entrypoint)!r} "
                    f"or rank {rank}'s arguments cannot be pickled: {exc} "
                    "(define the function at module level)"
                ) from None

    def _spawn(self, rank: int) -> RankProcess:
        start_method = self.spec.start_method
        ctx: Any = mp.get_context(start_method)  # typeshed's BaseContext lacks Process; every real one has it
        targets = [self._stream_target(rank, stream) for stream in ("out", "err")]
        ends = [mpc.Connection(t, readable=False) if isinstance(t, int) else t for t in targets]
        result_path = os.path.join(self._rank_dirs[rank], "result.pkl")
        close_fds: tuple[int, ...] = ()
        if start_method == "fork" and self._watchdog is not None:
            close_fds = (self._watchdog.fileno(),)
        spec = FunctionRankSpec(
            payload=self._payloads[rank],
            env=self.envs[rank],
            stdout=ends[0],
            stderr=ends[1],
            result_path=result_path,
            parent_pid=None if start_method == "forkserver" else os.getpid(),
            close_fds=close_fds,
            cwd=self.spec.cwd,
        )
        proc = ctx.Process(target=run_function_rank, args=(spec,), name=f"{self.name}-rank{rank}")
        try:
            proc.start()
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"cannot start rank {rank} of {self.name!r}: {exc}") from exc
        finally:
            for end in ends:
                if isinstance(end, mpc.Connection):
                    end.close()
        return FunctionProcess(proc, result_path)
