"""The layers of the design sketch hold: checked with import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_ORDER = ["errors", "spec", "store", "planner", "engine", "study", "cli"]
LAUNCHER_MAY_IMPORT = {"errors", "launcher"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name.split(".")[1] for name in found if name.startswith("habitrun.") and name.count(".") >= 1}


@pytest.mark.parametrize("module", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "habitrun").rglob("*.py")))
def test_module_imports_only_lower_layers(module: str) -> None:
    path = ROOT / module
    parts = Path(module).parts
    layer = parts[1] if len(parts) > 2 else Path(parts[1]).stem
    imported = _imports(path)
    if layer == "launcher":
        assert imported <= LAUNCHER_MAY_IMPORT, f"{module} imports {sorted(imported - LAUNCHER_MAY_IMPORT)}"
        return
    if layer not in LAYER_ORDER:
        return  # habitrun/__init__.py
    allowed = set(LAYER_ORDER[: LAYER_ORDER.index(layer) + 1])
    if layer in ("engine", "cli"):
        allowed.add("launcher")
    assert imported <= allowed, f"{module} ({layer}) imports {sorted(imported - allowed)}"


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
