"""The recipe models: the YAML a study checks into its repository.

These models validate structure and the stage graph. Reading the file
(positions, interpolation, overrides) lives in :mod:`habitrun.spec.loader`.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from habitrun.spec.policy import RunPolicy

RECIPE_VERSION = 1
STAGE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*([:.][A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$"

StageKind = Literal["map", "collect", "train"]
StdStream = Literal["none", "out", "err", "all"]


def _optional_policy_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, info in RunPolicy.model_fields.items():
        fields[name] = (Optional[info.annotation], Field(default=None, description=info.description))  # noqa: UP045
    return fields


PolicyOverride = create_model(  # type: ignore[call-overload]
    "PolicyOverride",
    __config__=ConfigDict(frozen=True, extra="forbid"),
    __doc__="A stage's partial RunPolicy: the fields it sets replace the recipe's.",
    **_optional_policy_fields(),
)


class SubjectsSpec(BaseModel):
    """Where the subjects come from and which of them run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    manifest: str = Field(description="Manifest file (.csv .tsv .json .jsonl .yaml), relative to the recipe.")
    id: str = Field(default="subject_id", description="Column holding the subject id.")
    include: Optional[tuple[str, ...]] = Field(default=None, description="Only these ids (null: all).")  # noqa: UP045
    exclude: tuple[str, ...] = Field(default=(), description="Ids to leave out.")

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            for item in value:
                if not isinstance(item, (str, int)) or isinstance(item, bool):
                    raise ValueError(f"subject ids must be strings, got {item!r}")
            return tuple(str(v) for v in value)
        return value


class LaunchSpec(BaseModel):
    """How a train stage's rank group starts (torchrun's options)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nproc_per_node: int = Field(default=1, ge=1, description="Ranks on this machine.")
    max_restarts: int = Field(default=0, ge=0, description="Restarts of the whole group after a rank fails.")
    redirects: StdStream | dict[int, StdStream] = Field(default="none", description="Streams written only to the rank's log file (none/out/err/all, or per rank).")
    tee: StdStream | dict[int, StdStream] = Field(default="all", description="Streams written to the log file and to the console with a rank prefix.")
    local_ranks_filter: Optional[tuple[int, ...]] = Field(default=None, description="Ranks whose output reaches the console (null: all).")  # noqa: UP045
    monitor_interval_sec: float = Field(default=0.1, gt=0, description="How often the group is checked.")
    start_method: Literal["spawn", "forkserver", "fork"] = Field(default="spawn", description="How function ranks start.")
    timeout_sec: Optional[float] = Field(default=None, gt=0, description="Wall-clock budget of one attempt (null: none).")  # noqa: UP045


class StageSpec(BaseModel):
    """One stage: a map over subjects, a collect of all results, or a train rank group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=STAGE_NAME_PATTERN, description="Unique stage name (a folder name too).")
    kind: StageKind = Field(default="map", description="map: per subject; collect: all results into one; train: a rank group.")
    operator: Optional[str] = Field(default=None, pattern=IMPORT_PATH_PATTERN, description="'module:attr' or 'module.attr' (map and collect).")  # noqa: UP045
    entrypoint: Optional[str] = Field(default=None, pattern=IMPORT_PATH_PATTERN, description="'module:function' run on every rank (train).")  # noqa: UP045
    command: Optional[tuple[str, ...]] = Field(default=None, min_length=1, description="argv run on every rank, never through a shell (train).")  # noqa: UP045
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the operator.")
    needs: tuple[str, ...] = Field(default=(), description="Stages whose results this stage reads.")
    policy: Optional[PolicyOverride] = Field(default=None, description="Fields of the recipe's policy this stage overrides.")  # type: ignore[valid-type]  # noqa: UP045
    launch: Optional[LaunchSpec] = Field(default=None, description="Rank-group options (train).")  # noqa: UP045

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> StageSpec:
        if self.kind in ("map", "collect"):
            if self.operator is None:
                raise ValueError(f"a {self.kind} stage needs an 'operator'")
            for extra in ("entrypoint", "command", "launch"):
                if getattr(self, extra) is not None:
                    raise ValueError(f"'{extra}' belongs to train stages, not to a {self.kind} stage")
        else:
            if self.operator is not None:
                raise ValueError("a train stage takes 'entrypoint' or 'command', not 'operator'")
            if (self.entrypoint is None) == (self.command is None):
                raise ValueError("a train stage needs exactly one of 'entrypoint' or 'command'")
        if self.kind == "collect" and not self.needs:
            raise ValueError("a collect stage needs at least one stage in 'needs'")
        if len(set(self.needs)) != len(self.needs):
            raise ValueError("'needs' lists a stage twice")
        return self

    def policy_override(self) -> dict[str, Any]:
        """The fields this stage sets explicitly."""
        if self.policy is None:
            return {}
        return self.policy.model_dump(exclude_unset=True)


class Recipe(BaseModel):
    """A whole study: subjects, policy and stages."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    habitrun: Literal[1] = Field(description="Recipe format version.")
    name: str = Field(min_length=1, description="Study name.")
    description: Optional[str] = None  # noqa: UP045
    vars: dict[str, Any] = Field(default_factory=dict, description="Values used as ${vars.NAME}.")
    subjects: SubjectsSpec
    policy: RunPolicy = Field(default_factory=RunPolicy)
    run_dir: Optional[str] = Field(default=None, description="Folder for runs, store and lock (default: .habitrun beside the recipe).")  # noqa: UP045
    stages: tuple[StageSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _stage_graph(self) -> Recipe:
        names = [s.name for s in self.stages]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(f"two stages are named {name!r}")
            seen.add(name)
        for stage in self.stages:
            for need in stage.needs:
                if need not in seen:
                    close = _closest(need, names)
                    hint = f" (did you mean {close!r}?)" if close else ""
                    raise ValueError(f"stage {stage.name!r} needs unknown stage {need!r}{hint}")
                if need == stage.name:
                    raise ValueError(f"stage {stage.name!r} needs itself")
        cycle = _find_cycle({s.name: s.needs for s in self.stages})
        if cycle:
            raise ValueError("the stages' needs form a cycle: " + " -> ".join(cycle))
        for stage in self.stages:
            for need in stage.needs:
                if self.stage(need).kind == "train" and stage.kind == "map":
                    raise ValueError(f"map stage {stage.name!r} cannot need train stage {need!r}")
            try:
                self.policy.merged(stage.policy_override())
            except ValueError as exc:
                raise ValueError(f"stage {stage.name!r}: its policy override makes an invalid policy: {exc}") from None
        return self

    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def stage_policy(self, name: str) -> RunPolicy:
        """The recipe policy with the stage's override merged over it."""
        return self.policy.merged(self.stage(name).policy_override())

    def ordered_stages(self) -> list[StageSpec]:
        """Stages in an order where every stage comes after the stages it needs (stable)."""
        done: set[str] = set()
        order: list[StageSpec] = []
        remaining = list(self.stages)
        while remaining:
            for stage in remaining:
                if all(n in done for n in stage.needs):
                    order.append(stage)
                    done.add(stage.name)
                    remaining.remove(stage)
                    break
        return order


def _find_cycle(graph: dict[str, tuple[str, ...]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None and nxt in graph:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if state.get(node) is None:
            found = visit(node)
            if found:
                return found
    return None


def _closest(word: str, choices: list[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return match[0] if match else None


STAGE_NAME_RE = re.compile(STAGE_NAME_PATTERN)
