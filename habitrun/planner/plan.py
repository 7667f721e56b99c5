"""The plan: per stage and subject, whether the stored result stands or the work must run.

Statuses, per stage and subject (a collect/train stage has one pseudo
subject, ``"*"``):

* ``done``: a success is stored under the current key.
* ``failed``: a failure is stored under the current key and is not retried
  (a failed subject blocks what depends on it). With
  ``retry_failed_subjects`` a recorded failure is ``forced`` instead.
* ``stale``: the subject has records, but under another key: an input
  changed; ``reasons`` says which (params, code, manifest row, upstream).
* ``pending``: nothing stored for the subject in this stage.
* ``forced``: stored, but rerun (``force_rerun_subjects``, ``resume: false``,
  or a recorded failure retried).
* ``blocked``: a stage it needs failed (or was blocked) for it: it is
  skipped, not an error of its own.

The engine plans one stage at a time: after running a stage it sets that
stage's statuses to done/failed from the outcomes, then plans the next, so
planning reads upstream keys and statuses from the upstream plans only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from habitrun.planner.context import KeyContext, StageInputs, build_context
from habitrun.planner.context import fingerprints as _fingerprints
from habitrun.planner.explain import explain, package_changes
from habitrun.planner.keys import (
    canonical_json,
    combined_parts,
    group_key,
    short_digest,
    stage_identity,
    stage_part,
    subject_parts,
)
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import Recipe, StageSpec
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.jsontext import compact

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

GROUP_SUBJECT = "*"
GROUP_KINDS = ("collect", "train")


class SubjectStatus(str, Enum):
    DONE = "done"
    FAILED = "failed"
    STALE = "stale"
    PENDING = "pending"
    FORCED = "forced"
    BLOCKED = "blocked"


_UNAVAILABLE = (SubjectStatus.FAILED, SubjectStatus.BLOCKED)
_RUNS = (SubjectStatus.PENDING, SubjectStatus.STALE, SubjectStatus.FORCED)


@dataclass
class StagePlan:
    """One stage's plan (see the module docstring)."""

    name: str
    kind: str
    policy: RunPolicy
    identity: str
    fingerprint: str
    keys: Mapping[str, str]  # a KeyMap for a map stage
    status: dict[str, SubjectStatus]
    reasons: dict[str, list[str]]
    components: Mapping[str, dict]
    members: list[str] = field(default_factory=list)
    key_prefix: str = ""  # map stage: the stage part every key starts with (see planner.keys)
    # The key an older habitrun gave the same inputs (map: its stage part; group: the whole key),
    # when there is one: results stored under it count as done and `run` moves them to today's key.
    legacy_prefix: str | None = None
    adopted: dict[str, str] = field(default_factory=dict)  # subject -> its result's older key
    variant: Any = None  # which subject parts the keys use (see planner.context)
    package_changes: list[str] = field(default_factory=list)  # "numpy 1.26.4 → 2.1.0" (not in the key)

    @property
    def is_group(self) -> bool:
        return self.kind in GROUP_KINDS

    def to_run(self) -> list[str]:
        """Subjects to run, in manifest order: pending, stale and forced (a recorded failure
        that ``retry_failed_subjects`` retries is forced); with ``resume`` off, every subject
        that is not blocked. ``failed`` never runs: it means "failed, not retried"."""
        if not self.policy.resume:
            return [s for s, st in self.status.items() if st is not SubjectStatus.BLOCKED]
        return [s for s, st in self.status.items() if st in _RUNS]

    def counts(self) -> dict[str, int]:
        """Subjects per status (list.count compares by identity first: C speed for 100,000)."""
        values = list(self.status.values())
        return {s.value: values.count(s) for s in SubjectStatus}

    def unavailable(self) -> set[str]:
        """Subjects whose result downstream stages cannot have (failed or blocked)."""
        values = self.status.values()
        if SubjectStatus.FAILED not in values and SubjectStatus.BLOCKED not in values:
            return set()
        return {s for s, st in self.status.items() if st in _UNAVAILABLE}

    def components_json(self, subject_id: str) -> str:
        """A subject's key components as compact JSON, as the store keeps them with its record."""
        components = self.components
        if isinstance(components, _LazyComponents):
            return components.json(subject_id)
        return compact(components.get(subject_id, {}))

    def upstream_key(self, subject_id: str) -> str:
        """This stage's key that a downstream subject depends on."""
        if self.is_group:
            return self.keys[GROUP_SUBJECT]
        return self.keys[subject_id]

    def to_json(self, *, subjects: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "identity": self.identity,
            "counts": self.counts(),
            "to_run": len(self.to_run()),
        }
        if self.is_group:
            data["members"] = len(self.members)
        if self.package_changes:
            data["packages_changed"] = list(self.package_changes)
        if subjects:
            data["subjects"] = {
                sid: {"status": st.value, "key": self.keys.get(sid), **({"reasons": self.reasons[sid]} if sid in self.reasons else {})}
                for sid, st in self.status.items()
            }
        return data


@dataclass
class Plan:
    """Every stage's plan, in dependency order."""

    stages: dict[str, StagePlan]

    def __iter__(self) -> Iterator[StagePlan]:
        return iter(self.stages.values())

    def counts(self) -> dict[str, int]:
        total = {s.value: 0 for s in SubjectStatus}
        for stage in self.stages.values():
            for name, n in stage.counts().items():
                total[name] += n
        return total

    def to_json(self, *, subjects: bool = True) -> dict[str, Any]:
        return {
            "stages": [s.to_json(subjects=subjects) for s in self.stages.values()],
            "counts": self.counts(),
        }


# -- key components and what changed ----------------------------------------------------------
MAX_PARAMS_TEXT = 2000  # params up to this much JSON are stored with each record, for reasons


def _stage_components(stage: StageSpec, fingerprint: str, info: StageInputs | None = None) -> dict[str, Any]:
    what = stage.operator or stage.entrypoint or list(stage.command or ())
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
    if info.code.packages:
        out["packages"] = info.code.packages
        if info.packages_in_key:
            out["packages_key"] = True
    return out


class KeyMap(Mapping[str, str]):
    """subject -> key of a map stage, ``<stage part>.<subject part>``, built on access.

    A plan of 100,000 subjects x 3 stages would otherwise build 300,000 strings that the
    engine mostly never reads (everything is done)."""

    __slots__ = ("_head", "_parts")

    def __init__(self, prefix: str, parts: Mapping[str, str]) -> None:
        self._head = prefix + "."
        self._parts = parts

    def __getitem__(self, sid: str) -> str:
        return self._head + self._parts[sid]

    def get(self, sid: str, default: Any = None) -> Any:
        part = self._parts.get(sid)
        return default if part is None else self._head + part

    def __contains__(self, sid: object) -> bool:
        return sid in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __repr__(self) -> str:
        return f"KeyMap({self._head!r}, {len(self._parts)} subjects)"


class _LazyComponents(Mapping[str, dict]):
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


# -- planning ---------------------------------------------------------------------------------
_digest_memo: list[Any] = [None, None]  # [subjects object, its digests]: the engine plans stage by stage


def _digests_for(subjects: Sequence[Any]) -> dict[str, str]:
    if _digest_memo[0] is subjects and _digest_memo[1] is not None and len(_digest_memo[1]) == len(subjects):
        return _digest_memo[1]
    digests = subject_parts(subjects)
    _digest_memo[0], _digest_memo[1] = subjects, digests
    return digests


def _judge(
    plan: StagePlan,
    candidates: list[str],
    probe: Mapping[str, str],
    store: CheckpointStore | None,
    forced: frozenset[str],
    prefix: str = "",
) -> None:
    """Set the status of every candidate subject from the store (blocked ones are already set).

    ``probe`` maps a subject to what the store is asked about: its key, or for a map stage
    only the subject part after ``prefix`` (the stage part), so no key is built to be
    looked up. Written for the common case, a study where nearly everything is done: one
    C-level pass finds the few subjects that are not, and only those are looked at one by one.

    A subject not stored under its key may be stored under the key an older habitrun gave
    the same inputs (``plan.legacy_prefix``): it counts as stored, and is listed in
    ``plan.adopted`` for `run` to move to today's key.
    """
    done, failed = store.stage_outcomes(plan.name, prefix) if store is not None else (set(), set())
    policy = plan.policy
    status, reasons = plan.status, plan.reasons
    status.update(dict.fromkeys(candidates, SubjectStatus.DONE))
    if len(candidates) == len(probe) and done.issuperset(probe.values()):
        not_done: list[str] = []
    else:
        not_done = [sid for sid in candidates if probe[sid] not in done]
    if not_done and store is not None and plan.legacy_prefix is not None and policy.resume:
        done, failed = _adopt(plan, not_done, probe, store, done, failed)
        if plan.adopted:
            not_done = [sid for sid in not_done if sid not in plan.adopted]
    if not policy.resume:
        for sid in candidates:
            if probe[sid] in done or probe[sid] in failed:
                status[sid] = SubjectStatus.FORCED
                reasons[sid] = ["resume is off"]
    elif forced:
        for sid in forced.intersection(candidates):
            if probe[sid] in done:
                status[sid] = SubjectStatus.FORCED
                reasons[sid] = ["listed in force_rerun_subjects"]
    if store is not None:
        _mark_unreadable(plan, candidates, probe, store, prefix)
    missing: list[str] = []
    for sid in not_done:
        if probe[sid] in failed:
            if not policy.resume:
                continue
            if sid in forced:
                status[sid] = SubjectStatus.FORCED
                reasons[sid] = ["listed in force_rerun_subjects"]
            elif policy.retry_failed_subjects:
                status[sid] = SubjectStatus.FORCED
                reasons[sid] = ["recorded failure retried (retry_failed_subjects)"]
            else:
                status[sid] = SubjectStatus.FAILED
        else:
            status[sid] = SubjectStatus.PENDING
            missing.append(sid)
    if missing and store is not None:
        latest = store.latest(plan.name)
        lost = store.lost(plan.name)
        for sid in missing:
            seen = latest.get(sid)
            if seen is not None and seen[0] != plan.keys[sid]:
                status[sid] = SubjectStatus.STALE
                reasons[sid] = explain(seen[1], plan.components[sid])
            elif sid in lost:
                status[sid] = SubjectStatus.STALE
                reasons[sid] = ["stored record unreadable (the store file is damaged)"]


def _mark_unreadable(plan: StagePlan, candidates: list[str], probe: Mapping[str, str],
                     store: CheckpointStore, prefix: str) -> None:
    """A done subject whose stored result fails its checksum (or lost its file) is stale."""
    bad = store.unreadable(plan.name, prefix)
    if not bad:
        return
    status, reasons = plan.status, plan.reasons
    for sid in candidates:
        why = bad.get(probe[sid])
        if why is not None and status[sid] is SubjectStatus.DONE:
            status[sid] = SubjectStatus.STALE
            reasons[sid] = [f"stored result unreadable: {why}"]


def _mark_upstream_changed(plan: StagePlan, needs: Mapping[str, StagePlan], store: CheckpointStore | None) -> None:
    """A done subject whose upstream result was since replaced by a different one is stale.

    The store lists every key whose result was recomputed to a different value, and when
    (``CheckpointStore.changed``); a downstream record written before that moment was
    computed from the old value. Nothing to look at, nothing spent, when no result changed.
    """
    if store is None:
        return
    status, reasons = plan.status, plan.reasons
    for name, up in needs.items():
        changed = store.changed(up.name)
        if not changed:
            continue
        # this stage's subject -> when the upstream result it takes last changed
        since: dict[str, float] = {}
        if up.is_group:
            entry = changed.get(up.keys.get(GROUP_SUBJECT))
            if entry is not None:
                since = dict.fromkeys(plan.status, entry[1])
        elif plan.is_group:
            members = set(plan.members)
            times = [at for key, (sid, at) in changed.items() if sid in members and up.keys.get(sid) == key]
            if times:
                since = {GROUP_SUBJECT: max(times)}
        else:
            since = {sid: at for key, (sid, at) in changed.items() if up.keys.get(sid) == key}
        since = {sid: at for sid, at in since.items() if status.get(sid) is SubjectStatus.DONE}
        if not since:
            continue
        written = store.written_at([plan.keys[sid] for sid in since])
        for sid, at in since.items():
            if written.get(plan.keys[sid], at) < at:
                status[sid] = SubjectStatus.STALE
                reasons[sid] = [f"upstream {name!r} reran with a different result"]


def _adopt(plan: StagePlan, not_done: list[str], probe: Mapping[str, str], store: CheckpointStore,
           done: set[str], failed: set[str]) -> tuple[set[str], set[str]]:
    """Subjects stored under their older key (see :func:`_judge`): (done, failed) including them."""
    legacy = plan.legacy_prefix or ""
    if plan.is_group:
        old_done, old_failed = store.stage_outcomes(plan.name)
        found = {GROUP_SUBJECT: legacy} if legacy in old_done or legacy in old_failed else {}
        is_done = legacy in old_done
    else:
        old_done, old_failed = store.stage_outcomes(plan.name, legacy + ".")
        found = {sid: f"{legacy}.{probe[sid]}" for sid in not_done if probe[sid] in old_done or probe[sid] in old_failed}
        is_done = False
    if not found:
        return done, failed
    plan.adopted.update(found)
    done, failed = set(done), set(failed)
    for sid in found:
        ok = is_done if plan.is_group else probe[sid] in old_done
        (done if ok else failed).add(probe[sid])
    return done, failed


def _blocked_reason(sid: str, needs: Mapping[str, StagePlan]) -> list[str]:
    out = []
    for name, up in needs.items():
        st = up.status.get(GROUP_SUBJECT if up.is_group else sid)
        if st is SubjectStatus.FAILED:
            out.append(f"upstream {name!r} failed")
        elif st is SubjectStatus.BLOCKED:
            out.append(f"upstream {name!r} was skipped")
    return out


def _legacy_upstream(needs: Mapping[str, StagePlan]) -> list[str] | None:
    """The older keys' stage parts of what a stage needs (None when one has none)."""
    out = []
    for up in needs.values():
        if up.legacy_prefix is None:
            return None
        out.append(up.legacy_prefix)
    return out


def _package_changes(plan: StagePlan, info: StageInputs | None, store: CheckpointStore | None) -> list[str]:
    """Package versions that differ from those the stored results of this key were computed
    with (reported only: with rerun_on_package_change they are in the key instead)."""
    if info is None or store is None or info.packages_in_key or not info.code.packages:
        return []
    if not any(st is SubjectStatus.DONE for st in plan.status.values()):
        return []
    if plan.is_group:
        seen = store.stage_packages(plan.name, key=plan.keys[GROUP_SUBJECT])
    else:
        seen = store.stage_packages(plan.name, prefix=plan.key_prefix + ".")
    out: list[str] = []
    for old in seen:
        for change in package_changes(old, info.code.packages):
            if change not in out:
                out.append(change)
    return out


def plan_stage(
    recipe: Recipe,
    stage_name: str,
    subjects: Sequence[Any],
    upstream: Mapping[str, StagePlan],
    store: CheckpointStore | None,
    fingerprint: str,
    *,
    digests: Mapping[str, str] | None = None,
    context: KeyContext | None = None,
) -> StagePlan:
    """Plan one stage from its upstream plans and the store (see the module docstring).

    With ``context`` (:func:`habitrun.planner.context.build_context`), the keys cover input
    files, declared inputs, the study modules the code imports and the manifest columns the
    stage uses; ``fingerprint`` is then taken from the context.
    """
    stage = recipe.stage(stage_name)
    policy = recipe.stage_policy(stage_name)
    info = context.stages[stage_name] if context is not None else None
    if info is not None:
        fingerprint = info.fingerprint
    ident = stage_identity(stage, fingerprint)
    legacy_ident = (
        stage_identity(stage, info.legacy_fingerprint) if info is not None and info.legacy_fingerprint else None
    )
    needs = {name: upstream[name] for name in stage.needs}
    common = _stage_components(stage, fingerprint, info)
    if stage.kind in GROUP_KINDS:
        plan = _plan_group(stage, policy, ident, fingerprint, common, subjects, needs, store, legacy_ident)
        plan.package_changes = _package_changes(plan, info, store)
        return plan

    if digests is None and (info is None or info.variant is None):
        digests = _digests_for(subjects)  # the subject parts of every stage keyed on the whole row
    rows = digests if digests is not None else {}
    ids = list(rows) if len(rows) == len(subjects) else [row.id for row in subjects]
    unavailable: set[str] = set()
    for up in needs.values():
        if up.is_group:
            if up.status.get(GROUP_SUBJECT) in _UNAVAILABLE:
                unavailable.update(ids)
        else:
            unavailable |= up.unavailable()
    prefix = stage_part(
        ident, [up.keys[GROUP_SUBJECT] if up.is_group else up.key_prefix for up in needs.values()]
    )
    variant = None
    parts: Mapping[str, str] = rows
    if context is not None:
        variant = info.variant if info is not None else None
        parts = context.parts(stage_name, rows)
        # An upstream map stage keyed on other columns or files: its subject parts join ours.
        others = [up.keys._parts for up in needs.values() if not up.is_group and up.variant != variant]  # type: ignore[attr-defined]
        if others:
            parts = combined_parts(parts, others)
            variant = ("combined", variant, tuple(up.variant for up in needs.values() if not up.is_group))
    if len(ids) != len(parts):
        parts = {sid: parts[sid] for sid in ids}
    legacy_prefix = None
    if legacy_ident is not None and variant is None:
        legacy_up = _legacy_upstream(needs)
        if legacy_up is not None:
            legacy_prefix = stage_part(legacy_ident, legacy_up)
    keys = KeyMap(prefix, parts)
    extra = _subject_extra(context, stage_name, subjects) if context is not None else None
    plan = StagePlan(
        name=stage.name,
        kind=stage.kind,
        policy=policy,
        identity=ident,
        fingerprint=fingerprint,
        keys=keys,
        status={},
        reasons={},
        components=_LazyComponents(common, parts, ids, needs, extra),
        key_prefix=prefix,
        legacy_prefix=legacy_prefix,
        variant=variant,
    )
    candidates = ids
    if unavailable:
        candidates = []
        for sid in ids:
            if sid in unavailable:
                plan.status[sid] = SubjectStatus.BLOCKED
                plan.reasons[sid] = _blocked_reason(sid, needs)
            else:
                candidates.append(sid)
    _judge(plan, candidates, parts, store, frozenset(policy.force_rerun_subjects), prefix + ".")
    _mark_upstream_changed(plan, needs, store)
    if unavailable:  # keep manifest order
        plan.status = {sid: plan.status[sid] for sid in ids}
    plan.package_changes = _package_changes(plan, info, store)
    return plan


def _subject_extra(context: KeyContext, stage_name: str, subjects: Sequence[Any]) -> Any:
    """sid -> the subject's own key components (manifest fields it uses, its files), built on
    demand: only subjects that run are recorded, and only stale ones explained."""
    stage = context.stages[stage_name].stage
    index: dict[str, Any] = {}

    def extra(sid: str) -> dict[str, Any]:
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


def _plan_group(
    stage: StageSpec,
    policy: RunPolicy,
    ident: str,
    fingerprint: str,
    common: dict[str, Any],
    subjects: Sequence[Any],
    needs: Mapping[str, StagePlan],
    store: CheckpointStore | None,
    legacy_ident: str | None = None,
) -> StagePlan:
    blocked_by = [name for name, up in needs.items() if up.is_group and up.status.get(GROUP_SUBJECT) in _UNAVAILABLE]
    map_needs = [up for up in needs.values() if not up.is_group]
    members: list[str] = []
    if map_needs:
        gone: set[str] = set()
        for up in map_needs:
            gone |= up.unavailable()
        members = [row.id for row in subjects if row.id not in gone]
    member_keys: dict[str, list[str]] = {
        name: ([up.keys[GROUP_SUBJECT]] if up.is_group else [up.keys[sid] for sid in members])
        for name, up in needs.items()
    }
    key = group_key(ident, member_keys)
    legacy_key = None
    if legacy_ident is not None and _legacy_upstream(needs) is not None:
        legacy_members = {
            name: ([up.legacy_prefix or ""] if up.is_group
                   else [f"{up.legacy_prefix}.{up.keys._parts[sid]}" for sid in members])  # type: ignore[attr-defined]
            for name, up in needs.items()
        }
        legacy_key = group_key(legacy_ident, legacy_members)
    components = {
        **common,
        "members": short_digest(canonical_json(members))[:16],
        "upstream": {name: short_digest(",".join(keys))[:16] for name, keys in member_keys.items()},
    }
    plan = StagePlan(
        name=stage.name,
        kind=stage.kind,
        policy=policy,
        identity=ident,
        fingerprint=fingerprint,
        keys={GROUP_SUBJECT: key},
        status={},
        reasons={},
        components={GROUP_SUBJECT: components},
        members=members,
        legacy_prefix=legacy_key,
    )
    if blocked_by or (map_needs and not members):
        plan.status[GROUP_SUBJECT] = SubjectStatus.BLOCKED
        plan.reasons[GROUP_SUBJECT] = (
            [f"upstream {name!r} failed or was skipped" for name in blocked_by]
            or ["no subject succeeded in the stages it needs"]
        )
        return plan
    # force_rerun_subjects names subjects of map stages; it does not force a group stage.
    _judge(plan, [GROUP_SUBJECT], plan.keys, store, frozenset())
    _mark_upstream_changed(plan, needs, store)
    return plan


def fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    """stage -> code fingerprint (see :mod:`habitrun.planner.code`)."""
    return _fingerprints(loaded)


def plan_study(
    loaded: LoadedRecipe,
    subjects: Sequence[Any],
    store: CheckpointStore | None,
    *,
    prints: Mapping[str, str] | None = None,
    context: KeyContext | None = None,
) -> Plan:
    """Plan every stage of the recipe, in dependency order.

    Reads the input files (a ``stat`` each; a read for those whose stat changed) and the
    study's code; a missing or unreadable input file is a RecipeError (exit 2).
    """
    if context is None:
        context = build_context(loaded, subjects, store)
    prints = prints if prints is not None else {n: info.fingerprint for n, info in context.stages.items()}
    recipe = loaded.recipe
    digests = subject_parts(subjects) if any(i.variant is None for i in context.stages.values()) else None
    stages: dict[str, StagePlan] = {}
    for stage in recipe.ordered_stages():
        stages[stage.name] = plan_stage(
            recipe, stage.name, subjects, stages, store, prints[stage.name],
            digests=digests if digests is not None else {}, context=context,
        )
    return Plan(stages)
