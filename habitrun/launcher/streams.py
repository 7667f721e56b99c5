"""Copy teed rank output into its log file and onto the console, one prefixed line at a time.

A teed stream reaches the launcher through a pipe; one pump thread selects over
every pipe of the attempt, so the launcher has a single reader however many
ranks run. Bytes go to the log file as they come; the console gets whole lines
(a trailing partial line is flushed at end of file) prefixed ``[<name>/<rank>] ``.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

Console = Callable[[str], None]
"""Receives one prefixed line without its newline."""


def default_console(stream: str) -> Console:
    """Lines from a rank's stdout go to our stdout, its stderr to our stderr."""

    def write(line: str) -> None:
        target = sys.stdout if stream == "out" else sys.stderr
        try:
            target.write(line + "\n")
            target.flush()
        except (OSError, ValueError):
            pass

    return write


@dataclass
class _Tap:
    prefix: str
    log: BinaryIO
    console: Console
    partial: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        try:
            self.log.write(data)
            self.log.flush()
        except OSError:
            pass  # a full disk must not stop the pump: a blocked pipe would hang the rank
        self.partial += data
        while True:
            cut = self.partial.find(b"\n")
            if cut < 0:
                break
            line = bytes(self.partial[:cut]).rstrip(b"\r")
            del self.partial[: cut + 1]
            self._emit(line)

    def finish(self) -> None:
        if self.partial:
            self._emit(bytes(self.partial))
            self.partial.clear()
        try:
            self.log.close()
        except OSError:
            pass

    def _emit(self, line: bytes) -> None:
        try:
            self.console(self.prefix + line.decode("utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - a broken console must not stop the pump either
            pass


class Pump:
    """One thread draining every teed pipe of a group until each reaches end of file."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._taps: dict[int, _Tap] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, read_fd: int, log_path: str, prefix: str, console: Console) -> None:
        """Drain ``read_fd`` into ``log_path`` (appending) and ``console``. Call before start()."""
        os.set_blocking(read_fd, False)
        tap = _Tap(prefix, open(log_path, "ab"), console)  # noqa: SIM115 - closed in finish()
        with self._lock:
            self._taps[read_fd] = tap
            self._selector.register(read_fd, selectors.EVENT_READ)

    def start(self) -> None:
        if self._taps and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="habitrun-rank-pump", daemon=True)
            self._thread.start()

    def _close_fd(self, fd: int) -> None:
        tap = self._taps.pop(fd)
        self._selector.unregister(fd)
        os.close(fd)
        tap.finish()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._taps:
                    return
            for key, _ in self._selector.select():
                fd = int(key.fd)
                if fd == self._wake_r:
                    if self._stopping:
                        self._drain_all()
                        return
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                with self._lock:
                    if data:
                        self._taps[fd].feed(data)
                    else:
                        self._close_fd(fd)

    def _drain_all(self) -> None:
        """Read what is buffered in every pipe (without waiting for writers to close), then close."""
        with self._lock:
            for fd in list(self._taps):
                while True:
                    try:
                        data = os.read(fd, 65536)
                    except OSError:
                        break
                    if not data:
                        break
                    self._taps[fd].feed(data)
                self._close_fd(fd)

    def stop(self, timeout: float = 2.0) -> None:
        """Wait for every pipe to end; past ``timeout`` (a rank's child still holds one) cut it off."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._stopping = True
                os.write(self._wake_w, b"x")
                self._thread.join(timeout)
        else:
            self._drain_all()
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
