"""Planning layer: cache keys, and stored state -> work per stage (imports spec, store).

The names below are imported on first use, not with the package: every
``habitrun.planner.<module>`` import runs this file first, and `validate`, which
needs only the stage inputs of :mod:`habitrun.planner.context`, should not pay
for the planner proper and the checkpoint store it reads (about 10 ms).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from habitrun.planner.keys import group_key, stage_identity, subject_key
    from habitrun.planner.plan import (
        GROUP_SUBJECT,
        Plan,
        StagePlan,
        SubjectStatus,
        fingerprints,
        plan_stage,
        plan_study,
    )

_KEYS = ("group_key", "stage_identity", "subject_key")
_PLAN = ("GROUP_SUBJECT", "Plan", "StagePlan", "SubjectStatus", "fingerprints", "plan_stage", "plan_study")

__all__ = [
    "GROUP_SUBJECT",
    "Plan",
    "StagePlan",
    "SubjectStatus",
    "fingerprints",
    "group_key",
    "plan_stage",
    "plan_study",
    "stage_identity",
    "subject_key",
]


def __getattr__(name: str) -> Any:
    if name in _KEYS:
        return getattr(importlib.import_module("habitrun.planner.keys"), name)
    if name in _PLAN:
        return getattr(importlib.import_module("habitrun.planner.plan"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
