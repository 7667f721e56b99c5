"""User text inside rich markup: every id, stage name, path and message goes through :func:`esc`.

Rich reads ``[...]`` as markup, so an error message like ``no image for [/data/ct.nii]``
would raise ``MarkupError`` (or a ``[columns]`` would vanish) if printed as is.
"""

from __future__ import annotations

import shlex

from rich.markup import escape


def esc(value: object) -> str:
    """``value`` as text that rich prints literally inside a markup string."""
    return escape(str(value))


def command(*words: object) -> str:
    """The exact command to copy (each word quoted for the shell), escaped for rich markup.

    Hints name the recipe path and the overrides the user gave: a hint that drops
    them runs another study, or this one with other parameters.
    """
    return esc(shlex.join(str(w) for w in words))


def human(value: float | None, unit: str = "") -> str:
    """A short number for people: 12.3 ms, 4.5 s, 2.1 h, 3,400 MB (a dash when unmeasured)."""
    if value is None:
        return "–"
    if unit == "s" and value:
        if value >= 3600:
            return f"{value / 3600:.1f} h"
        if value >= 120:
            return f"{value / 60:.1f} min"
        if abs(value) < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if abs(value) < 1:
            return f"{value * 1e3:.3g} ms"
    magnitude = abs(value)
    if magnitude >= 1000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 0.01 or magnitude == 0:
        text = f"{value:.2f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}".strip()
