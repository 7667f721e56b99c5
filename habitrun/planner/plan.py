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

from habitrun.planner.fingerprint import fingerprints as _fingerprints
from habitrun.planner.keys import (
    canonical_json,
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
def _stage_components(stage: StageSpec, fingerprint: str) -> dict[str, Any]:
    what = stage.operator or stage.entrypoint or list(stage.command or ())
    return {
        "kind": stage.kind,
        "operator": what,
        "code": fingerprint[:16],
        "params": short_digest(canonical_json(stage.params))[:16],
    }


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

    def __init__(self, common: dict, rows: Mapping[str, str], ids: Sequence[str], upstream: Mapping[str, StagePlan]) -> None:
        self._common = common
        self._rows = rows
        self._ids = ids
        self._upstream = upstream

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
        }

    def json(self, sid: str) -> str:
        """``compact(self[sid])``, without building the dict."""
        if self._upstream:
            upstream = compact({name: plan.upstream_key(sid) for name, plan in self._upstream.items()})
        else:
            upstream = "{}"
        return f'{self._head}{self._rows[sid][:16]}","upstream":{upstream}}}'

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def explain(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why a key changed, from the components stored with the old record and the current ones."""
    reasons: list[str] = []
    if not old:
        return ["inputs changed (the stored record predates change tracking)"]
    if old.get("kind") != new.get("kind"):
        reasons.append("stage kind changed")
    if old.get("operator") != new.get("operator"):
        reasons.append("operator changed")
    elif old.get("code") != new.get("code"):
        reasons.append("operator code changed")
    if old.get("params") != new.get("params"):
        reasons.append("params changed")
    if "row" in new and old.get("row") != new.get("row"):
        reasons.append("manifest row changed")
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
    """
    done, failed = store.stage_outcomes(plan.name, prefix) if store is not None else (set(), set())
    policy = plan.policy
    status, reasons = plan.status, plan.reasons
    status.update(dict.fromkeys(candidates, SubjectStatus.DONE))
    if len(candidates) == len(probe) and done.issuperset(probe.values()):
        not_done: list[str] = []
    else:
        not_done = [sid for sid in candidates if probe[sid] not in done]
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


def _blocked_reason(sid: str, needs: Mapping[str, StagePlan]) -> list[str]:
    out = []
    for name, up in needs.items():
        st = up.status.get(GROUP_SUBJECT if up.is_group else sid)
        if st is SubjectStatus.FAILED:
            out.append(f"upstream {name!r} failed")
        elif st is SubjectStatus.BLOCKED:
            out.append(f"upstream {name!r} was skipped")
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
) -> StagePlan:
    """Plan one stage from its upstream plans and the store (see the module docstring)."""
    stage = recipe.stage(stage_name)
    policy = recipe.stage_policy(stage_name)
    ident = stage_identity(stage, fingerprint)
    needs = {name: upstream[name] for name in stage.needs}
    common = _stage_components(stage, fingerprint)
    if stage.kind in GROUP_KINDS:
        return _plan_group(stage, policy, ident, fingerprint, common, subjects, needs, store)

    rows = digests if digests is not None else _digests_for(subjects)
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
    if len(ids) != len(rows):
        rows = {sid: rows[sid] for sid in ids}
    keys = KeyMap(prefix, rows)
    plan = StagePlan(
        name=stage.name,
        kind=stage.kind,
        policy=policy,
        identity=ident,
        fingerprint=fingerprint,
        keys=keys,
        status={},
        reasons={},
        components=_LazyComponents(common, rows, ids, needs),
        key_prefix=prefix,
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
    _judge(plan, candidates, rows, store, frozenset(policy.force_rerun_subjects), prefix + ".")
    _mark_upstream_changed(plan, needs, store)
    if unavailable:  # keep manifest order
        plan.status = {sid: plan.status[sid] for sid in ids}
    return plan


def _plan_group(
    stage: StageSpec,
    policy: RunPolicy,
    ident: str,
    fingerprint: str,
    common: dict[str, Any],
    subjects: Sequence[Any],
    needs: Mapping[str, StagePlan],
    store: CheckpointStore | None,
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
    """stage -> code fingerprint (see :mod:`habitrun.planner.fingerprint`)."""
    return _fingerprints(loaded)


def plan_study(
    loaded: LoadedRecipe,
    subjects: Sequence[Any],
    store: CheckpointStore | None,
    *,
    prints: Mapping[str, str] | None = None,
) -> Plan:
    """Plan every stage of the recipe, in dependency order."""
    prints = prints if prints is not None else fingerprints(loaded)
    recipe = loaded.recipe
    digests = subject_parts(subjects)
    stages: dict[str, StagePlan] = {}
    for stage in recipe.ordered_stages():
        stages[stage.name] = plan_stage(
            recipe, stage.name, subjects, stages, store, prints[stage.name], digests=digests
        )
    return Plan(stages)
