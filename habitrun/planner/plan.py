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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from habitrun.planner.components import (
    LazyComponents,
    group_components,
    stage_components,
    subject_extra,
)
from habitrun.planner.context import BEFORE_10, BEFORE_31, KeyContext, build_context
from habitrun.planner.context import fingerprints as _fingerprints
from habitrun.planner.decision import Reason, SubjectStatus
from habitrun.planner.judge import judge, mark_upstream_changed, stage_package_changes
from habitrun.planner.keys import (
    KeyMap,
    combined_parts,
    group_key,
    stage_identity,
    stage_part,
    subject_parts,
)
from habitrun.planner.stageplan import GROUP_KINDS, GROUP_SUBJECT, UNAVAILABLE, Plan, StagePlan
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import Recipe, StageSpec
from habitrun.spec.subjects import subject_ids
from habitrun.store.checkpoint import CheckpointStore

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe

__all__ = [
    "GROUP_KINDS", "GROUP_SUBJECT", "Plan", "StagePlan", "SubjectStatus", "fingerprints", "plan_stage", "plan_study",
]

_digest_memo: list[Any] = [None, None]  # [subjects object, its digests]: the engine plans stage by stage


def _digests_for(subjects: Sequence[Any]) -> Mapping[str, str]:
    if _digest_memo[0] is subjects and _digest_memo[1] is not None and len(_digest_memo[1]) == len(subjects):
        return _digest_memo[1]
    digests = subject_parts(subjects)
    _digest_memo[0], _digest_memo[1] = subjects, digests
    return digests


@dataclass
class _Stage:
    """What planning one stage starts from: its definition, identity and the plans it needs."""

    spec: StageSpec
    policy: RunPolicy
    fingerprint: str
    identity: str
    legacy_identities: dict[str, str]  # generation -> the identity an older habitrun gave it
    needs: dict[str, StagePlan]
    common: dict[str, Any]  # the key components every subject shares

    def new_plan(self, **fields: Any) -> StagePlan:
        """The stage's plan, no status set yet."""
        return StagePlan(name=self.spec.name, kind=self.spec.kind, policy=self.policy, identity=self.identity,
                         fingerprint=self.fingerprint, status={}, reasons={}, **fields)


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
    info = context.stages[stage_name] if context is not None else None
    if info is not None:
        fingerprint = info.fingerprint
    legacy = info.legacy_fingerprints if info is not None else {}
    identity = stage_identity(stage, fingerprint)
    olds = {gen: stage_identity(stage, old) for gen, old in legacy.items()}
    if context is not None:
        olds.setdefault(BEFORE_31, identity)  # its identity did not change: its keys' may, upstream
    head = _Stage(
        spec=stage, policy=recipe.stage_policy(stage_name), fingerprint=fingerprint,
        identity=identity, legacy_identities=olds,
        needs={name: upstream[name] for name in stage.needs}, common=stage_components(stage, fingerprint, info),
    )
    if stage.kind in GROUP_KINDS:
        plan = _plan_group(head, subjects, store)
    else:
        plan = _plan_map(head, subjects, store, digests, context)
    # Packages not in the key are only reported when they changed since the stored results.
    packages = info.code.packages if info is not None and not info.packages_in_key else None
    plan.package_changes = stage_package_changes(plan, packages, store)
    return plan


def _plan_map(head: _Stage, subjects: Sequence[Any], store: CheckpointStore | None,
              digests: Mapping[str, str] | None, context: KeyContext | None) -> StagePlan:
    """A map stage: a key per subject, its stage part shared (see :mod:`habitrun.planner.keys`)."""
    info = context.stages[head.spec.name] if context is not None else None
    if digests is None and (info is None or info.variant is None):
        digests = _digests_for(subjects)  # the subject parts of every stage keyed on the whole row
    rows = digests if digests is not None else {}
    ids = subject_ids(subjects)
    needs = head.needs
    prefix = stage_part(
        head.identity, [up.keys[GROUP_SUBJECT] if up.is_group else up.key_prefix for up in needs.values()]
    )
    parts, variant = _subject_parts(head, context, rows)
    if len(ids) != len(parts):
        parts = {sid: parts[sid] for sid in ids}
    extra = subject_extra(context, head.spec.name, subjects) if context is not None else None
    plan = head.new_plan(
        keys=KeyMap(prefix, parts), components=LazyComponents(head.common, parts, ids, needs, extra),
        key_prefix=prefix, legacy=_legacy_map(head, context, rows), variant=variant,
    )
    unavailable = _unavailable(needs, ids)
    candidates = ids
    if unavailable:
        candidates = []
        for sid in ids:
            if sid in unavailable:
                plan.status[sid] = SubjectStatus.BLOCKED
                plan.reasons[sid] = _blocked_reason(sid, needs)
            else:
                candidates.append(sid)
    judge(plan, candidates, parts, store, frozenset(head.policy.force_rerun_subjects), prefix + ".")
    mark_upstream_changed(plan, needs, store)
    if unavailable:  # keep manifest order
        plan.status = {sid: plan.status[sid] for sid in ids}
    return plan


def _subject_parts(head: _Stage, context: KeyContext | None,
                   rows: Mapping[str, str]) -> tuple[Mapping[str, str], Any]:
    """A map stage's subject parts and which ones they are (its variant: see planner.context)."""
    if context is None:
        return rows, None
    variant = context.stages[head.spec.name].variant
    parts = context.parts(head.spec.name, rows)
    # An upstream map stage keyed on other columns or files: its subject parts join ours.
    maps = [up for up in head.needs.values() if not up.is_group]
    others = [up.parts for up in maps if up.variant != variant]
    if others:
        parts = combined_parts(parts, others)
        variant = ("combined", variant, tuple(up.variant for up in maps))
    return parts, variant


def _unavailable(needs: Mapping[str, StagePlan], ids: list[str]) -> set[str]:
    """Subjects a map stage cannot run: failed or blocked in a stage it needs."""
    unavailable: set[str] = set()
    for up in needs.values():
        if up.is_group:
            if up.status.get(GROUP_SUBJECT) in UNAVAILABLE:
                unavailable.update(ids)
        else:
            unavailable |= up.unavailable()
    return unavailable


def _blocked_reason(sid: str, needs: Mapping[str, StagePlan]) -> list[str]:
    out = []
    for name, up in needs.items():
        st = up.status.get(GROUP_SUBJECT if up.is_group else sid)
        if st is SubjectStatus.FAILED:
            out.append(Reason.UPSTREAM_FAILED.text(name=name))
        elif st is SubjectStatus.BLOCKED:
            out.append(Reason.UPSTREAM_SKIPPED.text(name=name))
    return out


def _legacy_upstream(needs: Mapping[str, StagePlan], gen: str) -> list[str] | None:
    """The older keys' stage parts (or group keys) of what a stage needs, in generation ``gen``
    (None when one has none)."""
    out = []
    for up in needs.values():
        entry = up.legacy_keys().get(gen)
        if entry is None:
            return None
        out.append(entry[0])
    return out


def _legacy_parts(head: _Stage, context: KeyContext | None, gen: str,
                  rows: Mapping[str, str]) -> Mapping[str, str] | None:
    """The subject parts of a map stage's keys in generation ``gen``, None when they are today's."""
    if gen != BEFORE_31 or context is None:
        return None
    own = context.legacy_parts(head.spec.name)
    maps = [up for up in head.needs.values() if not up.is_group]
    variant = context.stages[head.spec.name].variant
    others = [up for up in maps if up.variant != variant]
    olds = [_parts_of(up, gen) for up in others]
    if own is None and all(old is None for old in olds):
        return None
    if not others:
        return own
    base = own if own is not None else context.parts(head.spec.name, rows)
    return combined_parts(base, [old if old is not None else up.parts for old, up in zip(olds, others, strict=True)])


def _parts_of(up: StagePlan, gen: str) -> Mapping[str, str] | None:
    """The subject parts an upstream map stage's keys had in generation ``gen`` (None: today's)."""
    entry = up.legacy_keys().get(gen)
    return entry[1]() if entry is not None and entry[1] is not None else None


class _Once:
    """A value made at its first call, then kept (an older generation's subject parts)."""

    def __init__(self, make: Any) -> None:
        self._make, self._made, self._done = make, None, False

    def __call__(self) -> Any:
        if not self._done:
            self._made, self._done = self._make(), True
        return self._made


def _legacy_map(head: _Stage, context: KeyContext | None, rows: Mapping[str, str]) -> Any:
    """The keys older habitruns gave a map stage, per generation (made when first asked)."""
    if not head.legacy_identities:
        return None

    def made() -> dict[str, tuple[str, Any]]:
        out: dict[str, tuple[str, Any]] = {}
        for gen, identity in head.legacy_identities.items():
            if gen == BEFORE_10 and context is not None and context.stages[head.spec.name].variant is not None:
                continue
            ups = _legacy_upstream(head.needs, gen)
            if ups is not None:
                out[gen] = (stage_part(identity, ups), _Once(lambda gen=gen: _legacy_parts(head, context, gen, rows)))
        return out

    return made


def _plan_group(head: _Stage, subjects: Sequence[Any], store: CheckpointStore | None) -> StagePlan:
    """A collect or train stage: one key over its members' keys (see :func:`group_key`)."""
    needs = head.needs
    blocked_by = [name for name, up in needs.items() if up.is_group and up.status.get(GROUP_SUBJECT) in UNAVAILABLE]
    takes_subjects = any(not up.is_group for up in needs.values())
    members = _members(needs, subjects)
    member_keys: dict[str, list[str]] = {
        name: ([up.keys[GROUP_SUBJECT]] if up.is_group else [up.keys[sid] for sid in members])
        for name, up in needs.items()
    }
    plan = head.new_plan(
        keys={GROUP_SUBJECT: group_key(head.identity, member_keys)},
        components={GROUP_SUBJECT: group_components(head.common, members, member_keys)},
        members=members, legacy=_legacy_group(head, members),
    )
    if blocked_by or (takes_subjects and not members):
        plan.status[GROUP_SUBJECT] = SubjectStatus.BLOCKED
        plan.reasons[GROUP_SUBJECT] = (
            [Reason.UPSTREAM_UNAVAILABLE.text(name=name) for name in blocked_by] or [Reason.NO_MEMBERS.text()]
        )
        return plan
    # force_rerun_subjects names subjects of map stages; it does not force a group stage.
    judge(plan, [GROUP_SUBJECT], plan.keys, store, frozenset())
    mark_upstream_changed(plan, needs, store)
    return plan


def _members(needs: Mapping[str, StagePlan], subjects: Sequence[Any]) -> list[str]:
    """The subjects a group stage takes: available in every map stage it needs (none without one)."""
    map_needs = [up for up in needs.values() if not up.is_group]
    if not map_needs:
        return []
    gone: set[str] = set()
    for up in map_needs:
        gone |= up.unavailable()
    ids = subject_ids(subjects)
    return [sid for sid in ids if sid not in gone] if gone else list(ids)


def _legacy_group(head: _Stage, members: list[str]) -> Any:
    """The keys older habitruns gave a group stage, per generation (made when first asked)."""
    if not head.legacy_identities:
        return None

    def made() -> dict[str, tuple[str, Any]]:
        out: dict[str, tuple[str, Any]] = {}
        for gen, identity in head.legacy_identities.items():
            if _legacy_upstream(head.needs, gen) is None:
                continue
            legacy_members: dict[str, list[str]] = {}
            for name, up in head.needs.items():
                prefix, _ = up.legacy_keys()[gen]
                if up.is_group:
                    legacy_members[name] = [prefix]
                else:
                    old_parts = _parts_of(up, gen)
                    look = old_parts if old_parts is not None else up.parts
                    legacy_members[name] = [f"{prefix}.{look[sid]}" for sid in members]
            out[gen] = (group_key(identity, legacy_members), None)
        return out

    return made


def fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    """stage -> code fingerprint (see :mod:`habitrun.planner.code`)."""
    return _fingerprints(loaded)


def outcome_ranges(recipe: Recipe, prints: Mapping[str, str], context: KeyContext) -> list[tuple[str, str]]:
    """(stage, key prefix) of the map stages whose stage part is known before any subject part
    (keyed on the whole row, needing map stages only): what :func:`judge` will ask the store."""
    prefixes: dict[str, str] = {}
    for stage in recipe.ordered_stages():
        info = context.stages[stage.name]
        if stage.kind in GROUP_KINDS or info.variant is not None or any(n not in prefixes for n in stage.needs):
            continue
        fingerprint = info.fingerprint if info is not None else prints[stage.name]
        prefixes[stage.name] = stage_part(stage_identity(stage, fingerprint), [prefixes[n] for n in stage.needs])
    return [(name, prefix + ".") for name, prefix in prefixes.items()]


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
    if store is not None:
        store.prefetch_outcomes(outcome_ranges(recipe, prints, context))
    digests = subject_parts(subjects) if any(i.variant is None for i in context.stages.values()) else None
    stages: dict[str, StagePlan] = {}
    for stage in recipe.ordered_stages():
        stages[stage.name] = plan_stage(
            recipe, stage.name, subjects, stages, store, prints[stage.name],
            digests=digests if digests is not None else {}, context=context,
        )
    return Plan(stages)
