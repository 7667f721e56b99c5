"""User text inside rich markup: every id, stage name, path and message goes through :func:`esc`.

Rich reads ``[...]`` as markup, so an error message like ``no image for [/data/ct.nii]``
would raise ``MarkupError`` (or a ``[columns]`` would vanish) if printed as is.
"""

from __future__ import annotations

from rich.markup import escape


def esc(value: object) -> str:
    """``value`` as text that rich prints literally inside a markup string."""
    return escape(str(value))
