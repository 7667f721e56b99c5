"""What changed between two runs: recipe values, code files, packages, data files, habitrun, Python.

Everything compared is in the two run folders: the resolved recipe each ran
(``recipe.yaml``, overrides applied), the overrides and machine in
``provenance.json``, and the environment lock (``environment.json``,
``inputs.tsv``, see :mod:`habitrun.store.environment`). A run older than the
lock has only the first two; the diff says what it could not compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from habitrun.errors import RecipeError, StoreError
from habitrun.spec.yamlpos import load_with_positions
from habitrun.store.environment import read_environment, read_inputs
from habitrun.store.runs import RunFolder

SHOWN_PATHS = 5  # paths named per kind of data change; the counts say the rest
MISSING = "(none)"


@dataclass
class DataChanges:
    """Input files of the two runs by (subject, column, path): counts and the first few paths."""

    compared: int = 0  # files in the newer run
    changed: int = 0
    added: int = 0
    removed: int = 0
    changed_paths: list[str] = field(default_factory=list)
    added_paths: list[str] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)

    def any(self) -> bool:
        return bool(self.changed or self.added or self.removed)


@dataclass
class RunDiff:
    """The differences between run ``a`` (older) and run ``b``; empty lists where nothing changed."""

    run_a: str
    run_b: str
    recipe: list[dict[str, Any]] = field(default_factory=list)  # {path, a, b}
    overrides: dict[str, list[str]] | None = None  # {a: [...], b: [...]} when they differ
    code: list[dict[str, Any]] = field(default_factory=list)  # {file, change, stages}
    packages: list[dict[str, Any]] = field(default_factory=list)  # {name, a, b, stages}
    data: DataChanges = field(default_factory=DataChanges)
    habitrun: dict[str, Any] | None = None  # {a, b}
    python: dict[str, Any] | None = None  # {a, b}
    platform: dict[str, Any] | None = None  # {a, b}
    git: dict[str, Any] | None = None  # {a, b}: the commits
    not_compared: list[str] = field(default_factory=list)  # what a run without a lock could not say

    def same(self) -> bool:
        """Nothing differs that the diff compares."""
        return not (self.recipe or self.overrides or self.code or self.packages or self.data.any()
                    or self.habitrun or self.python or self.platform or self.git)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "same": self.same()}


def diff_runs(a: RunFolder, b: RunFolder) -> RunDiff:
    """Compare run ``a`` with run ``b`` (see the module docstring)."""
    out = RunDiff(a.run_id, b.run_id)
    out.recipe = _recipe_changes(_recipe(a), _recipe(b))
    prov_a, prov_b = a.read_provenance(), b.read_provenance()
    over_a, over_b = list(prov_a.get("overrides") or []), list(prov_b.get("overrides") or [])
    if over_a != over_b:
        out.overrides = {"a": over_a, "b": over_b}
    env_a, env_b = read_environment(a.path), read_environment(b.path)
    for run, env in ((a, env_a), (b, env_b)):
        if env is None:
            out.not_compared.append(f"run {run.run_id} has no environment lock (written before habitrun kept "
                                    "one): code files, packages and data files not compared")
    out.habitrun = _pair(prov_a.get("habitrun"), prov_b.get("habitrun"))
    out.python = _pair(_python(prov_a, env_a), _python(prov_b, env_b))
    out.platform = _pair(prov_a.get("platform"), prov_b.get("platform"))
    out.git = _pair((prov_a.get("git") or {}).get("commit"), (prov_b.get("git") or {}).get("commit"))
    if env_a is not None and env_b is not None:
        out.code = _code_changes(env_a.get("stages") or {}, env_b.get("stages") or {})
        out.packages = _package_changes(env_a, env_b)
        if env_a.get("git", {}).get("dirty_files") != env_b.get("git", {}).get("dirty_files"):
            out.git = out.git or {"a": (prov_a.get("git") or {}).get("commit"),
                                  "b": (prov_b.get("git") or {}).get("commit")}
            out.git["dirty_files"] = {"a": env_a["git"].get("dirty_files"), "b": env_b["git"].get("dirty_files")}
        inputs_a, inputs_b = read_inputs(a.path), read_inputs(b.path)
        if inputs_a is not None and inputs_b is not None:
            out.data = _data_changes(inputs_a, inputs_b)
    return out


def _pair(a: Any, b: Any) -> dict[str, Any] | None:
    return None if a == b else {"a": a, "b": b}


def _python(prov: Mapping[str, Any], env: Mapping[str, Any] | None) -> str | None:
    if env is not None and isinstance(env.get("python"), dict):
        py = env["python"]
        return f"{py.get('implementation', '')} {py.get('version', '')}".strip()
    return prov.get("python")


def _recipe(run: RunFolder) -> Any:
    try:
        text = run.recipe_file.read_text(encoding="utf-8")
        data, _ = load_with_positions(text, str(run.recipe_file))
    except (OSError, RecipeError) as exc:
        raise StoreError(f"{run.recipe_file} cannot be read ({exc}); the run folder is damaged") from None
    return data


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Dotted paths -> leaf values; stages by name (``stages.features.params.bins``), other lists whole."""
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif prefix == "stages" and isinstance(value, list) and all(isinstance(s, dict) and "name" in s for s in value):
        out["stages (order)"] = [s["name"] for s in value]
        for stage in value:
            _flatten({k: v for k, v in stage.items() if k != "name"}, f"stages.{stage['name']}", out)
    else:
        out[prefix] = value


def _recipe_changes(a: Any, b: Any) -> list[dict[str, Any]]:
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    changes = []
    for path in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(path, MISSING), flat_b.get(path, MISSING)
        if va != vb:
            changes.append({"path": path, "a": va, "b": vb})
    return changes


def _code_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Study files whose digest differs (or that only one run's code had), with the stages using them;
    a stage whose code digest changed without a study file (an installed operator, a command) by name."""
    files: dict[str, dict[str, Any]] = {}
    for stage in sorted(set(a) | set(b)):
        fa = (a.get(stage) or {}).get("files") or {}
        fb = (b.get(stage) or {}).get("files") or {}
        for name in set(fa) | set(fb):
            if fa.get(name) == fb.get(name):
                continue
            change = "changed" if name in fa and name in fb else ("added" if name in fb else "no longer used")
            entry = files.setdefault(name, {"file": name, "change": change, "stages": []})
            entry["stages"].append(stage)
        code_a, code_b = (a.get(stage) or {}).get("code"), (b.get(stage) or {}).get("code")
        if code_a != code_b and not fa and not fb:
            files.setdefault(f"stage {stage}", {"file": f"stage {stage}", "change": "code changed",
                                                "stages": [stage]})
    return [files[k] for k in sorted(files)]


def _package_changes(env_a: Mapping[str, Any], env_b: Mapping[str, Any]) -> list[dict[str, Any]]:
    da, db = env_a.get("distributions") or {}, env_b.get("distributions") or {}
    users: dict[str, set[str]] = {}
    for env in (env_a, env_b):
        for stage, info in (env.get("stages") or {}).items():
            for name in (info or {}).get("packages") or {}:
                users.setdefault(name.lower(), set()).add(stage)
    out = []
    for name in sorted(set(da) | set(db), key=str.lower):
        va, vb = da.get(name), db.get(name)
        if va != vb:
            out.append({"name": name, "a": va, "b": vb, "stages": sorted(users.get(name.lower(), ()))})
    return out


def _data_changes(a: Mapping[tuple[str, str, str], str], b: Mapping[tuple[str, str, str], str]) -> DataChanges:
    out = DataChanges(compared=len(b))
    for key in b:
        if key not in a:
            out.added += 1
            if len(out.added_paths) < SHOWN_PATHS:
                out.added_paths.append(key[2])
        elif a[key] != b[key]:
            out.changed += 1
            if len(out.changed_paths) < SHOWN_PATHS:
                out.changed_paths.append(key[2])
    for key in a:
        if key not in b:
            out.removed += 1
            if len(out.removed_paths) < SHOWN_PATHS:
                out.removed_paths.append(key[2])
    return out
