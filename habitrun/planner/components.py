"""What went into a key, as each record keeps it: what `plan --reason` compares to explain a change.

A stage's common components (kind, operator, its code modules, params, declared
inputs, packages) are built once; a map subject adds its subject part, its
upstream keys and, with a key context, the manifest fields and files it uses.
They are built only for the subjects that are looked at: the ones that run (the
engine stores them with the record) and the stale ones (:mod:`habitrun.planner.explain`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from habitrun.planner.keys import canonical_json, short_digest
from habitrun.store.jsontext import compact

if TYPE_CHECKING:
    from habitrun.planner.context import KeyContext, StageInputs
    from habitrun.planner.stageplan import StagePlan
    from habitrun.spec.recipe import StageSpec

MAX_PARAMS_TEXT = 2000  # params up to this much JSON are stored with each record, for reasons


def stage_components(stage: StageSpec, fingerprint: str, info: StageInputs | None = None) -> dict[str, Any]:
    """The components every subject of the stage shares (without ``info``: the older, coarser ones)."""
    what = list(stage.command or ()) if stage.runs_command else stage.operator or stage.entrypoint or list(stage.command or ())
    if info is None:
        return {
            "kind": stage.kind,
            "operator": what,
            "code": fingerprint[:16],
            "params": short_digest(canonical_json(stage.params))[:16],
        }
    params_text = canonical_json(stage.params)
    out: dict[str, Any] = {
        "v": 2,
        "kind": stage.kind,
        "operator": what,
        "code": info.code_components(),
        "params": stage.params if len(params_text) <= MAX_PARAMS_TEXT else short_digest(params_text)[:16],
    }
    if info.inputs:
        out["inputs"] = info.inputs
    if info.tools:
        out["tools"] = info.tools
    if info.code.packages:
        out["packages"] = info.code.packages
        if info.packages_in_key:
            out["packages_key"] = True
    return out


class LazyComponents(Mapping[str, dict]):
    """Per-subject key components, built only for the subjects that are looked at."""

    def __init__(self, common: dict, rows: Mapping[str, str], ids: Sequence[str], upstream: Mapping[str, StagePlan],
                 extra: Any = None) -> None:
        self._common = common
        self._rows = rows
        self._ids = ids
        self._upstream = upstream
        self._extra = extra  # sid -> dict of its own components (manifest fields, files), or None

        # The JSON of every subject's components starts the same; a subject adds its own row
        # digest (hex) and upstream keys. Built by joining text: once per subject, per run.
        self._head = compact(common)[:-1] + (',"row":"' if common else '{"row":"')

    def __getitem__(self, sid: str) -> dict:
        if sid not in self._rows:
            raise KeyError(sid)
        return {
            **self._common,
            "row": self._rows[sid][:16],  # the subject part: id and manifest row
            "upstream": {name: plan.upstream_key(sid) for name, plan in self._upstream.items()},
            **(self._extra(sid) if self._extra is not None else {}),
        }

    def json(self, sid: str) -> str:
        """``compact(self[sid])``, without building the dict."""
        if self._upstream:
            upstream = compact({name: plan.upstream_key(sid) for name, plan in self._upstream.items()})
        else:
            upstream = "{}"
        own = self._extra(sid) if self._extra is not None else None
        if own:
            return f'{self._head}{self._rows[sid][:16]}","upstream":{upstream},{compact(own)[1:]}'
        return f'{self._head}{self._rows[sid][:16]}","upstream":{upstream}}}'

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def subject_extra(context: KeyContext, stage_name: str, subjects: Sequence[Any]) -> Callable[[str], dict[str, Any]]:
    """sid -> the subject's own key components (manifest fields it uses, its files), built on
    demand: only subjects that run are recorded, and only stale ones explained."""
    stage = context.stages[stage_name].stage
    index: dict[str, Any] = {}

    def extra(sid: str) -> dict[str, Any]:
        by_id = getattr(subjects, "by_id", None)
        if by_id is not None:
            row = by_id(sid)
        else:
            if not index:
                index.update((row.id, row) for row in subjects)
            row = index.get(sid)
        if row is None:
            return {}
        fields = row.fields if stage.fields is None else {c: row.fields.get(c) for c in stage.fields}
        out: dict[str, Any] = {"fields": fields}
        files = context.subject_files(stage_name, sid, row.fields)
        if files:
            out["files"] = files
        return out

    return extra


def group_components(common: dict[str, Any], members: Sequence[str], member_keys: Mapping[str, list[str]]) -> dict[str, Any]:
    """A collect or train stage's components: its members and, per needed stage, their keys (digests)."""
    return {
        **common,
        "members": short_digest(canonical_json(members))[:16],
        "upstream": {name: short_digest(",".join(keys))[:16] for name, keys in member_keys.items()},
    }
