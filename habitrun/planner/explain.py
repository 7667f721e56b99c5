"""Why a key changed, in words: the components stored with the old record against today's.

Each record keeps what went into its key (see :func:`habitrun.planner.components.stage_components`):
the code of each study module, params, declared inputs, package versions,
the manifest fields and input files of the subject, and the upstream keys.
Comparing them names the cause: ``params.bins: 32 → 64``, ``code:
study_ops/util.py changed``, ``image: data/s1.nii.gz content changed``,
``manifest row changed: age 65 → 66``, ``upstream 'normalise' changed``.
A record written before a component was kept is explained more coarsely.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from habitrun.planner.keys import canonical_json

MAX_SHOWN = 60  # a value longer than this is shown cut


def _show(value: Any) -> str:
    text = value if isinstance(value, str) and value else canonical_json(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _flat_diff(prefix: str, old: Any, new: Any, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            here = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                out.append(f"{here}: added ({_show(new[key])})")
            elif key not in new:
                out.append(f"{here}: removed (was {_show(old[key])})")
            else:
                _flat_diff(here, old[key], new[key], out)
    elif canonical_json(old) != canonical_json(new):
        out.append(f"{prefix}: {_show(old)} → {_show(new)}")


def _changes(old: Mapping[Any, Any], new: Mapping[Any, Any], added: str, removed: str, changed: str,
             prefix: str = "") -> list[str]:
    """A line per key added, removed or changed, sorted by key: ``prefix`` and a template filled
    with ``key`` and the values shown short, ``old`` and ``new``."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            out.append(prefix + added.format(key=key, new=_show(new[key])))
        elif key not in new:
            out.append(prefix + removed.format(key=key, old=_show(old[key])))
        elif old[key] != new[key]:
            out.append(prefix + changed.format(key=key, old=_show(old[key]), new=_show(new[key])))
    return out


def _code(old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        if "code_version" in old or "code_version" in new:
            if old.get("code_version") != new.get("code_version"):
                return [f"code_version: {old.get('code_version', '(automatic)')} → {new.get('code_version', '(automatic)')}"]
            return []
        out = _changes(old, new, "code: {key} now imported", "code: {key} no longer imported", "code: {key} changed")
        return out or ["operator code changed"]
    return ["operator code changed"]


def _entries(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(";") if text else ():
        sep = "=" if "=" in item else "#"
        name, _, value = item.rpartition(sep)
        out[name] = value
    return out


def _files(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    out = []
    for col in sorted(set(old) | set(new)):
        if col not in old:
            out.append(f"{col}: files now part of the key")
            continue
        if col not in new:
            out.append(f"{col}: no longer part of the key")
            continue
        if old[col] == new[col]:
            continue
        before, after = _entries(old[col]), _entries(new[col])
        lenient = "#" in new[col] and "=" not in new[col]
        was_lenient = "#" in old[col] and "=" not in old[col]
        if before and after and lenient != was_lenient:
            out.append(f"{col}: cache mode changed ({'lenient' if lenient else 'content'})")
            continue
        out.extend(_changes(before, after, "{key} added", "{key} removed",
                            "{key} size changed" if lenient else "{key} content changed", prefix=f"{col}: "))
        if not before.keys() | after.keys():
            out.append(f"{col}: files changed")
    return out


def _row(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    if set(new) < set(old) and len(old) - len(new) > 1 and all(old[c] == new[c] for c in new):
        return [f"manifest columns in the key now: {', '.join(sorted(new))}"]  # the stage lists its fields
    changes = _changes(old, new, "{key} added ({new})", "{key} removed (was {old})", "{key} {old} → {new}")
    return ["manifest row changed: " + ", ".join(changes)] if changes else []


def explain(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why a key changed, from the components stored with the old record and the current ones."""
    reasons: list[str] = []
    if not old:
        return ["inputs changed (the stored record predates change tracking)"]
    if old.get("kind") != new.get("kind"):
        reasons.append("stage kind changed")
    if old.get("operator") != new.get("operator"):
        both_commands = isinstance(old.get("operator"), list) and isinstance(new.get("operator"), list)
        reasons.append(f"command: {_show(' '.join(old['operator']))} → {_show(' '.join(new['operator']))}"
                       if both_commands else "operator changed")
    else:
        reasons.extend(_code(old.get("code"), new.get("code")))
    if old.get("params") != new.get("params"):
        if isinstance(old.get("params"), dict) and isinstance(new.get("params"), dict):
            diff: list[str] = []
            _flat_diff("params", old["params"], new["params"], diff)
            reasons.extend(diff or ["params changed"])
        else:
            reasons.append("params changed")
    reasons.extend(tool_changes(old.get("tools") or {}, new.get("tools") or {}))
    if (old.get("inputs") or {}) != (new.get("inputs") or {}):
        reasons.extend(_changes(old.get("inputs") or {}, new.get("inputs") or {},
                                "input {key} added", "input {key} removed", "input {key} changed"))
    if new.get("packages_key") and (old.get("packages") or {}) != (new.get("packages") or {}):
        reasons.extend(f"packages: {change}" for change in package_changes(old.get("packages") or {}, new["packages"]))
    subject: list[str] = []
    if "files" in new or "files" in old:
        subject.extend(_files(old.get("files") or {}, new.get("files") or {}))
    if "fields" in new and "fields" in old:
        subject.extend(_row(old["fields"], new["fields"]))
    if "row" in new and old.get("row") != new.get("row") and not subject:
        subject.append("manifest row changed")
    reasons.extend(subject)
    if "members" in new and old.get("members") != new.get("members"):
        reasons.append("subjects changed")
    old_up, new_up = old.get("upstream") or {}, new.get("upstream") or {}
    if set(old_up) != set(new_up):
        reasons.append("needs changed")
    if "members" not in new or old.get("members") == new.get("members"):
        for name in new_up:
            if name in old_up and old_up[name] != new_up[name]:
                reasons.append(f"upstream {name!r} changed")
    return reasons or ["inputs changed"]


def package_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """``numpy 1.26.4 → 2.1.0`` for each distribution whose version differs (or came or went)."""
    out = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before != after:
            out.append(f"{name} {before or '(none)'} → {after or '(none)'}")
    return out


def merged_by_pattern(groups: Mapping[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
    """(status, reason) -> subjects, with the reasons that differ only by each subject's own id
    merged into one whose id reads ``{subject}``: ``image: data/{subject}/ct.nii.gz content
    changed`` once for 40 subjects, instead of 40 lines (`plan --reason`). A reason that no
    other subject shares so is kept as it is."""
    patterns: dict[tuple[str, str], tuple[str, str]] = {}
    merged: dict[tuple[str, str], int] = {}
    for (status, why), sids in groups.items():
        pattern = why
        if len(sids) == 1 and sids[0] and sids[0] in why:
            pattern = re.sub(rf"(?<![A-Za-z0-9]){re.escape(sids[0])}(?![A-Za-z0-9])", "{subject}", why)
        patterns[(status, why)] = (status, pattern)
        merged[(status, pattern)] = merged.get((status, pattern), 0) + 1
    out: dict[tuple[str, str], list[str]] = {}
    for group, sids in groups.items():
        shared = patterns[group]
        out.setdefault(shared if merged[shared] > 1 else group, []).extend(sids)
    return out


def tool_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """``tool dcm2niix: v1.0.20220720 → v1.0.20250505``, ``image localhost/t:1: sha256:… → …``."""
    out = []
    for name in sorted(set(old) | set(new)):
        label = name if name.startswith("image ") else f"tool {name}"
        before, after = old.get(name), new.get(name)
        if before != after:
            out.append(f"{label}: {_show(before or '(none)')} → {_show(after or '(none)')}")
    return out
