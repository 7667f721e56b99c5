"""The messages between the runner and a worker, one pickled tuple per frame.

Runner -> worker: ``(BIND, op)``, ``(RUN, task)``, ``(RECALL,)``, ``(RETIRE,)``, ``(EXIT,)``,
``(TERMINATE,)``.
Worker -> runner: ``(BOUND,)``, ``(BIND_ERROR, message, traceback)``, ``(DONE, outcome)``,
``(SKIPPED,)``, ``(RECALLED, n)``: the last ``n`` runs sent before the RECALL were taken back unstarted
(see ``inbox``). A task and an outcome travel as the tuples of :mod:`habitrun.engine.wire`.

Several RUN frames travel in one write (one wake-up of the worker) when
subjects are short; each run is still pickled on its own, so a task that
cannot be pickled or unpickled fails alone. Replies still come one per run, sent the
moment that run ends and in the order the runs were sent, so the runner
always knows which subject a reply (or a death) belongs to: the oldest one
it is still owed. Each side pickles a message itself before sending, so an
unpicklable task or result becomes that subject's error instead of a stuck
feeder thread.

Frames are ``multiprocessing.connection``'s (a 4-byte big-endian length, or
-1 and an 8-byte length for huge ones), so either side may use
``Connection.send_bytes``; readers use :class:`FrameReader` to take every
frame that has arrived with one ``read`` call instead of two per message.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

from habitrun.engine.contract import OperatorRef, SubjectOutcome, SubjectTask
from habitrun.engine.wire import (
    failure_wire,
    outcome_from_wire,
    outcome_wire,
    task_from_wire,
    task_wire,
)

BIND = "bind"
RUN = "run"
RECALL = "recall"  # give back every run not started yet (answered by RECALLED)
RETIRE = "retire"  # skip every run not yet started, then exit
TERMINATE = "terminate"  # end now with everything below (read by the worker's reader thread)
EXIT = "exit"
UNDECODABLE = "undecodable"  # worker-internal: a message that could not be unpickled

BOUND = "bound"
BIND_ERROR = "bind_error"
DONE = "done"
SKIPPED = "skipped"
RECALLED = "recalled"

PROTOCOL = pickle.HIGHEST_PROTOCOL
READ_CHUNK = 1 << 18


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=PROTOCOL)


def loads(data: bytes | memoryview) -> tuple[Any, ...]:
    return pickle.loads(data)


def bind_message(op: OperatorRef) -> tuple[Any, ...]:
    """Bind this stage's operator (answered by BOUND or BIND_ERROR)."""
    return (BIND, op)


def bind_error_message(error: str, traceback: str) -> tuple[Any, ...]:
    return (BIND_ERROR, error, traceback)


def read_bind_error(message: tuple[Any, ...]) -> str:
    """Why a worker could not bind the operator, in one line."""
    return message[1]


def recalled_message(count: int) -> tuple[Any, ...]:
    """The answer to RECALL: this many runs, the last ones sent, were taken back and will not run here."""
    return (RECALLED, count)


def read_recalled(message: tuple[Any, ...]) -> int:
    return message[1]


def run_message(task: SubjectTask) -> tuple[Any, ...]:
    """``(RUN, task as a plain tuple)``: cheaper to pickle than the dataclass, rebuilt by :func:`task_from`."""
    return (RUN, task_wire(task))


def run_frame(task: SubjectTask) -> bytes:
    """:func:`run_message`, pickled and framed, ready to write (raises what pickling raises)."""
    return frame(pickle.dumps(run_message(task), protocol=PROTOCOL))


def task_from(message: tuple[Any, ...]) -> SubjectTask:
    """The task a RUN message carries."""
    return task_from_wire(message[1])


def done_message(outcome: SubjectOutcome) -> tuple[Any, ...]:
    """A run's reply: the outcome without its task (the runner knows which run it answers)."""
    return (DONE, outcome_wire(outcome))


def failure_message(error: str, kind: str, traceback: str | None = None, duration: float = 0.0,
                    usage: tuple | None = None) -> tuple[Any, ...]:
    """A run's reply when it failed in the worker's own hands (not its operator's): sent by the worker."""
    return (DONE, failure_wire(error, kind, traceback, duration, os.getpid(), usage))


def read_done(message: tuple[Any, ...], task: SubjectTask) -> SubjectOutcome:
    """The outcome a DONE reply carries for ``task``."""
    return outcome_from_wire(message[1], task)


_HEADER = struct.Struct("!i")
_BIG = struct.Struct("!Q")
_HUGE = 0x7FFFFFFF


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front, as ``Connection.send_bytes`` frames it."""
    n = len(payload)
    if n > _HUGE:
        return _HEADER.pack(-1) + _BIG.pack(n) + payload
    return _HEADER.pack(n) + payload


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (a blocking socket may still take a large buffer in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class FrameReader:
    """Splits what arrives on a pipe into frames, whatever the read boundaries."""

    def __init__(self) -> None:
        self.buf = bytearray()
        # Read into this one buffer: ``os.read(fd, READ_CHUNK)`` allocates READ_CHUNK bytes at every call
        # and gives them back, about 25 µs a read (the allocator maps and unmaps them), paid once per
        # reply when subjects take longer than the workers hold replies (benchmarks/engine_cpu.py).
        self.chunk = bytearray(READ_CHUNK)

    def read(self, fd: int) -> list[bytes] | None:
        """One ``read`` of ``fd``: the complete frames it finished, or None at end-of-file."""
        got = os.readv(fd, [self.chunk])
        if not got:
            return None
        with memoryview(self.chunk) as view:
            return self.feed(view[:got])

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        buf = self.buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _HEADER.unpack_from(buf, pos)
            start = pos + 4
            if size == -1:
                if end - start < 8:
                    break
                (size,) = _BIG.unpack_from(buf, start)
                start += 8
            if end - start < size:
                break
            frames.append(bytes(buf[start:start + size]))
            pos = start + size
        if pos:
            del buf[:pos]
        return frames
