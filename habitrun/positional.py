"""Positional builders for the keyword-only dataclasses the runner builds once per subject.

The types that carry a subject through the engine (SubjectTask, SubjectOutcome, Record,
SubjectDone) are keyword-only, so a misplaced argument cannot land in the wrong field.
A keyword call costs about 0.4 µs more than a positional one, and the runner builds
four of these per subject on its dispatch thread (``benchmarks/engine_cpu.py``). The
few call sites on that path use a builder made here instead: generated from the
class's own fields, under a name that lists the parameters in order, so the order is
written once, beside the call, and a field added to the class without a default makes
the builder fail at import rather than build a half-filled object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

T = TypeVar("T")


def builder(cls: type[T], *names: str) -> Callable[..., T]:
    """A function taking ``names`` positionally that returns a ``cls`` with those fields set
    (every other field takes its default); for slotted, non-frozen dataclasses."""
    declared = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = [n for n in names if n not in declared]
    if unknown or len(set(names)) != len(names):
        raise TypeError(f"builder({cls.__name__}): unknown or repeated fields {unknown or names}")
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = [f"def build_{cls.__name__}({', '.join(names)}):", "    obj = new(cls)"]
    for name, f in declared.items():
        if name in names:
            value = name
        elif f.default is not MISSING:
            namespace[f"d_{name}"] = f.default
            value = f"d_{name}"
        elif f.default_factory is not MISSING:
            namespace[f"f_{name}"] = f.default_factory
            value = f"f_{name}()"
        else:
            raise TypeError(f"builder({cls.__name__}): field {name!r} has no default and is not given")
        lines.append(f"    obj.{name} = {value}")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)  # constant text, from the class's own field names only
    return namespace[f"build_{cls.__name__}"]
