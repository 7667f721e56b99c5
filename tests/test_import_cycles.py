"""No import cycle inside ``habitrun/engine``: a module's imports, at any level, form no loop.

Every import counts: at the top, inside a function, and under ``TYPE_CHECKING``
(a cycle hidden there is still one a reader must follow round). ``from pkg
import mod`` counts as importing ``pkg.mod``, not the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in (root / "habitrun" / "engine").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
            targets = subs if len(subs) == len(node.names) else [module, *subs]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Each group of engine modules that import each other round a loop (strongly connected, Tarjan)."""
    modules = _modules(root)
    graph = {name: sorted(_imported(name, path, modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_engine_has_no_import_cycle() -> None:
    assert import_cycles() == []


def test_the_check_sees_a_cycle_hidden_under_type_checking(tmp_path: Path) -> None:
    """The check itself: two modules importing each other, one of them only for type checking."""
    fake = tmp_path / "habitrun" / "engine"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("from habitrun.engine.b import B\n")
    (fake / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\nB = 1\n")
    assert import_cycles(tmp_path) == [["habitrun.engine.a", "habitrun.engine.b"]]
