"""Code fingerprints: the operator's module and the study modules it imports, by syntax tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.planner.code import code_info


@pytest.fixture
def study(tmp_path: Path) -> Path:
    pkg = tmp_path / "ops"
    (pkg / "deep").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "deep" / "__init__.py").write_text("")
    (pkg / "main.py").write_text(
        "import json\nimport os.path\nimport yaml\nfrom . import helper\nfrom .deep.core import weight\n\n"
        "def op(subject):\n    return helper.twice(weight(1)) + len(json.dumps({}))\n"
    )
    (pkg / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    (pkg / "deep" / "core.py").write_text("def weight(n):\n    return n\n")
    (pkg / "unused.py").write_text("X = 1\n")
    return tmp_path


def fp(root: Path) -> str:
    return code_info("ops.main:op", [str(root)]).fingerprint


def test_the_fingerprint_covers_every_study_module_imported_and_no_other(study: Path) -> None:
    info = code_info("ops.main:op", [str(study)])
    assert set(info.modules) == {"ops/__init__.py", "ops/main.py", "ops/helper.py", "ops/deep/__init__.py",
                                 "ops/deep/core.py"}
    assert set(info.packages) == {"PyYAML"}  # json and os are the standard library
    before = info.fingerprint
    (study / "ops" / "unused.py").write_text("X = 2\n")
    assert fp(study) == before
    (study / "ops" / "deep" / "core.py").write_text("def weight(n):\n    return n + 1\n")
    assert fp(study) != before


def test_comments_docstrings_and_layout_do_not_count(study: Path) -> None:
    before = fp(study)
    (study / "ops" / "helper.py").write_text(
        '"""Helpers."""\n# twice\n\n\ndef twice(x):\n    """Two times x."""\n\n    return 2 * x  # ok\n'
    )
    assert fp(study) == before
    (study / "ops" / "helper.py").write_text("def twice(x):\n    return x * 2\n")
    assert fp(study) != before


def test_code_version_replaces_the_automatic_fingerprint(study: Path) -> None:
    pinned = code_info("ops.main:op", [str(study)], code_version="7").fingerprint
    (study / "ops" / "helper.py").write_text("def twice(x):\n    return 3 * x\n")
    assert code_info("ops.main:op", [str(study)], code_version="7").fingerprint == pinned
    assert code_info("ops.main:op", [str(study)], code_version="8").fingerprint != pinned


def test_a_module_that_does_not_parse_counts_by_its_bytes(study: Path) -> None:
    (study / "ops" / "helper.py").write_text("def twice(x:\n")
    first = fp(study)
    (study / "ops" / "helper.py").write_text("def twice(x:\n  # still broken\n")
    assert fp(study) != first


def test_an_installed_operator_counts_by_its_package_version(tmp_path: Path) -> None:
    info = code_info("yaml:safe_load", [str(tmp_path)])
    assert info.fingerprint.startswith("installed:") and "PyYAML" in info.packages
