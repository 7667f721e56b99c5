"""What can be checked about 'subjects.from' / 'subjects.bids' before looking at the disk.

Every problem is ``(field path below subjects, message)``, so the loader
points at the line and column of the template, field, id, pivot or required
entry that is wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from habitrun.spec.pathtemplate import TemplateError, check_pattern, parse_template

if TYPE_CHECKING:
    from habitrun.spec.recipe import SubjectsSpec

Problem = tuple[tuple[Any, ...], str]
PATH_COLUMN = "path"
"""The file column of a template that has no pivot field and no name."""


def _listed(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def check_found(spec: SubjectsSpec) -> list[Problem]:
    """Templates that parse, regexes that compile, and id / pivot / required that name real fields."""
    problems: list[Problem] = []
    patterns = spec.patterns()
    user_fields = dict(spec.fields)
    for name, pattern in user_fields.items():
        try:
            check_pattern(name, pattern)
        except TemplateError as exc:
            problems.append((("fields", name), str(exc)))
    usable = {k: v for k, v in patterns.items() if not any(p[0] == ("fields", k) for p in problems)}
    parsed = []
    for at, column, text in spec.templates():
        try:
            parsed.append((at, column, parse_template(text, usable)))
        except TemplateError as exc:
            problems.append((at, f"template {text!r}: {exc}"))
    if problems or spec.bids is not None:
        if spec.bids is not None:
            known = {"subject", "session"}
            problems += [(("fields", k), f"unknown field {k!r}: with bids, the fields are subject and session")
                         for k in user_fields if k not in known]
        return problems
    every = list(dict.fromkeys(f for _, _, t in parsed for f in t.fields))
    for k in user_fields:
        if k not in every:
            problems.append((("fields", k), f"unknown field {k!r}: the templates' fields are {_listed(every)}"))
    if spec.id not in every:
        problems.append((("id",), f"unknown field {spec.id!r}: the id must be a template field ({_listed(every)})"))
    else:
        for at, _, template in parsed:
            if spec.id not in template.fields:
                problems.append((at, f"template {template.text!r} has no field {{{spec.id}}} (the id): "
                                     "every template must name the subject"))
    columns: set[str] = set(every)
    if spec.pivot is not None:
        if spec.pivot not in every:
            problems.append((("pivot",), f"unknown field {spec.pivot!r}: pivot must be a template field ({_listed(every)})"))
        elif spec.pivot == spec.id:
            problems.append((("pivot",), f"pivot {spec.pivot!r} is the id field: pivot the field that names the file kind"))
    for at, column, template in parsed:
        if column is not None:
            if column in every:
                problems.append((at, f"file column {column!r} is also a template field: rename one"))
            columns.add(column)
        elif spec.pivot not in template.fields:
            columns.add(PATH_COLUMN)
    if spec.pivot is None or spec.pivot not in every:
        for j, name in enumerate(spec.required):
            if name not in columns:
                problems.append((("required", j), f"unknown column {name!r}: required names a field or file column "
                                                  f"({_listed(sorted(columns))})"))
    return problems
