"""A run's event log: JSON lines, appended and flushed per call.

The runner may be killed mid-write, so the last line can be torn; reading
skips a line that does not parse, and reopening for append first ends a
torn line, so the next event never glues onto it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from habitrun.store.jsontext import compact


class EventLog:
    """Append-only JSON-lines file; each ``write``/``write_many`` is one flushed append."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = None

    def _handle(self) -> IO[str]:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = False
            if self.path.exists() and self.path.stat().st_size:
                with open(self.path, "rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    torn = fh.read(1) != b"\n"
            self._fh = open(self.path, "a", encoding="utf-8")
            if torn:
                self._fh.write("\n")
        return self._fh

    @staticmethod
    def _lines(events: Iterable[dict[str, Any]], now: float) -> str:
        """Each event as a line ``{"ts":now,...}``: the stamp is written once, not merged into each."""
        ts = round(now, 6)
        stamp = compact({"ts": ts})[:-1]
        lines = []
        for event in events:
            if not event or "ts" in event:  # its own stamp (or nothing but ours): merge the dicts
                lines.append(compact({"ts": ts, **event}) + "\n")
            else:
                lines.append(f"{stamp},{compact(event)[1:]}\n")
        return "".join(lines)

    def write(self, event: dict[str, Any]) -> None:
        """Append one event with a ``ts`` (Unix seconds)."""
        self.write_many((event,))

    def write_many(self, events: Iterable[dict[str, Any]]) -> None:
        """Append several events in one write and one flush."""
        text = self._lines(events, time.time())
        if text:
            fh = self._handle()
            fh.write(text)
            fh.flush()

    def read(self) -> Iterator[dict[str, Any]]:
        """Every event that parses, in order (a torn or damaged line is skipped)."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    yield event

    def close(self) -> None:
        """Close the file; a close whose flush fails (a full disk) still lets go of it, then raises."""
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
