"""The process backend: subjects run in worker processes on this machine.

``local_backend.py`` holds the backend; the other modules are its parts,
one concern each: the worker pool, one worker's handle and phases, the
persistent/isolated modes, a stage's event loop, queue and endings (the
runner's side); the worker main loop, wire protocol, process start
(``spawner``), memory watchdog, GPU pinning, thread caps and death
classification.

:class:`ProcessBackend` is imported on first use, not with the package: a
worker (and the fork server that preloads it) imports
``habitrun.engine.process.worker``, which needs none of the dispatch loop's
imports (pydantic among them), and starts that much sooner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from habitrun.engine.process.local_backend import ProcessBackend

__all__ = ["ProcessBackend"]


def __getattr__(name: str) -> Any:
    if name == "ProcessBackend":
        from habitrun.engine.process.local_backend import ProcessBackend

        return ProcessBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
