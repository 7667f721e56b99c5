"""docs/architecture.md lists every module of habitrun/, and names none that does not exist.

Print the index to paste after the module-index marker: ``python -m tests.test_architecture_doc``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "habitrun"
TEMPLATES = PACKAGE / "cli" / "templates"  # a study copied by `habitrun init`, not habitrun's code


def modules() -> list[Path]:
    """Every module of habitrun/ but package markers and the study template."""
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name != "__init__.py" and TEMPLATES not in p.parents)


def module_index() -> str:
    """The doc's module index: a table per package, each module with its docstring's first line."""
    by_package: dict[str, list[Path]] = {}
    for path in modules():
        by_package.setdefault(path.parent.relative_to(ROOT).as_posix(), []).append(path)
    parts = []
    for package, paths in by_package.items():
        rows = [f"### `{package}`", "", "| module | concern |", "|---|---|"]
        for path in paths:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = doc.strip().splitlines()[0] if doc.strip() else ""
            rows.append(f"| `{path.name}` | {first.replace('|', '/')} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


def test_every_module_is_in_the_index_with_its_concern():
    text = DOC.read_text()
    expected = module_index()
    assert expected in text, ("docs/architecture.md's module index is out of date: paste the output of "
                              "`python -m tests.test_architecture_doc` after its `<!-- module index -->` line")


def test_every_module_path_the_doc_names_exists():
    named = set(re.findall(r"`((?:habitrun/)?[a-z_]+(?:/[a-z_]+)*\.py)", DOC.read_text()))
    known = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")}
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py")}  # named as given
    tails = {k.split("/", 1)[1] for k in known} | {"/".join(k.split("/")[-2:]) for k in known}
    tails |= {k.rsplit("/", 1)[-1] for k in known}
    missing = sorted(n for n in named if n not in known and n not in tails and n not in tests)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


if __name__ == "__main__":
    print(module_index(), end="")
