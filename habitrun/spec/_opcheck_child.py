"""The child side of :mod:`habitrun.spec.opcheck`: import each operator, check its params.

Run as ``python -m habitrun.spec._opcheck_child``. It reads one JSON request
from stdin, then writes JSON lines to the fd that was its stdout: ``{"start": i}``
before importing target ``i`` (so a parent whose child dies or hangs knows
which import did it), ``{"done": i, "problems": [...]}`` after, ``{"end": true}``
last. Whatever the imported modules print goes to stderr, never into the replies.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import os
import re
import signal
import sys
from typing import Any

from habitrun.errors import RecipeError
from habitrun.spec.operators import importable, resolve_operator
from habitrun.spec.paramtypes import check_types

Problem = dict[str, Any]  # {"at": field path below the stage or None, "key": bool, "message": str}


def _subject_slot(sig: inspect.Signature) -> str | None:
    """The parameter a function operator receives the subject (or the results) in."""
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return p.name
        if p.kind is p.VAR_POSITIONAL:
            return None
    return None


def signature(obj: Any) -> inspect.Signature:
    """``obj``'s signature without evaluating its annotations where Python evaluates them lazily (3.14+).

    Only names, kinds and defaults are checked; on 3.14 (PEP 649) an annotation naming
    something imported under ``TYPE_CHECKING`` would otherwise raise NameError here,
    though the module imported fine.
    """
    try:
        import annotationlib  # type: ignore[import-not-found,unused-ignore]  # Python 3.14+
    except ImportError:
        return inspect.signature(obj)
    return inspect.signature(obj, annotation_format=annotationlib.Format.FORWARDREF)  # type: ignore[call-arg,unused-ignore]


def check_params(obj: Any, target: str, params: dict[str, Any], stage: str) -> list[Problem]:
    """Problems of calling ``obj`` with ``params``: a class as ``Cls(**params)``, a function as ``fn(subject, **params)``.

    Names first (unknown, missing), then each value against its parameter's annotation
    (:mod:`habitrun.spec.paramtypes`)."""
    try:
        sig = signature(obj)
    except (TypeError, ValueError):  # a builtin or extension without a signature: nothing to check
        return []
    accepts = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepts.values()):
        named_ok: set[str] | None = None  # **kwargs takes any name
    else:
        named_ok = {n for n, p in accepts.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    slot = None if isinstance(obj, type) else _subject_slot(sig)
    what = f"stage {stage!r}: operator {target!r}"
    problems: list[Problem] = []
    if named_ok is not None:
        named_ok.discard(slot or "")
        for name in params:
            if name in named_ok:
                continue
            close = difflib.get_close_matches(str(name), sorted(named_ok), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; it takes {', '.join(repr(n) for n in sorted(named_ok))}" if named_ok else "; it takes no params")
            problems.append({"at": ["params", name], "key": True,
                             "message": f"{what} has no parameter {name!r}{hint}"})
    for name, p in accepts.items():
        if name == slot or p.default is not p.empty or name in params:
            continue
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            problems.append({"at": ["params"], "key": True,
                             "message": f"{what} needs parameter {name!r}; add it under params"})
    return problems + check_types(obj, sig, params, slot, what)


def check_one(item: dict[str, Any], search_path: list[str]) -> list[Problem]:
    target, stage = item["target"], item["stage"]
    try:
        obj = resolve_operator(target, search_path, stage=stage)
    except RecipeError as exc:
        return [{"at": None, "key": False, "message": p} for p in exc.problems]
    except SystemExit as exc:
        return [{"at": None, "key": False,
                 "message": f"stage {stage!r}: operator {target!r}: importing it called sys.exit({exc.code!r})"}]
    if item.get("params") is None:
        return []
    return check_params(obj, target, item["params"], stage)


_NAMED = re.compile(r"""^\s*-?\s*(?:operator|entrypoint)\s*:\s*["']?([A-Za-z_][\w.]*)(?::|["']?\s*$)""", re.M)
_INLINE = re.compile(r"""[{,]\s*(?:operator|entrypoint)\s*:\s*["']?([A-Za-z_][\w.]*):""")


def warm_modules(text: str) -> list[str]:
    """Modules a recipe's text names as operators or entrypoints (a guess: the request decides)."""
    found: list[str] = []
    for match in (*_NAMED.finditer(text), *_INLINE.finditer(text)):
        path = match.group(1)
        module = path if ":" in match.group(0).split(path, 1)[1][:1] else path.rpartition(".")[0]
        if module and module not in found:
            found.append(module)
    return found


def warm(recipe: str, sys_path: list[str], replies: Any) -> None:
    """Import what the recipe seems to use before the request comes; every error is left for the check."""
    sys.path[:] = sys_path
    try:
        with open(recipe, encoding="utf-8") as f:
            modules = warm_modules(f.read())
    except (OSError, UnicodeDecodeError):
        return
    with importable([os.path.dirname(os.path.abspath(recipe))]):
        for module in modules:
            replies.write(json.dumps({"warm": module}) + "\n")
            replies.flush()
            try:
                importlib.import_module(module)
            except BaseException:  # noqa: BLE001, S110 - the check imports it again and reports
                pass


def _die_with_parent() -> None:
    """SIGKILL this child when the runner dies (Linux), so a killed runner leaves no hung import behind."""
    parent = int(os.environ.get("HABITRUN_OPCHECK_PARENT", "0"))
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent > 0 and os.getppid() != parent:
        os._exit(0)  # it is gone already


def main() -> None:
    _die_with_parent()
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what an operator module prints at import goes to stderr
    sys.stdout = sys.stderr
    if len(sys.argv) == 5 and sys.argv[1] == "--warm":
        warm(sys.argv[2], json.loads(sys.argv[4]), replies)
    text = sys.stdin.read()
    if not text:
        os._exit(0)  # started early, then not needed
    request = json.loads(text)
    sys.path[:] = request["sys_path"]
    for i, item in enumerate(request["checks"]):
        replies.write(json.dumps({"start": i}) + "\n")
        replies.flush()
        problems = check_one(item, request["search_path"])
        replies.write(json.dumps({"done": i, "problems": problems}) + "\n")
        replies.flush()
    replies.write('{"end": true}\n')
    replies.flush()
    os._exit(0)  # no atexit of the user's modules, no non-daemon thread they started keeps us alive


if __name__ == "__main__":
    main()
