"""``${vars.NAME}`` and ``${env:NAME}`` in a recipe's string values.

Why here and not in YAML: interpolation runs after command-line overrides, so
``vars.data=/scratch`` on the command line reaches every use of it. A string
that is exactly one ``${vars.x}`` takes the variable's own type (a number
stays a number); inside a longer string it is written as text. ``$${`` is a
literal ``${``. Inside a train stage's ``command`` the run-time placeholders
(``${workdir}`` ...) are left for the engine to fill, and so is ``$${`` (the
engine makes it a literal ``${``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from habitrun.spec.yamlpos import Path_

RUNTIME_PLACEHOLDERS = ("workdir", "inputs", "stage_dir", "run_id")
"""Filled by the engine at run time inside a train stage's ``command``."""

_TOKEN = re.compile(r"\$\$\{|\$\{([^{}]*)\}|\$\{")
_ENV = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$", re.S)
_VAR = re.compile(r"^vars((?:\.[A-Za-z0-9_-]+)+)$")

Problem = Callable[[Path_, str], None]


class _Missing:
    pass


_MISSING = _Missing()


class Interpolator:
    """Resolves every string in a recipe's data; problems go to ``report(path, message)``."""

    def __init__(self, data: Mapping[str, Any], report: Problem, environ: Mapping[str, str] | None = None) -> None:
        raw = data.get("vars")
        self.raw_vars = {str(k): v for k, v in raw.items()} if isinstance(raw, dict) else {}
        self.report = report
        self.environ = os.environ if environ is None else environ
        self.resolved_vars: dict[str, Any] = {}
        self.in_progress: list[str] = []

    # -- variables ---------------------------------------------------------
    def var(self, dotted: str, path: Path_) -> Any:
        """Value of ``vars.a.b`` (``dotted`` = ``a.b``); top-level vars resolve lazily."""
        parts = dotted.split(".")
        head = parts[0]
        if head not in self.raw_vars:
            close = difflib.get_close_matches(head, [str(k) for k in self.raw_vars], n=1)
            hint = f" (did you mean 'vars.{close[0]}'?)" if close else ""
            self.report(path, f"unknown variable 'vars.{dotted}'{hint}")
            return _MISSING
        if head not in self.resolved_vars:
            if head in self.in_progress:
                chain = " -> ".join(f"vars.{n}" for n in [*self.in_progress, head])
                self.report(path, f"variables refer to each other in a loop: {chain}")
                return _MISSING
            self.in_progress.append(head)
            try:
                self.resolved_vars[head] = self.walk(self.raw_vars[head], ("vars", head))
            finally:
                self.in_progress.pop()
        value = self.resolved_vars[head]
        for i, part in enumerate(parts[1:], start=1):
            key: Any = part
            if isinstance(value, list) and part.isdigit():
                key = int(part)
                ok = key < len(value)
            else:
                ok = isinstance(value, dict) and part in value
            if not ok:
                self.report(path, f"unknown variable 'vars.{dotted}' ('vars.{'.'.join(parts[:i])}' has no {part!r})")
                return _MISSING
            value = value[key]
        return value

    # -- strings -----------------------------------------------------------
    def string(self, text: str, path: Path_, runtime_ok: bool) -> Any:
        if "${" not in text:
            return text
        whole = _TOKEN.fullmatch(text)
        if whole and whole.group(1) is not None:
            value = self.expression(whole.group(1), path, runtime_ok)
            if value is _MISSING:
                return text
            return value
        pieces: list[str] = []
        last = 0
        for match in _TOKEN.finditer(text):
            pieces.append(text[last:match.start()])
            last = match.end()
            token = match.group(0)
            if token == "$${":
                # Inside a train command the engine still reads placeholders: keep the escape for it.
                pieces.append("$${" if runtime_ok else "${")
                continue
            if match.group(1) is None:
                self.report(path, f"'${{' without a closing '}}' in {text!r} (write '$${{' for a literal '${{')")
                return text
            value = self.expression(match.group(1), path, runtime_ok)
            if value is _MISSING:
                return text
            if isinstance(value, (dict, list)):
                self.report(path, f"'{token}' is a {type(value).__name__} and cannot be part of a longer string")
                return text
            pieces.append(_as_text(value))
        pieces.append(text[last:])
        return "".join(pieces)

    def expression(self, expr: str, path: Path_, runtime_ok: bool) -> Any:
        expr = expr.strip()
        env = _ENV.match(expr)
        if env:
            name, default = env.group(1), env.group(2)
            if name in self.environ:
                return _literal(self.environ[name], runtime_ok)
            if default is not None:
                return _literal(default, runtime_ok)
            self.report(path, f"environment variable {name!r} is not set (write '${{env:{name}:-default}}' for a default)")
            return _MISSING
        var = _VAR.match(expr)
        if var:
            return _literal(self.var(var.group(1)[1:], path), runtime_ok)
        if expr in RUNTIME_PLACEHOLDERS:
            if runtime_ok:
                return "${" + expr + "}"
            self.report(path, f"'${{{expr}}}' is filled at run time only inside a train stage's 'command'")
            return _MISSING
        self.report(path, f"unknown placeholder '${{{expr}}}': write '${{vars.NAME}}' or '${{env:NAME}}'")
        return _MISSING

    # -- data --------------------------------------------------------------
    def walk(self, value: Any, path: Path_, runtime_ok: bool = False) -> Any:
        if isinstance(value, str):
            return self.string(value, path, runtime_ok)
        if isinstance(value, dict):
            return {k: self.walk(v, (*path, k), runtime_ok) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, (*path, i), runtime_ok) for i, v in enumerate(value)]
        return value

    def document(self, data: dict[str, Any]) -> dict[str, Any]:
        """The whole recipe, ``vars`` first so every use sees resolved values."""
        for name in self.raw_vars:
            self.var(str(name), ("vars", name))
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "vars" and isinstance(value, dict):
                out[key] = {k: self.resolved_vars.get(str(k), v) for k, v in value.items()}
            elif key == "stages" and isinstance(value, list):
                out[key] = [self.stage(s, ("stages", i)) for i, s in enumerate(value)]
            else:
                out[key] = self.walk(value, (key,))
        return out

    def stage(self, stage: Any, path: Path_) -> Any:
        if not isinstance(stage, dict):
            return self.walk(stage, path)
        is_train = stage.get("kind") == "train"
        return {
            k: self.walk(v, (*path, k), runtime_ok=is_train and k == "command")
            for k, v in stage.items()
        }


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def _literal(value: Any, runtime_ok: bool) -> Any:
    """A variable's or environment value's text, kept literal where the engine reads placeholders."""
    if runtime_ok and isinstance(value, str):
        return value.replace("${", "$${")
    return value


def escape(text: str, runtime_ok: bool = False) -> str:
    """Inverse of interpolation for a literal string: ``${`` -> ``$${``.

    A train command's strings (``runtime_ok``) are already in the engine's own
    terms (``${workdir}`` a placeholder, ``$${`` a literal ``${``), which
    interpolation reads back unchanged.
    """
    if "${" not in text or runtime_ok:
        return text

    return text.replace("${", "$${")
