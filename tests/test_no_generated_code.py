"""No code generated at run time in habitrun/: types are written out, so mypy, IDEs and tracebacks see them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"exec", "eval", "compile", "make_dataclass"}


def _generating_calls(source: str, filename: str) -> list[str]:
    """``name (line N)`` for each call of a forbidden name, bare or as an attribute (``dataclasses.make_dataclass``,
    ``builtins.exec``); ``re.compile`` is a regular expression, not code, and is allowed."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in FORBIDDEN:
            found.append(f"{func.id} (line {node.lineno})")
        elif isinstance(func, ast.Attribute) and func.attr in FORBIDDEN:
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if not (func.attr == "compile" and owner == "re"):
                found.append(f"{func.attr} (line {node.lineno})")
    return found


def test_the_scan_finds_each_way_of_generating_code() -> None:
    source = "exec('x=1')\neval('1')\ncompile('1', 's', 'eval')\ndataclasses.make_dataclass('A', [])\n" \
             "builtins.exec('y')\nre.compile('a+')\n"
    assert _generating_calls(source, "sample.py") == [
        "exec (line 1)", "eval (line 2)", "compile (line 3)", "make_dataclass (line 4)", "exec (line 5)"]


@pytest.mark.parametrize("module", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "habitrun").rglob("*.py")))
def test_no_module_generates_code(module: str) -> None:
    path = ROOT / module
    assert _generating_calls(path.read_text(), str(path)) == [], f"{module} generates code at run time"
