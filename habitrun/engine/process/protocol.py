"""The messages between the runner and a worker, one pickled tuple per message.

Runner -> worker: ``(BIND, op)``, ``(RUN, task)``, ``(RETIRE,)``, ``(EXIT,)``.
Worker -> runner: ``(BOUND,)``, ``(BIND_ERROR, message, traceback)``,
``(DONE, key, ok, result, error, kind, traceback, duration)``, ``(SKIPPED, key)``.

Replies to RUN come back in the order the runs were sent, so the runner
always knows which subject a reply (or a death) belongs to: the oldest one
it is still owed. Each side pickles a message itself before sending, so an
unpicklable task or result becomes that subject's error instead of a stuck
feeder thread.
"""

from __future__ import annotations

import pickle
from typing import Any

BIND = "bind"
RUN = "run"
RETIRE = "retire"  # skip every run not yet started, then exit
EXIT = "exit"
UNDECODABLE = "undecodable"  # worker-internal: a run that could not be unpickled

BOUND = "bound"
BIND_ERROR = "bind_error"
DONE = "done"
SKIPPED = "skipped"

PROTOCOL = pickle.HIGHEST_PROTOCOL


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=PROTOCOL)


def loads(data: bytes) -> tuple[Any, ...]:
    return pickle.loads(data)
