"""habitrun uses no private attribute (a ``_``-prefixed name) of the standard library or of a dependency,
except inside one adapter module per dependency, whose behaviour a test pins.

A private name can change or vanish in any release (``Annotated.__class_getitem__``
did in 3.13; multiprocessing's fork server gained ``_forkserver_authkey`` in
3.14). Read statically: ``x._name`` where ``_name`` is not one of habitrun's own
attributes (defined on ``self``/``cls``, in a class body, or at a module's top
level anywhere in the package), ``getattr(x, "_name")`` and friends, ``from
mod import _name`` and imports of ``_private`` modules; and at run time: a
habitrun class that defines (as a method, class attribute or ``self._name``) a
private name one of its standard-library or third-party bases already has.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import multiprocessing.forkserver
import pkgutil
import textwrap
import threading
from pathlib import Path

import pytest

import habitrun

ROOT = Path(habitrun.__file__).parent

# One module per dependency may reach into it; each with the test that pins the behaviour it relies on.
ADAPTERS: dict[str, tuple[str, str]] = {
    "store/diskcache_adapter.py": ("diskcache: Cache._con, Cache._transact",
                                   "tests/store/test_diskcache_adapter.py"),
    "engine/dask_backend/jobs.py": ("distributed: SpecCluster._update_worker_status, ._futures, ._correct_state",
                                    "tests/dask/test_slurm.py::test_200_subjects_on_slurm_with_failures_and_a_scancelled_job"),
}

# Underscored, yet documented public API.
PUBLIC = {
    "os._exit": "documented: exit without cleanup handlers, for a child after fork",
}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}  # documented namedtuple methods
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def private(name: str) -> bool:
    """A private name: one leading underscore, not a dunder nor an Enum ``_sunder_`` (documented hooks)."""
    if not name.startswith("_") or name.startswith("__"):
        return False
    return not (len(name) > 2 and name.endswith("_") and not name.endswith("__"))


def own_names(trees: list[ast.Module]) -> set[str]:
    """The private names habitrun defines itself: on self/cls, in class bodies, at module level."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Name):
                            names.add(part.id)
                        elif isinstance(part, ast.Attribute) and _is_own_receiver(part.value):
                            names.add(part.attr)
    return {n for n in names if private(n)}


def _is_own_receiver(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``type(self)``: an attribute set on one of our own objects."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
            and len(node.args) == 1 and _is_own_receiver(node.args[0]))


def violations(source: str, own: set[str]) -> list[str]:
    """Each private access of someone else's in ``source``, as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = None
        if isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own:
            text = ast.unparse(node)
            if text in PUBLIC or node.attr in NAMEDTUPLE_API:
                text = None
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and private(node.args[1].value)
              and node.args[1].value not in own):
            text = ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("habitrun"):
            parts = (node.module or "").split(".")
            if any(private(p) for p in parts) or any(private(a.name) for a in node.names):
                text = ast.unparse(node)
        elif isinstance(node, ast.Import):
            if any(private(p) for a in node.names if not a.name.startswith("habitrun") for p in a.name.split(".")):
                text = ast.unparse(node)
        if text is not None:
            found.append(f"{node.lineno}: {text}")
    return found


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.py"))}


def overrides(cls: type) -> list[str]:
    """Private names ``cls`` defines that a base of the standard library or a dependency already has."""
    # what its source defines (not what a metaclass adds to it, such as ABCMeta's _abc_impl)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except OSError:  # built by a library at import (pydantic's create_model): no source of ours defines it
        return []
    body = tree.body[0].body  # type: ignore[attr-defined]
    mine = own_names([ast.Module(body=body, type_ignores=[])])
    mine |= {n.attr for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and private(n.attr) and _is_own_receiver(n.value)}
    found = []
    for base in cls.__mro__[1:]:
        if base is object or base.__module__.startswith("habitrun"):
            continue
        try:
            theirs = inspect.getsource(base)
        except (OSError, TypeError):
            theirs = ""
        for name in sorted(mine):
            if name in vars(base) or f"self.{name}" in theirs or f"def {name}(" in theirs:
                found.append(f"{cls.__module__}.{cls.__qualname__} defines {base.__module__}.{base.__qualname__}'s {name}")
    return found


def habitrun_classes() -> list[type]:
    classes = []
    for info in pkgutil.walk_packages(habitrun.__path__, "habitrun."):
        relative = info.name.removeprefix("habitrun.").replace(".", "/")
        if f"{relative}.py" in ADAPTERS:
            continue
        module = importlib.import_module(info.name)
        classes += [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__]
    return classes


def test_no_private_access_outside_the_adapters() -> None:
    all_sources = sources()
    own = own_names([ast.parse(s) for s in all_sources.values()])
    found = [f"habitrun/{path}:{v}" for path, source in all_sources.items() if path not in ADAPTERS
             for v in violations(source, own)]
    assert not found, "private names of the standard library or a dependency:\n" + "\n".join(found)


def test_no_class_overrides_a_private_name_of_a_foreign_base() -> None:
    found = [line for cls in habitrun_classes() for line in overrides(cls)]
    assert not found, "\n".join(found)


def test_every_adapter_exists_and_names_its_pinning_test() -> None:
    repo = ROOT.parent
    for module, (what, pinned_by) in ADAPTERS.items():
        assert (ROOT / module).is_file(), module
        test_file, _, test_name = pinned_by.partition("::")
        assert (repo / test_file).is_file(), pinned_by
        assert not test_name or f"def {test_name}(" in (repo / test_file).read_text(), pinned_by
        assert what


# ------------------------------------------------------------- the checks can fail
@pytest.mark.parametrize("snippet", [
    "import atexit\natexit._run_exitfuncs()\n",
    "from multiprocessing import util\nargs = util._args_from_interpreter_flags()\n",
    "from multiprocessing.util import _args_from_interpreter_flags\n",
    "import _posixsubprocess\n",
    "fd = getattr(server, '_forkserver_alive_fd', None)\n",
    "from multiprocessing import forkserver\nforkserver._forkserver.ensure_running()\n",
])
def test_a_private_access_is_found(snippet: str) -> None:
    assert violations(snippet, own=set())


def test_own_and_documented_names_are_not_found() -> None:
    snippet = textwrap.dedent("""
        import os
        class Box:
            def __init__(self):
                self._items = []
            def _add(self, x):
                self._items.append(x)
        def peek(box):
            return box._items, box._add, os._exit, point._replace(x=1)
    """)
    source_own = own_names([ast.parse(snippet)])
    assert source_own == {"_items", "_add"}
    assert violations(snippet, source_own) == []


class _ReachesIn(multiprocessing.forkserver.ForkServer):
    """What spawner.py used to do: a subclass of the stdlib's fork server setting its private state."""

    def start(self) -> None:
        self._forkserver_pid = 1


class _OwnState(threading.Thread):
    def __init__(self) -> None:
        super().__init__()
        self._habitrun_count = 0


def test_an_override_of_a_foreign_private_name_is_found() -> None:
    assert any("_forkserver_pid" in line for line in overrides(_ReachesIn))
    assert overrides(_OwnState) == []
