"""The registry of stage kinds: the one place a stage's ``kind`` name is looked up.

Everything kind-specific the engine does goes through the kind object this
gives (engine/stage_kind.py). Adding a kind: its class, one line in KINDS,
and its name in spec/recipe.py's ``StageKind`` (plus planner/stageplan.py's
``GROUP_KINDS`` when it gives one result); tests/engine/test_stage_kinds.py
checks the three agree.
"""

from __future__ import annotations

from habitrun.engine.map_stage import CollectStage, MapStage
from habitrun.engine.stage_kind import StageKind
from habitrun.engine.train_stage import TrainStage
from habitrun.planner.plan import StagePlan
from habitrun.spec.recipe import StageSpec

KINDS: dict[str, StageKind] = {kind.name: kind for kind in (MapStage(), CollectStage(), TrainStage())}


def kind_of(stage: StageSpec | StagePlan) -> StageKind:
    """The kind object of a stage (or of its plan)."""
    return KINDS[stage.kind]
