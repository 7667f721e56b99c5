"""A plan's data: per stage and subject a status, a key and why (see :mod:`habitrun.planner.plan`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from habitrun.planner.components import LazyComponents
from habitrun.planner.decision import Reason, SubjectStatus
from habitrun.spec.policy import RunPolicy
from habitrun.store.jsontext import compact

GROUP_SUBJECT = "*"  # the one pseudo subject of a collect or train stage
GROUP_KINDS = ("collect", "train")

UNAVAILABLE = (SubjectStatus.FAILED, SubjectStatus.BLOCKED)  # what downstream stages cannot have
_RUNS = (SubjectStatus.PENDING, SubjectStatus.STALE, SubjectStatus.FORCED)
_UNREADABLE = Reason.RESULT_UNREADABLE.text(why="")

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
    # The keys older habitruns gave the same inputs, per generation (see planner.context
    # BEFORE_10, BEFORE_31): (map: its stage part, group: the whole key; a call that gives
    # the subject parts of a map stage's keys then, None when they are today's). Results
    # stored under one count as done and `run` moves them to today's key.
    # Made when first asked (:meth:`legacy_keys`): only a plan with something not done looks.
    legacy: Callable[[], dict[str, tuple[str, Any]]] | None = None
    _legacy_made: dict[str, tuple[str, Any]] | None = None
    adopted: dict[str, str] = field(default_factory=dict)  # subject -> its result's older key
    variant: Any = None  # which subject parts the keys use (see planner.context)
    package_changes: list[str] = field(default_factory=list)  # "numpy 1.26.4 → 2.1.0" (not in the key)

    def legacy_keys(self) -> dict[str, tuple[str, Any]]:
        """generation -> (older stage part or group key, older subject parts or None): see ``legacy``."""
        if self._legacy_made is None:
            self._legacy_made = self.legacy() if self.legacy is not None else {}
        return self._legacy_made

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

    def unreadable(self) -> dict[str, str]:
        """Stale subjects whose stored success fails its check: subject -> the reason in words.

        Their record says done, by whichever run stored it: only the plan knows the result
        cannot be read, so a resume must not take that record as finished work."""
        if SubjectStatus.STALE not in self.status.values():
            return {}
        return {sid: why[0] for sid, why in self.reasons.items()
                if why and why[0].startswith(_UNREADABLE) and self.status.get(sid) is SubjectStatus.STALE}

    def counts(self) -> dict[str, int]:
        """Subjects per status (list.count compares by identity first: C speed for 100,000); no
        pass once every subject is counted (all done: one pass, not one per status)."""
        values = list(self.status.values())
        out, left = {}, len(values)
        for status in SubjectStatus:
            out[status.value] = n = values.count(status) if left else 0
            left -= n
        return out

    def unavailable(self) -> set[str]:
        """Subjects whose result downstream stages cannot have (failed or blocked)."""
        values = self.status.values()
        if SubjectStatus.FAILED not in values and SubjectStatus.BLOCKED not in values:
            return set()
        return {s for s, st in self.status.items() if st in UNAVAILABLE}

    def components_json(self, subject_id: str) -> str:
        """A subject's key components as compact JSON, as the store keeps them with its record."""
        components = self.components
        if isinstance(components, LazyComponents):
            return components.json(subject_id)
        return compact(components.get(subject_id, {}))

    @property
    def parts(self) -> Mapping[str, str]:
        """A map stage's subject parts: subject -> the part of its key after the stage part."""
        return self.keys.parts  # type: ignore[attr-defined]  # a map stage's keys are a KeyMap

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
