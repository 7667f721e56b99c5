"""Roots of a study's files (spec/roots.py): which vars are data roots, and paths stored against them."""

from __future__ import annotations

from pathlib import Path

from habitrun.spec.loader import load_recipe
from habitrun.spec.roots import PathRoots, declared_roots


def roots_of(tmp_path: Path, head: str, subjects: str) -> PathRoots:
    (tmp_path / "recipe.yaml").write_text(
        f"habitrun: 1\nname: r\n{head}subjects: {subjects}\nstages:\n  - {{name: a, operator: 'ops:a'}}\n")
    return declared_roots(load_recipe(tmp_path / "recipe.yaml"))


def test_a_var_that_begins_the_template_is_a_data_root_and_others_are_not(tmp_path: Path) -> None:
    roots = roots_of(tmp_path, "vars: {data: /mnt/scans, other: /mnt, bins: 8, name: x}\n",
                     '{from: "${vars.data}/{subject}/ct.nii.gz"}')
    assert roots.study == str(tmp_path)
    assert roots.data == (("data", "/mnt/scans"), ("other", "/mnt"))  # the longest folder first
    assert roots.portable("/mnt/scans/S1/ct.nii.gz") == "${vars.data}/S1/ct.nii.gz"
    assert roots.portable("/mnt/scansX/S1/ct.nii.gz") == "${vars.other}/scansX/S1/ct.nii.gz"
    assert roots.portable(f"{tmp_path}/local/S1.nii") == "local/S1.nii"
    assert roots.portable("/elsewhere/S1.nii") == "/elsewhere/S1.nii"


def test_a_relative_var_and_a_manifest_path_declare_roots_too(tmp_path: Path) -> None:
    roots = roots_of(tmp_path, "vars: {shared: ../shared, m: tables}\n",
                     '{from: "${vars.shared}/{subject}.nii", manifest: "${vars.m}/clinical.csv"}')
    assert dict(roots.data) == {"shared": str(tmp_path.parent / "shared"), "m": str(tmp_path / "tables")}
    assert roots.portable(f"{tmp_path}/../shared/S1.nii") == "${vars.shared}/S1.nii"


def test_stored_paths_resolve_against_today_s_roots() -> None:
    before = PathRoots("/home/a/study", (("data", "/mnt/old"),))
    after = PathRoots("/work/b/copy", (("data", "/archive/new"),))
    for path in ("/mnt/old/S1/ct.nii.gz", "/home/a/study/data/S1/mask.nii.gz"):
        stored = before.portable(path)
        assert not stored.startswith("/")
        moved = after.resolve(stored)
        assert moved in ("/archive/new/S1/ct.nii.gz", "/work/b/copy/data/S1/mask.nii.gz")
    assert after.resolve("/elsewhere/x") == "/elsewhere/x"
    assert after.resolve("${vars.gone}/x") == "${vars.gone}/x"  # a root the recipe no longer declares
    assert after.resolve_cell("data/a.nii; ${vars.data}/b.nii") == "/work/b/copy/data/a.nii;/archive/new/b.nii"
    assert after.resolve_cell("") == "" and after.resolve_cell(None) is None
