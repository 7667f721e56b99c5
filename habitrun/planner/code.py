"""What a stage's code is: its module and every study module it imports, and the packages they use.

The operator's (or train entrypoint's) module is read with ``ast``, never
imported; so is every module of the study it imports, transitively: a module
is the study's when its file is under the recipe's folder (the search path),
found the way ``import`` would find it there. Each module counts by its
normalised syntax tree (:func:`tree_text`: positions and docstrings left out),
so comments, docstrings, blank lines and formatting do not change a key and
any other edit does.

The tree's text is our own walk over ``ast.iter_fields``, not ``ast.dump``:
``ast.dump`` changed between Python 3.11 and 3.12/3.13 (new fields such as
``type_params``, empty defaults left out), so a colleague on another Python
would have seen every stage stale. The walk leaves out every field that is
None or an empty list, and writes an f-string's literal parts merged, as each
version from 3.10 to 3.13 parses the same source. Digests of the ``ast.dump``
form (before issue 31) are still computed (``CodeInfo.legacy``) so that a
store written then is found (see ``StageInputs.legacy_fingerprints``).

Imports of other modules are sorted out: the standard library is ignored,
anything else is a third-party package whose installed distribution and
version are looked up (``importlib.metadata``). A dynamic import
(``importlib.import_module(name)``) is not followed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata as metadata
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from habitrun.spec.operators import split_import_path

_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)


@dataclass(frozen=True)
class CodeInfo:
    """A stage's code: one fingerprint, the digest of each study module, the packages used."""

    fingerprint: str
    modules: dict[str, str] = field(default_factory=dict)  # path under the root -> 12-hex digest
    packages: dict[str, str] = field(default_factory=dict)  # distribution -> version
    legacy: str | None = None  # the fingerprint before issue 31 (``ast.dump`` of this Python)


@dataclass
class _Module:
    digest: str
    imports: list[tuple[str, tuple[str, ...]]]  # (module, names imported from it)
    legacy: str = ""  # the digest of ``ast.dump`` (before issue 31)


_parsed: dict[str, tuple[tuple[int, int, int], _Module]] = {}  # file -> (its stat, parsed): a parse per edit


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:]


def _merged_strings(values: list[ast.expr]) -> list[ast.expr]:
    """An f-string's parts with adjacent literal parts joined and empty ones dropped: Python
    3.12 splits and keeps them differently from 3.11 for one source."""
    out: list[ast.expr] = []
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not value.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(out[-1].value + value.value)
                continue
        out.append(value)
    return out


def _write(node: object, out: list[str]) -> None:
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name, value in ast.iter_fields(node):
            if value is None or (isinstance(value, list) and not value):
                continue  # a field a newer Python added, at its default (or an empty one)
            if name == "values" and isinstance(node, ast.JoinedStr):
                value = _merged_strings(value)
            out.append(name)
            out.append("=")
            _write(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _write(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def tree_text(tree: ast.AST) -> str:
    """A syntax tree as text, the same on every Python from 3.10 to 3.13 for one source
    (positions are attributes, not fields: they are left out)."""
    out: list[str] = []
    _write(tree, out)
    return "".join(out)


def _imports(tree: ast.AST, package: str) -> list[tuple[str, tuple[str, ...]]]:
    """(absolute module, names) for every import statement anywhere in the module."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                keep = len(parts) - (node.level - 1)
                if keep < 0:
                    continue
                prefix = ".".join(parts[:keep])
                base = f"{prefix}.{base}" if prefix and base else prefix or base
            if base:
                out.append((base, tuple(alias.name for alias in node.names if alias.name != "*")))
    return out


def _parse(path: str, module: str, is_package: bool) -> _Module:
    st = os.stat(path)
    sig = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    cached = _parsed.get(path)
    if cached is not None and cached[0] == sig:
        return cached[1]
    raw = Path(path).read_bytes()
    try:
        tree = ast.parse(raw, filename=path)
    except (SyntaxError, ValueError):
        parsed = _Module("b" + hashlib.blake2b(raw, digest_size=16).hexdigest(), [])
        parsed.legacy = parsed.digest
    else:
        package = module if is_package else module.rpartition(".")[0]
        imports = _imports(tree, package)
        _strip_docstrings(tree)
        old = ast.dump(tree, annotate_fields=False, include_attributes=False)
        parsed = _Module(hashlib.blake2b(tree_text(tree).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest(),
                         imports, hashlib.blake2b(old.encode(), digest_size=16).hexdigest())
    _parsed[path] = (sig, parsed)
    return parsed


def _find_local(module: str, roots: Sequence[str]) -> tuple[str, str, bool] | None:
    """(root, file, is_package) of a study module, or None when it is not under a root."""
    rel = module.replace(".", os.sep)
    for root in roots:
        base = os.path.join(root, rel)
        if os.path.isfile(base + ".py"):
            return root, base + ".py", False
        init = os.path.join(base, "__init__.py")
        if os.path.isfile(init):
            return root, init, True
        if os.path.isdir(base) and os.path.isdir(os.path.join(root, module.split(".")[0])):
            return root, "", True  # a namespace package of the study: no file of its own
    return None


def study_modules(module: str, roots: Sequence[str],
                  legacy: dict[str, str] | None = None) -> tuple[dict[str, str], set[str]]:
    """(file relative to its root -> digest) of ``module`` and every study module it imports,
    transitively, and the top-level names of the other (non-stdlib) modules they import;
    ``legacy`` (when given) is filled with each file's digest before issue 31."""
    files: dict[str, str] = {}
    external: set[str] = set()
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _find_local(name, roots)
        if found is None:
            top = name.split(".")[0]
            if top not in _STDLIB and top not in ("__future__",):
                external.add(top)
            continue
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        root, path, is_package = found
        if not path:
            continue
        parsed = _parse(path, name, is_package)
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        files[rel] = parsed.digest
        if legacy is not None:
            legacy[rel] = parsed.legacy
        for target, names in parsed.imports:
            todo.append(target)
            for item in names:
                sub = f"{target}.{item}"
                if _find_local(sub, roots) is not None:
                    todo.append(sub)
    return files, external


def _name_version(dist: metadata.Distribution) -> tuple[str, str]:
    """(Name, Version) from one parse of METADATA (``dist.version`` would parse it again)."""
    meta = dist.metadata
    return meta["Name"], meta["Version"]


class _Distributions:
    """Top-level import name -> installed distribution, looked up only for the names asked about."""

    def __init__(self) -> None:
        self._top_level: dict[str, str] | None = None
        self._without: list[metadata.Distribution] = []
        self._records: dict[int, str] = {}

    def version_of(self, top: str) -> tuple[str, str] | None:
        try:
            dist = metadata.distribution(top)  # the usual case: numpy, torch, nibabel, SimpleITK
            name, version = _name_version(dist)
            return name or top, version
        except metadata.PackageNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - broken metadata of an unrelated package
            return None
        provider = self._providing(top)
        if provider is None:
            return None
        try:
            return _name_version(provider)
        except Exception:  # noqa: BLE001
            return None

    def _providing(self, top: str) -> metadata.Distribution | None:
        """The distribution whose top_level.txt names ``top``, or whose RECORD has ``top/`` or
        ``top.py`` (a text search: parsing the RECORD of torch takes seconds)."""
        if self._top_level is None:
            self._top_level = {}
            for dist in metadata.distributions():
                text = dist.read_text("top_level.txt")
                if text:
                    for line in text.split():
                        self._top_level.setdefault(line.strip(), dist)  # type: ignore[arg-type]
                else:
                    self._without.append(dist)
        found = self._top_level.get(top)
        if found is not None:
            return found  # type: ignore[return-value]
        pattern = re.compile(rf"\n{re.escape(top)}(/|\.py,|\.[^/\n]*\.(so|pyd),)")
        for i, dist in enumerate(self._without):
            record = self._records.get(i)
            if record is None:
                record = "\n" + (dist.read_text("RECORD") or "")
                self._records[i] = record
            if pattern.search(record):
                return dist
        return None


_DISTRIBUTIONS: dict[tuple[str, ...], _Distributions] = {}  # per sys.path: one lookup per process


def package_versions(tops: set[str]) -> dict[str, str]:
    """distribution -> version for the installed distributions providing these top-level names."""
    dists = _DISTRIBUTIONS.setdefault(tuple(sys.path), _Distributions())
    out: dict[str, str] = {}
    for top in sorted(tops):
        found = dists.version_of(top)
        if found is not None:
            out[found[0]] = found[1]
    return out


def code_info(target: str, roots: Sequence[str], *, code_version: str | None = None) -> CodeInfo:
    """The code of an operator or entrypoint (``module:attr``) under the study's ``roots``."""
    module, _ = split_import_path(target)
    old: dict[str, str] = {}
    files, external = study_modules(module, roots, old)
    packages = package_versions(external)
    if code_version is not None:
        return CodeInfo("version:" + code_version, {}, packages)
    if not files:  # an installed module: its own package version says what it is
        top = module.split(".")[0]
        packages = {**packages, **package_versions({top})}
        text = target + "\x00" + "".join(f"{k}={v}\x00" for k, v in sorted(packages.items()))
        return CodeInfo("installed:" + hashlib.sha256(text.encode()).hexdigest(), {}, packages)
    return CodeInfo("tree:" + _files_digest(target, files), {k: v[:12] for k, v in files.items()}, packages,
                    legacy="ast:" + _files_digest(target, old))


def _files_digest(target: str, files: dict[str, str]) -> str:
    text = target + "\x00" + "".join(f"{k}={v}\x00" for k, v in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()
