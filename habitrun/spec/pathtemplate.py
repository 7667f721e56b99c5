"""Path templates with named fields: ``data/{subject}/{modality}.nii.gz``.

Why per folder level: a field matches inside one file or folder name and
never crosses ``/`` (Snakemake's ``{x}`` is ``.+`` by default and does), and a
walk can start at the template's literal prefix and stop at its depth instead
of listing a whole tree. Each level with a field gets one compiled regex;
a level without one is a plain name looked up directly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PATTERN = "[^/]+"
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A template (or a field's regex) that cannot be used; the message says why."""


@dataclass(frozen=True)
class Segment:
    """One folder or file name of a template."""

    text: str
    """As written (``sub-{subject}_{suffix}.nii.gz``)."""
    literal: str | None
    """The name itself when it has no field."""
    fields: tuple[str, ...]
    """Fields in the order they first appear in this name."""
    regex: re.Pattern[str] | None
    """Full-match pattern with one named group per field (first occurrence)."""
    repeated: tuple[str, ...]
    """Fields of this name already bound by an earlier level: their values must agree."""
    parts: tuple[tuple[bool, str], ...]
    """(is_field, text) pieces, to build a pattern with bound values as literals."""
    show_hidden: bool
    """Only a name written with a leading '.' matches hidden entries."""
    may_be_empty: bool = False
    """A field's regex matches '' (such a match is skipped: a field is never empty)."""

    def bound_regex(self, values: Mapping[str, str], patterns: Mapping[str, str]) -> re.Pattern[str]:
        """This name's pattern with the already bound fields written as their values."""
        return re.compile(_pattern(self.parts, patterns, values))


@dataclass(frozen=True)
class Template:
    """A parsed path template."""

    text: str
    base: tuple[str, ...]
    """Leading names without a field: the walk starts in this folder."""
    absolute: bool
    segments: tuple[Segment, ...]
    """From the first name with a field to the file name."""
    fields: tuple[str, ...]

    def base_text(self) -> str:
        """The literal prefix as written (``data/``, ``/mnt/x/``, or '' for none)."""
        head = "/" if self.absolute else ""
        return head + "".join(f"{name}/" for name in self.base)


def _pattern(parts: tuple[tuple[bool, str], ...], patterns: Mapping[str, str],
             bound: Mapping[str, str] | None = None) -> str:
    out: list[str] = []
    named: set[str] = set()
    for is_field, text in parts:
        if not is_field:
            out.append(re.escape(text))
        elif bound is not None and text in bound:
            out.append(re.escape(bound[text]))
        elif text in named:
            out.append(f"(?P={text})")
        else:
            named.add(text)
            out.append(f"(?P<{text}>(?:{patterns.get(text, DEFAULT_PATTERN)}))")
    return "".join(out)


def _split(name: str) -> tuple[tuple[bool, str], ...]:
    parts: list[tuple[bool, str]] = []
    pos = 0
    for m in _TOKEN.finditer(name):
        if m.start() > pos:
            parts.append((False, name[pos:m.start()]))
        token = m.group(0)
        if token in ("{{", "}}"):
            parts.append((False, token[0]))
        elif m.group(1) is None:
            raise TemplateError(f"unbalanced {token!r} in {name!r} (write {token * 2} for a literal brace)")
        else:
            field = m.group(1).strip()
            if not FIELD_NAME.fullmatch(field):
                shown = "{" + m.group(1) + "}"
                raise TemplateError(f"{shown} is not a field name (letters, digits and '_', e.g. {{subject}})")
            parts.append((True, field))
        pos = m.end()
    if pos < len(name):
        parts.append((False, name[pos:]))
    merged: list[tuple[bool, str]] = []
    for part in parts:  # "{{" gives its own literal piece: join neighbours
        if merged and not part[0] and not merged[-1][0]:
            merged[-1] = (False, merged[-1][1] + part[1])
        else:
            merged.append(part)
    return tuple(merged)


def check_pattern(field: str, pattern: str) -> None:
    """Raise TemplateError when ``pattern`` is not a usable regex for ``field``."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise TemplateError(f"field {field!r}: {pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.groupindex:
        raise TemplateError(f"field {field!r}: use (?:...) instead of named groups in {pattern!r}")


def parse_template(text: str, patterns: Mapping[str, str] | None = None) -> Template:
    """Parse ``text``; raise TemplateError for a template habitrun cannot walk.

    ``patterns`` maps a field to its regex (default ``[^/]+``); a field's
    value is one file or folder name or part of one, never a ``/``.
    """
    patterns = patterns or {}
    if not text.strip():
        raise TemplateError("the template is empty")
    absolute = text.startswith("/")
    names = [n for n in text.strip("/").split("/")]
    if any(n == "" for n in names):
        raise TemplateError(f"{text!r} has an empty folder name ('//')")
    if text.endswith("/"):
        raise TemplateError(f"{text!r} ends with '/': a template names files")
    base: list[str] = []
    segments: list[Segment] = []
    seen: list[str] = []
    for name in names:
        parts = _split(name)
        fields = tuple(dict.fromkeys(t for is_field, t in parts if is_field))
        if not fields and not segments:
            base.append(name)
            continue
        if not fields:
            segments.append(Segment(name, name, (), None, (), parts, name.startswith(".")))
            continue
        repeated = tuple(f for f in fields if f in seen)
        try:
            regex = re.compile(_pattern(parts, patterns))
        except re.error as exc:
            raise TemplateError(f"cannot build a pattern for {name!r}: {exc}") from None
        show_hidden = not parts[0][0] and parts[0][1].startswith(".")
        empty = any(re.fullmatch(f"(?:{patterns.get(f, DEFAULT_PATTERN)})", "") is not None for f in fields)
        segments.append(Segment(name, None, fields, regex, repeated, parts, show_hidden, empty))
        seen.extend(f for f in fields if f not in seen)
    if not segments:
        raise TemplateError(f"{text!r} has no field: name the varying parts, e.g. data/{{subject}}/ct.nii.gz")
    return Template(text, tuple(base), absolute, tuple(segments), tuple(seen))
