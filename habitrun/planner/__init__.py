"""Planning layer: cache keys, and stored state -> work per stage (imports spec, store)."""

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
