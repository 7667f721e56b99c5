"""Placeholders in a command stage's argv and env: ``{subject}``, ``{params.bins}``, ``{convert.nifti}``.

One parser for the recipe check (a misspelled or unknown name is exit 2 at its
line) and for the substitution in the worker, so both read a template alike.
``{{`` and ``}}`` are a literal brace. A name is one of:

* ``subject`` (or ``id``), ``workdir``, ``threads``: the subject's id, its work
  folder, the worker's thread budget;
* ``params.NAME`` or a bare ``NAME`` that is a param: the stage's params;
* ``fields.NAME`` or a bare ``NAME``: a manifest column (a file column as an absolute path);
* ``STAGE.NAME`` (a stage in ``needs``): that stage's result for the subject, one key of it.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from habitrun.spec.recipe import StageSpec

BUILTINS = ("subject", "id", "workdir", "threads")
_formatter = string.Formatter()

Piece = tuple[str, "str | None"]  # literal text, then a placeholder's name (None: none follows)


def parse(template: str) -> list[Piece]:
    """The template's literal text and placeholder names, in order; ValueError for a bad one."""
    out: list[Piece] = []
    for literal, name, spec, conversion in _formatter.parse(template):
        if name is not None:
            if not name.strip() or spec or conversion:
                raise ValueError(f"{template!r}: a placeholder is a name in braces ({{subject}}, "
                                 "{params.NAME}, {STAGE.OUTPUT}); write {{ and }} for a literal brace")
        out.append((literal, name))
    return out


def names(template: str) -> list[str]:
    """The placeholder names in ``template`` (ValueError for a bad template)."""
    return [name for _, name in parse(template) if name is not None]


def tool_word(stage: StageSpec) -> str:
    """The tool a command stage runs: its first item, or with ``shell`` the first word of it."""
    first = (stage.command or ("",))[0]
    if not stage.shell:
        return first
    try:
        words = shlex.split(first)
    except ValueError:
        words = first.split()
    return words[0] if words else ""


def _name_problem(name: str, stage: StageSpec) -> str | None:
    head, dot, rest = name.partition(".")
    if not dot:
        return None  # a builtin, a param or a manifest column: columns are checked with the manifest
    if head == "params":
        return None if rest in stage.params else f"{{{name}}}: the stage has no param {rest!r}"
    if head == "fields":
        return None
    if head in stage.needs:
        return None
    return (f"{{{name}}}: {head!r} is not a stage this stage needs (needs: {', '.join(stage.needs) or 'none'}),"
            " nor 'params' or 'fields'")


def command_problems(stage: StageSpec) -> list[tuple[tuple[Any, ...], str]]:
    """What is wrong with a command map stage's templates, each at its field path."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    templates: list[tuple[tuple[Any, ...], str]] = [(("command", i), t) for i, t in enumerate(stage.command or ())]
    templates += [(("env", k), v) for k, v in (stage.env or {}).items()]
    for where, template in templates:
        try:
            found = names(template)
        except ValueError as exc:
            problems.append((where, str(exc)))
            continue
        if where == ("command", 0) and "{" in tool_word(stage):
            problems.append((where, "the tool (the command's first word) cannot hold a placeholder: "
                                    "habitrun finds it and puts its version in the key before running"))
        problems += [(where, p) for p in (_name_problem(n, stage) for n in found) if p]
    if stage.version is not None and stage.container is not None:
        problems.append((("version",), "with a container the image's identity is the tool's: "
                                       "leave 'version' out (a new image reruns the stage)"))
    for i, item in enumerate(stage.version or ()):
        if "{" in item or "}" in item:
            problems.append((("version", i), "the version command takes no placeholders"))
    for name, pattern in (stage.outputs or {}).items():
        for j, one in enumerate((pattern,) if isinstance(pattern, str) else pattern):
            if not one or one.startswith("/") or ".." in one.split("/"):
                where = ("outputs", name) if isinstance(pattern, str) else ("outputs", name, j)
                problems.append((where, f"output {name!r}: {one!r} must be a path inside the work folder"))
        if not isinstance(pattern, str) and not pattern:
            problems.append((("outputs", name), f"output {name!r}: an empty list of globs"))
    return problems


def substitute(template: str, lookup: Callable[[str], Any], quote: Callable[[str], str] | None = None) -> str | list[str]:
    """The template with each placeholder replaced by ``lookup(name)`` as text (``quote``d when
    given). A template that is one placeholder whose value is a list gives a list (several argv
    items); a list inside other text is an error (ValueError)."""
    pieces = parse(template)
    if len(pieces) == 1 and pieces[0][0] == "" and pieces[0][1] is not None:
        value = lookup(pieces[0][1])
        if isinstance(value, (list, tuple)):
            return [quote(str(v)) if quote else str(v) for v in value]
    out = []
    for literal, name in pieces:
        out.append(literal)
        if name is not None:
            value = lookup(name)
            if isinstance(value, (list, tuple)):
                raise ValueError(f"{{{name}}} is a list ({len(value)} items): it can only stand alone as "
                                 "an argument, where it becomes one argument per item")
            out.append(quote(str(value)) if quote else str(value))
    return "".join(out)
