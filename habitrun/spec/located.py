"""A validation error that knows which field, below the model, it is about.

Why: a model-level check (the stage graph, a policy's cross-field rule) sees
the whole model, but the user needs the line of the one field that is wrong.
Pydantic keeps the raised exception in the error's context, so the loader can
read ``items`` back and point at ``stages[2].needs[0]`` instead of the file's
first line. Outside the loader it reads as an ordinary ValueError.
"""

from __future__ import annotations

from typing import Any

FieldPath = tuple[Any, ...]


class LocatedError(ValueError):
    """One or more ``(relative field path, message)`` problems found together."""

    def __init__(self, items: list[tuple[FieldPath, str]]) -> None:
        self.items = list(items)
        super().__init__("; ".join(message for _, message in self.items))
