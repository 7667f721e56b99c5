"""Module docstring."""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Box:
    """A box."""
    size: int = 3
    tags: list[str] = field(default_factory=list)

    def area(self, /, scale: float = 1.5, *args: int, key: str = "k", **kw: object) -> float:
        return self.size ** 2 * scale


async def fetch(items, *, limit=10):
    async with items as it:
        async for x in it:
            yield x


def op(subject, width: int = 3, name="x"):
    global COUNT
    values = [v * 2 for v in range(width) if v % 2]
    table = {k: v for k, v in zip("abc", values, strict=False)}
    seen = {*values, 1j, b"raw", ..., None, True, 0.25}
    if (n := len(values)) > 2:
        values = values[1:-1:2]
    label = f"{name!r:>{width}} {n:.3f} {json.dumps(table)=} {'nested ' f'{n}'}" "tail"
    match subject:
        case {"id": str(sid), **rest} if sid:
            label += sid + str(rest)
        case [first, *others]:
            label += str(first) + str(others)
        case Box(size=3) | None:
            pass
        case _:
            pass
    try:
        lam = lambda a, b=2: a + b  # noqa: E731
    except (ValueError, TypeError) as exc:
        raise RuntimeError("bad") from exc
    finally:
        del seen
    with open("x") as f, open("y"):
        label += f.name
    return label, lam, table, -n, not n, n if n else 0
