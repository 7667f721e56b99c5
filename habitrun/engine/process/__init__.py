"""The process backend: subjects run in worker processes on this machine.

``backend.py`` holds the dispatch loop; the other modules are its parts,
one concern each (worker main loop, wire protocol, process start, memory
watchdog, GPU pinning, thread caps, death classification).
"""

from habitrun.engine.process.backend import ProcessBackend

__all__ = ["ProcessBackend"]
