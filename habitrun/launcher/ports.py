"""A free TCP port for the rank group's rendezvous, held until the group is done.

Asking the OS for port 0 and closing the socket again leaves a window in which
another program (or a second habitrun) is handed the same port. Instead the
launcher keeps its socket bound, with SO_REUSEADDR and without listening, for
the attempt's lifetime: the kernel hands the port to no other ``bind(0)``, while
rank 0's TCPStore (which also sets SO_REUSEADDR, as libuv and c10d do) may still
bind and listen on it. Linux only refuses the second bind if one of the two
sockets listens, and ours never does.
"""

from __future__ import annotations

import socket

from habitrun.errors import LaunchError


class PortReservation:
    """A bound, non-listening socket holding ``port`` until ``release()``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
        except OSError as exc:
            sock.close()
            raise LaunchError(f"cannot reserve a TCP port on {host} for the rank group: {exc}") from exc
        self._sock: socket.socket | None = sock
        self.host = host
        self.port: int = sock.getsockname()[1]

    def release(self) -> None:
        """Give the port back (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
