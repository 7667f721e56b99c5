"""Operators by import path: resolve "pkg.mod:attr" / "pkg.mod.attr" and fingerprint their code.

The recipe's own folder is importable, so a study keeps ``study_ops/`` beside
its recipe. The fingerprint hashes the operator module's source without
importing it, so planning never runs a study's import-time code.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from habitrun.errors import RecipeError


def split_import_path(path: str) -> tuple[str, str]:
    """``"a.b:c.d"`` -> (``"a.b"``, ``"c.d"``); ``"a.b.c"`` -> (``"a.b"``, ``"c"``)."""
    if ":" in path:
        module, _, attr = path.partition(":")
    else:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise RecipeError(f"{path!r} is not an import path; write 'module:attribute'")
    return module, attr


@contextmanager
def importable(search_path: Sequence[str]):
    """Put the recipe's folder(s) first on ``sys.path`` for the duration."""
    added = [p for p in search_path if p not in sys.path]
    for p in reversed(added):
        sys.path.insert(0, p)
    try:
        yield
    finally:
        for p in added:
            try:
                sys.path.remove(p)
            except ValueError:
                pass


def import_error_text(exc: BaseException) -> str:
    """``SyntaxError: ... at /study/ops.py:3:9`` / ``ValueError: x (at /study/ops.py:5)``: what and where.

    A SyntaxError's own text names only the file's base name; the user needs
    the full path and line, and for any other exception the line of their
    module that raised it (the innermost frame of the traceback).
    """
    if isinstance(exc, SyntaxError) and exc.filename:
        col = f":{exc.offset}" if exc.offset else ""
        return f"{type(exc).__name__}: {exc.msg} at {exc.filename}:{exc.lineno}{col}"
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    if user:
        return f"{last} (at {user[-1].filename}:{user[-1].lineno})"
    return last


def resolve_operator(path: str, search_path: Sequence[str] = (), *, stage: str | None = None) -> Any:
    """Import and return the object at ``path``; every failure is a RecipeError naming the stage."""
    where = f"stage {stage!r}: " if stage else ""
    module_name, attr = split_import_path(path)
    with importable([str(p) for p in search_path]):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise RecipeError(
                    f"{where}operator {path!r}: no module named {exc.name!r} "
                    f"(looked in the recipe's folder and the installed packages)"
                ) from None
            raise RecipeError(
                f"{where}operator {path!r}: importing {module_name!r} failed: {exc}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the user's import-time code
            raise RecipeError(f"{where}operator {path!r}: importing {module_name!r} raised {import_error_text(exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RecipeError(f"{where}operator {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise RecipeError(f"{where}operator {path!r} is a value of type {type(obj).__name__}, not a function or class")
    return obj


def operator_fingerprint(path: str, search_path: Sequence[str] = ()) -> str:
    """sha256 of the operator module's source (without importing it).

    A module that cannot be found by source (a C extension, a namespace)
    falls back to its file's bytes or, failing that, the import path itself.
    """
    module_name, _ = split_import_path(path)
    with importable([str(p) for p in search_path]):
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError, AttributeError):
            spec = None
    digest = hashlib.sha256(path.encode())
    origin = getattr(spec, "origin", None) if spec else None
    if origin and origin not in ("built-in", "frozen") and Path(origin).is_file():
        digest.update(Path(origin).read_bytes())
    return digest.hexdigest()
