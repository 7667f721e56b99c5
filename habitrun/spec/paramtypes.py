"""Operator params checked against the operator's annotations (pydantic, in the check's child).

Why: ``offset: "abc"`` for ``def op(subject, offset: float)`` would otherwise pass
``validate`` and fail every subject with the same ``TypeError``. Each annotated
parameter gets a pydantic ``TypeAdapter``; unannotated ones, and annotations that
cannot be resolved or that pydantic cannot check (a plain class such as
``np.ndarray``), stay unchecked.

Why strict, in JSON mode: YAML has already typed every value, and the operator
receives it as YAML typed it (nothing is converted). Strict mode refuses what the
operator would choke on: ``"abc"`` or ``"1.5"`` (text) for a float, ``1.5`` or
``true`` for an int, ``1`` for a str. JSON mode accepts what YAML cannot write
otherwise: an int for a float (``spacing: [1, 1, 1]`` for ``list[float]``), a list
for a tuple, a string for a ``Path`` or an enum, a mapping for a pydantic model.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Problem = dict[str, Any]  # {"at": field path below the stage, "key": bool, "message": str}
SHOWN = 60  # characters of a value quoted in a message

_KINDS = {str: "text", bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "a mapping",
          type(None): "null"}


class _Annotated:
    """One parameter's annotation, as the object ``typing.get_type_hints`` reads (``__annotations__``)."""

    def __init__(self, name: str, annotation: str) -> None:
        self.__annotations__ = {name: annotation}


def _namespace(obj: Any) -> dict[str, Any]:
    """The globals a signature's string annotations are written in: the defining function's module."""
    init = getattr(obj, "__init__", None)
    func = init if isinstance(obj, type) and inspect.isfunction(init) else obj
    found = getattr(inspect.unwrap(func), "__globals__", None)
    if isinstance(found, dict):
        return found
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return vars(module) if module is not None else {}


def param_annotations(obj: Any, sig: inspect.Signature) -> dict[str, Any]:
    """Each annotated parameter's type; a string annotation (``from __future__ import annotations``)
    is resolved in the operator's module, and one that cannot be is left out (unchecked)."""
    out: dict[str, Any] = {}
    namespace: dict[str, Any] | None = None
    local = dict(vars(obj)) if isinstance(obj, type) else None
    for name, param in sig.parameters.items():
        annotation = param.annotation
        if annotation is param.empty:
            continue
        if isinstance(annotation, str):
            namespace = _namespace(obj) if namespace is None else namespace
            try:
                annotation = typing.get_type_hints(_Annotated(name, annotation), namespace, local,
                                                   include_extras=True)[name]
            except Exception:  # noqa: BLE001 - any failure to resolve it means: not checked
                continue
        out[name] = annotation
    return out


def type_text(tp: Any, top: bool = True) -> str:
    """An annotation as a researcher reads it: ``list[float]``, ``Path | None``, ``one of 'a', 'b'``."""
    if tp is type(None) or tp is None:
        return "None"
    if tp is Ellipsis:
        return "..."
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_text(args[0], top)
    if origin is typing.Literal:
        if top:
            return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(map(repr, args))
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a, False) for a in args)
    if origin is not None:
        base = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        return f"{base}[{', '.join(type_text(a, False) for a in args)}]" if args else base
    if isinstance(tp, type):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def shown(value: Any) -> str:
    """A value as a message quotes it, cut short, with what YAML made of it."""
    text = repr(value)
    if len(text) > SHOWN:
        text = text[: SHOWN - 3] + "..."
    kind = _KINDS.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


_SCALARS: dict[Any, tuple[type, ...]] = {float: (int, float), int: (int,), str: (str,), bool: (bool,),
                                         Path: (str,), typing.Any: (object,), object: (object,)}


def plainly_fits(tp: Any, value: Any, depth: int = 0) -> bool:
    """Whether ``value`` surely passes pydantic's strict JSON check of ``tp``, seen without pydantic.

    Only plain annotations (float, int, str, bool, Path, Any, their lists, tuples, dicts, Optional,
    Literal) are looked at; for anything else, and for any doubt, False: pydantic decides, and
    every message is pydantic's. Why: the common case then never imports pydantic into the
    check's child (30-100 ms on the critical path of ``validate``)."""
    if depth > 8:
        return False
    kinds = _SCALARS.get(tp)
    if kinds is not None:
        return type(value) in kinds or kinds == (object,)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(plainly_fits(a, value, depth + 1) for a in args)
    if tp is type(None) or tp is None:
        return value is None
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if origin in (list, tuple, dict) and not isinstance(value, (list, dict)):
        return False
    if origin is list and len(args) == 1:
        return type(value) is list and all(plainly_fits(args[0], v, depth + 1) for v in value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return type(value) is list and all(plainly_fits(args[0], v, depth + 1) for v in value)
    if origin is tuple and args and Ellipsis not in args:
        return (type(value) is list and len(value) == len(args)
                and all(plainly_fits(a, v, depth + 1) for a, v in zip(args, value, strict=True)))
    if origin is dict and len(args) == 2 and args[0] is str:
        return type(value) is dict and all(plainly_fits(args[1], v, depth + 1) for v in value.values())
    return False


def _validator(tp: Any) -> Any:
    """A pydantic TypeAdapter for ``tp``, or None when pydantic cannot check it (left unchecked)."""
    from pydantic import TypeAdapter

    try:
        return TypeAdapter(tp)
    except Exception:  # noqa: BLE001 - a type pydantic has no schema for (np.ndarray, a plain class)
        return None


def _errors(adapter: Any, value: Any) -> list[dict[str, Any]] | None:
    """pydantic's errors for ``value`` (strict, JSON mode); None when it passes or the check itself fails."""
    from pydantic import ValidationError

    try:
        adapter.validate_json(json.dumps(value), strict=True)
    except ValidationError as exc:
        return [dict(err) for err in exc.errors(include_url=False)]
    except Exception:  # noqa: BLE001 - a user's validator that crashes: not ours to report
        return None
    return None


def _passes(adapter: Any, value: Any) -> bool:
    return _errors(adapter, value) is None


def _hint(adapter: Any, value: Any) -> str:
    """How to write it: a number or boolean in quotes is text to YAML; text a str wants needs quotes."""
    if isinstance(value, str):
        try:
            unquoted = json.loads(value)
        except ValueError:
            return ""
        if isinstance(unquoted, (int, float)) and _passes(adapter, unquoted):
            return "; in quotes it is text: write it without quotes"
        return ""
    if isinstance(value, (int, float)) and _passes(adapter, str(value)):
        return "; to pass it as text, write it in quotes"
    return ""


def _loc_text(loc: Iterable[Any]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _into(value: Any, loc: Iterable[Any]) -> list[Any]:
    """The part of ``loc`` that names items inside ``value`` (where the recipe has a position for)."""
    path: list[Any] = []
    for part in loc:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        else:
            break
        path.append(part)
    return path


def check_value(tp: Any, value: Any, name: str, what: str) -> Problem | None:
    """The problem of passing ``value`` to a parameter annotated ``tp`` (None: it fits or is unchecked)."""
    if plainly_fits(tp, value):
        return None
    adapter = _validator(tp)
    if adapter is None:
        return None
    errors = _errors(adapter, value)
    if not errors:
        return None
    at: list[Any] = ["params", name]
    message = f"{what}: param {name!r} expects {type_text(tp)}, got {shown(value)}"
    members = [a for a in typing.get_args(tp) if a is not type(None)]
    union = typing.get_origin(tp) in (typing.Union, types.UnionType) and len(members) > 1  # X | None: nullable X
    first = errors[0]
    loc = list(first.get("loc", ()))
    if loc and not union:
        at += _into(value, loc)
        message += f"; at {_loc_text(loc)}: {first['msg'][:1].lower()}{first['msg'][1:]}"
        if first.get("type") != "missing":
            message += f", got {shown(first.get('input'))}"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more)"
    elif not union and not str(first.get("type", "")).endswith(("_type", "literal_error", "enum")):
        message += f"; {first['msg'][:1].lower()}{first['msg'][1:]}"  # a literal, a bound, a model's own rule
    return {"at": at, "key": False, "message": message + _hint(adapter, value)}


def check_types(obj: Any, sig: inspect.Signature, params: dict[str, Any], slot: str | None,
                what: str) -> list[Problem]:
    """Problems of the params whose parameter is annotated (by name, or through an annotated ``**kwargs``)."""
    hints = param_annotations(obj, sig)
    if not hints:
        return []
    named = {n: p for n, p in sig.parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != slot}
    rest = next((n for n, p in sig.parameters.items() if p.kind is p.VAR_KEYWORD), None)
    problems: list[Problem] = []
    for name, value in params.items():
        param = named.get(name)
        annotated = name if param is not None else rest if name not in sig.parameters else None
        if annotated is None or annotated not in hints:
            continue
        if value is None and param is not None and param.default is None:
            continue  # null for a parameter whose default is None: the default's own value
        problem = check_value(hints[annotated], value, str(name), what)
        if problem is not None:
            problems.append(problem)
    return problems
