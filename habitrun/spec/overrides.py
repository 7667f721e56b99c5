"""Command-line overrides: ``policy.workers=8``, ``stages.features.params.bins=64``.

An override is a dotted path and a value read as YAML (``8`` is a number,
``null`` is null, ``[a, b]`` a list). Inside ``stages`` a path part names a
stage (or gives its index). Overrides apply to the file's data *before*
interpolation and validation, so each later error can name the override that
caused it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from habitrun.errors import RecipeError
from habitrun.spec.yamlpos import Path_, parse_scalar


def _parse_value(text: str, label: str) -> Any:
    try:
        return parse_scalar(text)
    except RecipeError as exc:
        detail = "; ".join(p.split("syntax: ", 1)[-1] for p in exc.problems)
        raise RecipeError([f"{label}: the value is not valid YAML: {detail}"]) from None


def _step_into_list(items: list[Any], part: str, path: Path_, label: str) -> int:
    if path == ("stages",):
        names = [s.get("name") for s in items if isinstance(s, dict)]
        for i, stage in enumerate(items):
            if isinstance(stage, dict) and stage.get("name") == part:
                return i
        if not part.isdigit():
            close = difflib.get_close_matches(part, [str(n) for n in names if n is not None], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError([f"{label}: there is no stage named {part!r}{hint}"])
    if part.isdigit() and int(part) < len(items):
        return int(part)
    raise RecipeError([f"{label}: {'.'.join(map(str, path)) or 'the recipe'} has no item {part!r} (it has {len(items)})"])


def apply_override(data: dict[str, Any], override: str) -> Path_:
    """Set one override in ``data`` (in place); return the field path it set."""
    label = f"override {override!r}"
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or any(not p for p in parts):
        raise RecipeError([f"{label}: write it as 'dotted.path=value', e.g. 'policy.workers=8'"])
    value = _parse_value(text, label)
    current: Any = data
    path: Path_ = ()
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(current, dict):
            step: Any = part
            if not last and not isinstance(current.get(part), (dict, list)):
                if current.get(part) is not None:
                    where = ".".join(parts[: i + 1])
                    raise RecipeError([f"{label}: {where!r} is a {type(current[part]).__name__}, not a mapping"])
                current[part] = {}
        elif isinstance(current, list):
            step = _step_into_list(current, part, path, label)
        else:
            where = ".".join(parts[:i]) or "the recipe"
            raise RecipeError([f"{label}: {where!r} is a {type(current).__name__}, not a mapping"])
        path = (*path, step)
        if last:
            current[step] = value
        else:
            current = current[step]
    return path


def apply_overrides(data: Any, overrides: Sequence[str]) -> tuple[Any, dict[Path_, str]]:
    """Apply every override; return the data and, per set path, the override that set it.

    All overrides are tried, and every broken one is reported together.
    """
    origins: dict[Path_, str] = {}
    problems: list[str] = []
    if overrides and not isinstance(data, dict):
        return data, origins  # the recipe's own shape error is reported first
    for override in overrides:
        try:
            path = apply_override(data, override)
        except RecipeError as exc:
            problems.extend(exc.problems)
            continue
        for old in [p for p in origins if p[: len(path)] == path]:
            del origins[old]  # replaced by this later, wider override
        origins[path] = override
    if problems:
        raise RecipeError(problems)
    return data, origins
