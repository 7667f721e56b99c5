"""Pydantic validation errors -> messages a recipe author can act on.

Why not pydantic's text: it says "Input should be greater than or equal to 1"
and names union members in its paths. A user wants "expected an integer >= 1,
got 'four'", the path as written in the file, and a close match for a
misspelled key. The expected type is read from the models themselves, so the
text stays right when a field changes.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from habitrun.spec.located import LocatedError
from habitrun.spec.yamlpos import Path_


@dataclass(frozen=True)
class FieldProblem:
    """One problem: the data path it is about, the message, and whether the key (not the value) is at fault."""

    path: Path_
    message: str
    at_key: bool = False


def _is_model(ann: Any) -> bool:
    return inspect.isclass(ann) and issubclass(ann, BaseModel)


def _strip_optional(ann: Any) -> tuple[Any, bool]:
    if typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    origin = typing.get_origin(ann)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(ann))
        if len(args) == 1:
            return args[0], nullable
        return Union[tuple(args)], nullable  # noqa: UP007
    return ann, False


def _model_field(model: type[BaseModel], name: str) -> FieldInfo | None:
    """A model's field by the name the YAML uses: its alias (``from``) or its own name."""
    info = model.model_fields.get(name)
    if info is not None and info.alias in (None, name):
        return info
    return next((i for i in model.model_fields.values() if i.alias == name), None)


def _yaml_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def field_at(model: type[BaseModel], path: Path_) -> tuple[Any, FieldInfo | None]:
    """(annotation, FieldInfo or None) of the field at ``path`` below ``model``, or (None, None)."""
    ann: Any = model
    info: FieldInfo | None = None
    for part in path:
        ann, _ = _strip_optional(ann)
        origin = typing.get_origin(ann)
        if _is_model(ann):
            info = _model_field(ann, part) if isinstance(part, str) else None
            if info is None:
                return None, None
            ann = info.annotation
        elif origin in (tuple, list) and isinstance(part, int):
            ann, info = typing.get_args(ann)[0], None
        elif origin is dict:
            ann, info = typing.get_args(ann)[1], None
        else:
            return None, None
    return ann, info


def describe(ann: Any, info: FieldInfo | None = None) -> str:
    """'an integer >= 1', "one of 'continue', 'fail_fast'", 'a number > 0 (or null)'..."""
    ann, nullable = _strip_optional(ann)
    text = _describe_type(ann)
    for meta in info.metadata if info is not None else ():
        if isinstance(meta, annotated_types.Ge):
            text += f" >= {meta.ge}"
        elif isinstance(meta, annotated_types.Gt):
            text += f" > {meta.gt}"
        elif isinstance(meta, annotated_types.Le):
            text += f" and <= {meta.le}" + (" (24 days)" if meta.le == 2_073_600 else "")
        elif isinstance(meta, annotated_types.Lt):
            text += f" and < {meta.lt}"
        elif isinstance(meta, annotated_types.MinLen) and meta.min_length > 0:
            text += " (not empty)"
    return text + (" (or null)" if nullable else "")


def _describe_type(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(ann))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe_type(a) for a in typing.get_args(ann))
    if origin in (tuple, list):
        inner = typing.get_args(ann)
        return f"a list of {_plural(inner[0])}" if inner else "a list"
    if origin is dict or ann is dict or _is_model(ann):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(ann, "a value")


def _plural(ann: Any) -> str:
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(ann, "values")


def shown(value: Any) -> str:
    """How a wrong value is shown in a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _data_path(data: Any, loc: tuple[Any, ...], keep_last: bool) -> Path_:
    """Keep the parts of pydantic's ``loc`` that exist in the data (drop union-member tags)."""
    path: list[Any] = []
    cur = data
    for i, part in enumerate(loc):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
            path.append(part)
        elif isinstance(cur, (list, tuple)) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
            path.append(part)
        elif keep_last and i == len(loc) - 1:
            path.append(part)
    return tuple(path)


_PATTERN_HINTS = {
    "name": "a name of letters, digits, '_', '.' or '-' (not starting with '.' or '-')",
    "operator": "an import path 'module:attribute' (or 'module.attribute')",
    "entrypoint": "an import path 'module:function' (or 'module.function')",
    "datatype": "a BIDS datatype folder in lowercase letters (anat, func, dwi ...)",
}


def _message(err: dict[str, Any], path: Path_, model: type[BaseModel]) -> FieldProblem:
    kind = err["type"]
    value = err.get("input")
    name = path[-1] if path else None
    if kind == "extra_forbidden":
        parent, _ = field_at(model, path[:-1])
        parent, _ = _strip_optional(parent)
        choices = _yaml_names(parent) if _is_model(parent) else []
        close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if not close and len(path) == 1:
            policy_fields = _policy_fields(model)
            if name in policy_fields:
                hint = f" ({name!r} is a policy field: put it under 'policy:')"
        return FieldProblem(path, f"unknown key {name!r}{hint}", at_key=True)
    if kind == "missing":
        if path == ("habitrun",):
            return FieldProblem(path[:-1], "missing required key 'habitrun': start the recipe with 'habitrun: 1' (the format version)")
        return FieldProblem(path[:-1], f"missing required key {name!r}")
    if path == ("habitrun",) and kind == "literal_error":
        return FieldProblem(path, f"unsupported recipe format version {shown(value)}: this habitrun reads 'habitrun: 1'")
    ann, info = field_at(model, path)
    expected = describe(ann, info) if ann is not None else None
    if kind == "string_pattern_mismatch" and name in _PATTERN_HINTS:
        return FieldProblem(path, f"expected {_PATTERN_HINTS[name]}, got {shown(value)}")
    if kind == "literal_error" and isinstance(value, str):
        choices = [str(v) for v in typing.get_args(_strip_optional(ann)[0])] if ann is not None else []
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return FieldProblem(path, f"expected {expected}, got {shown(value)}{hint}")
    if kind in ("too_short", "string_too_short"):
        what = "must not be empty" if kind == "string_too_short" else f"needs at least {err['ctx']['min_length']} item(s)"
        return FieldProblem(path, f"{what}, got {shown(value) if kind == 'string_too_short' else 'none'}")
    if kind == "value_error":
        text = str((err.get("ctx") or {}).get("error", err["msg"]))
        return FieldProblem(path, text)
    if expected is not None:
        return FieldProblem(path, f"expected {expected}, got {shown(value)}")
    msg = err["msg"]
    return FieldProblem(path, f"{msg[:1].lower()}{msg[1:]}, got {shown(value)}")


def _policy_fields(model: type[BaseModel]) -> tuple[str, ...]:
    info = model.model_fields.get("policy")
    if info is None:
        return ()
    ann, _ = _strip_optional(info.annotation)
    return tuple(ann.model_fields) if _is_model(ann) else ()


def problems_of(exc: ValidationError, data: Any, model: type[BaseModel]) -> list[FieldProblem]:
    """Every problem of a failed ``model.model_validate(data)``, one per field path."""
    out: list[FieldProblem] = []
    by_path: dict[Path_, list[Any]] = {}  # pydantic's ErrorDetails
    errors = exc.errors()
    locs = [tuple(e["loc"]) for e in errors]
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "too_short" and any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
            continue  # pydantic counts only the valid items: the real problem is inside
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, LocatedError):
            base = _data_path(data, tuple(err["loc"]), keep_last=False)
            out.extend(FieldProblem((*base, *sub), message) for sub, message in inner.items)
            continue
        keep_last = err["type"] in ("missing", "extra_forbidden")
        by_path.setdefault(_data_path(data, tuple(err["loc"]), keep_last), []).append(err)
    deeper = [p for p in by_path if any(len(o) > len(p) and o[: len(p)] == p for o in by_path)]
    for path in deeper:  # a mapping fits the union's mapping member: the problem is inside it
        kept = [e for e in by_path[path] if not e["type"].endswith("_type")]
        if kept:
            by_path[path] = kept
        else:
            del by_path[path]
    for path, errs in by_path.items():
        out.extend(_group(path, errs, model))
    return out


def _group(path: Path_, errs: list[dict[str, Any]], model: type[BaseModel]) -> Iterator[FieldProblem]:
    """One message per path: a value that fits no member of a union gets one 'expected ...'."""
    union = len(errs) > 1 and all(e["type"] not in ("missing", "extra_forbidden") for e in errs)
    if union:
        ann, info = field_at(model, path)
        if ann is not None:
            yield FieldProblem(path, f"expected {describe(ann, info)}, got {shown(errs[0].get('input'))}")
            return
    seen: set[tuple[Path_, str]] = set()
    for err in errs:
        problem = _message(err, path, model)
        if (problem.path, problem.message) not in seen:
            seen.add((problem.path, problem.message))
            yield problem
