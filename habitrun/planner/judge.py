"""A stage plan's statuses from the store: what is stored for each subject, then the decision table.

Written for the common case, a study where nearly everything is done: one
C-level pass finds the few subjects that are not, and only those (and the
forced ones) are looked at one by one (:func:`judge`). What the store holds for
a subject (:class:`~habitrun.planner.decision.Stored`) becomes a status and a
reason in :func:`habitrun.planner.decision.decide`. Afterwards a done subject
whose upstream result was since replaced by a different one is made stale
(:func:`mark_upstream_changed`).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from habitrun.planner.decision import Reason, Stored, SubjectStatus, decisions
from habitrun.planner.explain import explain, package_changes
from habitrun.planner.stageplan import GROUP_SUBJECT, StagePlan
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.queries import SEP


def judge(
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
    looked up.

    A subject not stored under its key may be stored under a key an older habitrun gave
    the same inputs (``plan.legacy_keys()``): it counts as stored there (a success as done, a
    failure as failed), and is listed in ``plan.adopted`` for `run` to move to today's key.
    """
    groups, details = _stored(plan, candidates, probe, store, prefix)
    _apply(plan, candidates, groups, details, forced)


def _apply(plan: StagePlan, candidates: list[str], groups: dict[Stored, list[str]], details: dict[str, Any],
           forced: frozenset[str]) -> None:
    """Each candidate's status and reason from the decision table, a group of subjects at a time
    (a decision per group: 100,000 pending subjects cost a ``dict.fromkeys``)."""
    table = decisions(plan.policy)
    status, reasons = plan.status, plan.reasons
    usual = table[(Stored.DONE, False)]  # a success under its key: the subjects in no group
    status.update(_all_as(candidates, usual.status))
    if usual.reason is not None:  # resume is off: every subject stored is forced, and says so
        grouped = {sid for sids in groups.values() for sid in sids}
        reasons.update(_texts(usual.reason, plan, [sid for sid in candidates if sid not in grouped], details))
    for stored, sids in groups.items():
        decision = table[(stored, False)]
        status.update(dict.fromkeys(sids, decision.status))
        if decision.reason is not None:
            reasons.update(_texts(decision.reason, plan, sids, details))
    if forced:
        stored_as = {sid: stored for stored, sids in groups.items() for sid in sids if sid in forced}
        for sid in forced.intersection(candidates):
            decision = table[(stored_as.get(sid, Stored.DONE), True)]
            status[sid] = decision.status
            if decision.reason is not None:
                reasons.update(_texts(decision.reason, plan, [sid], details))
            else:
                reasons.pop(sid, None)


_all_as_memo: list[Any] = [None, None, None]  # [candidates, status, dict]: stages share their subjects


def _all_as(candidates: list[str], status: SubjectStatus) -> dict[str, SubjectStatus]:
    """candidate -> ``status``, to copy from: made once for the stages that share a list of
    candidates (a copy of a dict costs a tenth of making it)."""
    memo = _all_as_memo
    if memo[0] is not candidates or memo[1] is not status or len(memo[2]) != len(candidates):
        memo[:] = [candidates, status, dict.fromkeys(candidates, status)]
    return memo[2]


def _texts(reason: Reason, plan: StagePlan, sids: list[str], details: Mapping[str, Any]) -> dict[str, list[str]]:
    """sid -> its reason in words; ``details``: what the store said about each (see :func:`_stored`)."""
    if reason is Reason.KEY_CHANGED:
        return {sid: explain(details[sid], plan.components[sid]) for sid in sids}
    if reason is Reason.RESULT_UNREADABLE:
        return {sid: [reason.text(why=details[sid])] for sid in sids}
    text = reason.text()
    return {sid: [text] for sid in sids}


def _stored(plan: StagePlan, candidates: list[str], probe: Mapping[str, str], store: CheckpointStore | None,
            prefix: str) -> tuple[dict[Stored, list[str]], dict[str, Any]]:
    """The candidates that are not simply a success under their key, grouped by what the store
    holds for them (each group in candidate order); and sid -> detail: why a result is
    unreadable, or the components of the subject's record under another key."""
    done: Container[str]
    done, failed = _outcomes(plan.name, candidates, probe, store, prefix)
    not_done = [] if done is _ALL else [sid for sid in candidates if probe[sid] not in done]
    groups: dict[Stored, list[str]] = {}
    if not_done and store is not None and plan.policy.resume and plan.legacy_keys():
        done, failed = _adopt(plan, not_done, probe, store, done, failed)  # type: ignore[arg-type]  # not _ALL
        not_done = [sid for sid in not_done if probe[sid] not in done]  # an adopted failure stays failed
    details: dict[str, Any] = {}
    bad = store.unreadable(plan.name, prefix) if store is not None else {}
    if bad:
        unreadable = [sid for sid in candidates if probe[sid] in bad and probe[sid] in done]
        groups[Stored.UNREADABLE] = unreadable
        details.update((sid, bad[probe[sid]]) for sid in unreadable)
    if failed:
        groups[Stored.FAILED] = [sid for sid in not_done if probe[sid] in failed]
        missing = [sid for sid in not_done if probe[sid] not in failed]
    else:
        missing = not_done
    if missing and store is not None:
        _missing(plan, missing, store, groups, details)
    else:
        groups[Stored.NOTHING] = missing
    return groups, details


class _Everything:
    """What the store holds when it holds every candidate's probe, done (see :func:`_outcomes`)."""

    def __contains__(self, probe: object) -> bool:
        return True


_ALL = _Everything()
_expected_memo: list[Any] = [None, None, None]  # [candidates, probe, their text]: stages share them


def _outcomes(name: str, candidates: list[str], probe: Mapping[str, str], store: CheckpointStore | None,
              prefix: str) -> tuple[Container[str], set[str]]:
    """(done, failed) probes of the stage in the store; done is ``_ALL`` when the store holds a
    success for every candidate and nothing else in the stage's range.

    That, the usual case, is decided by comparing the store's joined text of the range with
    the probes joined in the same order (by subject id: the order of the stage's index),
    instead of a set of a million keys per stage.
    """
    if store is None:
        return set(), set()
    done_text, failed_text = store.outcome_texts(name, prefix)
    if done_text and not failed_text and candidates and len(candidates) == len(probe):
        memo = _expected_memo
        if memo[0] is not candidates or memo[1] is not probe or len(memo[2]) != len(done_text):
            in_order = getattr(probe, "in_id_order", None)
            text = in_order(candidates, SEP) if in_order is not None else None
            if text is None:
                text = SEP.join(map(probe.__getitem__, sorted(candidates)))
            memo[:] = [candidates, probe, text]
        if done_text == memo[2]:
            return _ALL, set()
    done = set(done_text.split(SEP)) if done_text else set()
    return done, set(failed_text.split(SEP)) if failed_text else set()


def _missing(plan: StagePlan, missing: list[str], store: CheckpointStore, groups: dict[Stored, list[str]],
             details: dict[str, Any]) -> None:
    """Subjects with nothing under their key: a record under another key, one the damaged store
    lost, or nothing at all."""
    latest = store.latest(plan.name)
    lost = store.lost(plan.name)
    if not latest and not lost:
        groups[Stored.NOTHING] = missing
        return
    nothing, other, gone = [], [], []
    for sid in missing:
        seen = latest.get(sid)
        if seen is not None and seen[0] != plan.keys[sid]:
            other.append(sid)
            details[sid] = seen[1]
        elif sid in lost:
            gone.append(sid)
        else:
            nothing.append(sid)
    groups.update({Stored.OTHER_KEY: other, Stored.LOST: gone, Stored.NOTHING: nothing})


def _adopt(plan: StagePlan, not_done: list[str], probe: Mapping[str, str], store: CheckpointStore,
           done: set[str], failed: set[str]) -> tuple[set[str], set[str]]:
    """Subjects stored under an older key (see :func:`judge`): (done, failed) including them.

    The store is asked first: the older keys (their subject parts are a second pass over every
    subject, for found subjects) are made only when it holds records that are not today's."""
    found: dict[str, str] = {}
    ok: dict[str, bool] = {}
    if plan.is_group:
        old_done, old_failed = store.stage_outcomes(plan.name)
        today = plan.keys[GROUP_SUBJECT]
        if not (old_done | old_failed) - {today}:
            return done, failed
        for legacy, _ in plan.legacy_keys().values():
            if legacy != today and (legacy in old_done or legacy in old_failed):
                found[GROUP_SUBJECT] = legacy
                ok[GROUP_SUBJECT] = legacy in old_done
                break
    else:
        for legacy, old_parts in plan.legacy_keys().values():
            old_done, old_failed = store.stage_outcomes(plan.name, legacy + ".")
            if legacy == plan.key_prefix:  # the same stage part: only records not under today's keys count
                old_done, old_failed = old_done.difference(done), old_failed.difference(failed)
            if not old_done and not old_failed:
                continue
            look = old_parts() if old_parts is not None else None
            if look is None:
                if legacy == plan.key_prefix:
                    continue  # the same keys as today's
                look = probe
            for sid in not_done:
                if sid not in found:
                    part = look[sid]
                    if part in old_done or part in old_failed:
                        found[sid] = f"{legacy}.{part}"
                        ok[sid] = part in old_done
    if not found:
        return done, failed
    plan.adopted.update(found)
    done, failed = set(done), set(failed)
    for sid in found:
        (done if ok[sid] else failed).add(probe[sid])
    return done, failed


def mark_upstream_changed(plan: StagePlan, needs: Mapping[str, StagePlan], store: CheckpointStore | None) -> None:
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
        since = _changed_since(plan, up, changed)
        since = {sid: at for sid, at in since.items() if status.get(sid) is SubjectStatus.DONE}
        if not since:
            continue
        written = store.written_at([plan.keys[sid] for sid in since])
        for sid, at in since.items():
            if written.get(plan.keys[sid], at) < at:
                status[sid] = SubjectStatus.STALE
                reasons[sid] = [Reason.UPSTREAM_RESULT_CHANGED.text(name=name)]


def _changed_since(plan: StagePlan, up: StagePlan, changed: Mapping[str, tuple[str, float]]) -> dict[str, float]:
    """This stage's subject -> when the upstream result it takes last changed."""
    if up.is_group:
        entry = changed.get(up.keys.get(GROUP_SUBJECT, ""))
        return dict.fromkeys(plan.status, entry[1]) if entry is not None else {}
    if plan.is_group:
        members = set(plan.members)
        times = [at for key, (sid, at) in changed.items() if sid in members and up.keys.get(sid) == key]
        return {GROUP_SUBJECT: max(times)} if times else {}
    return {sid: at for key, (sid, at) in changed.items() if up.keys.get(sid) == key}


def stage_package_changes(plan: StagePlan, packages: Mapping[str, str] | None, store: CheckpointStore | None) -> list[str]:
    """Package versions (``packages``: those the stage's code imports now, when they are not in
    its key) that differ from those its stored results of this key were computed with."""
    if not packages or store is None:
        return []
    if not any(st is SubjectStatus.DONE for st in plan.status.values()):
        return []
    if plan.is_group:
        seen = store.stage_packages(plan.name, key=plan.keys[GROUP_SUBJECT])
    else:
        seen = store.stage_packages(plan.name, prefix=plan.key_prefix + ".")
    out: list[str] = []
    for old in seen:
        for change in package_changes(old, packages):
            if change not in out:
                out.append(change)
    return out
