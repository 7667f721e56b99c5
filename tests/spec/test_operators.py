"""Operators by import path, from the recipe's folder, and their code fingerprint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from habitrun.errors import RecipeError
from habitrun.spec.operators import operator_fingerprint, resolve_operator, split_import_path


@pytest.fixture
def pkg(tmp_path: Path):
    folder = tmp_path / "study"
    (folder / "uniq_ops_pkg").mkdir(parents=True)
    (folder / "uniq_ops_pkg" / "__init__.py").write_text("")
    (folder / "uniq_ops_pkg" / "mod.py").write_text(
        "def fn(subject, k=1):\n    return k\n\nclass Cls:\n    def __call__(self, s):\n        return 1\n"
        "\nclass Outer:\n    class Inner:\n        pass\n\nVALUE = 3\n"
    )
    yield folder
    for name in [m for m in sys.modules if m.startswith("uniq_ops_pkg")]:
        del sys.modules[name]


def test_split_import_path():
    assert split_import_path("a.b:c") == ("a.b", "c")
    assert split_import_path("a.b.c") == ("a.b", "c")
    assert split_import_path("a.b:C.d") == ("a.b", "C.d")
    for bad in ("abc", ":x", "a:"):
        with pytest.raises(RecipeError):
            split_import_path(bad)


def test_resolves_both_spellings_from_the_recipe_folder(pkg: Path):
    assert resolve_operator("uniq_ops_pkg.mod:fn", [str(pkg)])(None, k=5) == 5
    assert resolve_operator("uniq_ops_pkg.mod.Cls", [str(pkg)]).__name__ == "Cls"
    assert resolve_operator("uniq_ops_pkg.mod:Outer.Inner", [str(pkg)]).__name__ == "Inner"
    assert str(pkg) not in sys.path  # the folder is only on the path while importing


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("uniq_ops_pkg.nope:fn", "no module named 'uniq_ops_pkg.nope'"),
        ("uniq_ops_pkg.mod:missing", "has no attribute 'missing'"),
        ("uniq_ops_pkg.mod:VALUE", "is a value of type int, not a function or class"),
    ],
)
def test_failures_name_the_stage_and_path(pkg: Path, path: str, fragment: str):
    with pytest.raises(RecipeError) as info:
        resolve_operator(path, [str(pkg)], stage="feat")
    assert str(info.value).startswith(f"stage 'feat': operator {path!r}")
    assert fragment in str(info.value)


def test_fingerprint_follows_the_module_source(pkg: Path):
    first = operator_fingerprint("uniq_ops_pkg.mod:fn", [str(pkg)])
    assert first == operator_fingerprint("uniq_ops_pkg.mod:fn", [str(pkg)])
    assert first != operator_fingerprint("uniq_ops_pkg.mod:Cls", [str(pkg)])  # the path is part of it
    (pkg / "uniq_ops_pkg" / "mod.py").write_text("def fn(subject, k=2):\n    return k\n")
    assert operator_fingerprint("uniq_ops_pkg.mod:fn", [str(pkg)]) != first
    assert "uniq_ops_pkg.mod" not in sys.modules  # fingerprinting never imports
