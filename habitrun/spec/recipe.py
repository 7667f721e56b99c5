"""The recipe models: the YAML a study checks into its repository.

These models validate structure and the stage graph. Reading the file
(positions, interpolation, overrides) lives in :mod:`habitrun.spec.loader`.
"""

from __future__ import annotations

import heapq
from functools import cached_property
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from habitrun.spec.located import LocatedError
from habitrun.spec.policy import MAX_WAIT_SEC, RunPolicy, expand_retry_kinds, ids_as_strings

STAGE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*([:.][A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$"

StageKind = Literal["map", "collect", "train"]
# A command map stage's operator: habitrun's own class, so a tool runs under every guarantee a
# Python operator has (timeout, memory limit, retries, isolation, logs, resume, trace).
COMMAND_OPERATOR = "habitrun.engine.command.operator:CommandOperator"
ContainerEngine = Literal["apptainer", "singularity", "podman", "docker", "bwrap"]
_COMMAND_ONLY = ("outputs", "env", "shell", "version", "container")
StdStream = Literal["none", "out", "err", "all"]
FileNeed = Literal["required", "optional"]


def _optional_policy_fields() -> dict[str, Any]:
    """Every RunPolicy field with its type and bounds, unset by default.

    The default (None) is never validated, so "not given" needs no Optional,
    and an explicit ``workers: null`` or ``workers: 0`` is caught at its line.
    """
    fields: dict[str, Any] = {}
    for name, info in RunPolicy.model_fields.items():
        annotation: Any = info.annotation
        if info.metadata:
            parts = (annotation, *info.metadata)
            annotation = Annotated[parts]
        fields[name] = (annotation, Field(default=None, description=info.description))
    return fields


PolicyOverride = create_model(
    "PolicyOverride",
    __config__=ConfigDict(frozen=True, extra="forbid"),
    __doc__="A stage's partial RunPolicy: the fields it sets replace the recipe's.",
    __validators__={"_all_kinds": field_validator("auto_retry_on", mode="before")(expand_retry_kinds)},
    **_optional_policy_fields(),
)


FromTemplates = Union[str, tuple[str, ...], dict[str, str]]  # noqa: UP007
SessionMode = Literal["optional", "required", "none"]
Delimiter = Literal[",", ";", "\t", "|"]
_BIDS_KEYS = ("datatype", "suffix", "session", "extension")
_FOUND_KEYS = ("pivot", "required", "fields")


class SubjectsSpec(BaseModel):
    """Where the subjects come from (a manifest, files found on disk, a BIDS tree) and which of them run."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    manifest: Optional[str] = Field(default=None, description="Manifest file (.csv .tsv .json .jsonl .yaml), relative to the recipe; with 'from' or 'bids', joined on the id and adds its columns.")  # noqa: UP045
    from_: Optional[FromTemplates] = Field(default=None, alias="from", description="Path template(s) with named fields, relative to the recipe: 'data/{subject}/{modality}.nii.gz'; a list is merged per subject; a mapping names each template's file column.")  # noqa: UP045
    bids: Optional[str] = Field(default=None, description="A BIDS folder, relative to the recipe: subjects are sub-<label>[_ses-<label>], one column per suffix.")  # noqa: UP045
    datatype: Optional[str] = Field(default=None, pattern=r"^[a-z]+$", description="With bids: the datatype folder (anat, func, dwi ...).")  # noqa: UP045
    suffix: Optional[tuple[str, ...]] = Field(default=None, min_length=1, description="With bids: the suffixes to find (T1w, bold, mask ...): one file column each.")  # noqa: UP045
    session: SessionMode = Field(default="optional", description="With bids: ses-<label> folders optional, required, or none.")
    extension: tuple[str, ...] = Field(default=(".nii.gz", ".nii"), min_length=1, description="With bids: file extensions that match.")
    delimiter: Optional[Delimiter] = Field(default=None, description="A .csv/.tsv manifest's field separator: ',', ';', tab (\"\\t\") or '|'; null: the suffix's own (',' / tab), or the one found in the header line when it lacks that (Excel writes ';').")  # noqa: UP045
    id: str = Field(default="subject_id", description="The id: a manifest column (default subject_id) or, with 'from', a template field (default subject).")
    pivot: Optional[str] = Field(default=None, description="With 'from': the field whose values become file columns (one row per id).")  # noqa: UP045
    required: tuple[str, ...] = Field(default=(), description="With 'from' or 'bids': columns a subject must have; one missing is reported and not run.")
    fields: dict[str, str] = Field(default_factory=dict, description="With 'from' or 'bids': a regex per field (default [^/]+; a field never crosses '/').")
    include: Optional[tuple[str, ...]] = Field(default=None, description="Only these ids (null: all).")  # noqa: UP045
    exclude: tuple[str, ...] = Field(default=(), description="Ids to leave out.")
    files: Optional[Union[tuple[str, ...], dict[str, FileNeed]]] = Field(  # noqa: UP007, UP045
        default=None,
        description="Manifest columns whose values are input files (paths relative to the recipe, several separated by ';', a folder meaning every file under it): a list (each required) or {column: required|optional}. Their content enters the subjects' keys.",
    )

    def file_columns(self) -> dict[str, bool]:
        """column -> required, for every column named in ``files``."""
        if self.files is None:
            return {}
        if isinstance(self.files, dict):
            return {col: need == "required" for col, need in self.files.items()}
        return dict.fromkeys(self.files, True)

    @field_validator("files")
    @classmethod
    def _files_once(cls, value: Any) -> Any:
        if isinstance(value, tuple):
            for i, col in enumerate(value):
                if col in value[:i]:
                    raise ValueError(f"files lists column {col!r} twice")
        return value

    @model_validator(mode="before")
    @classmethod
    def _id_default(cls, data: Any) -> Any:
        """With 'from' the id is a template field, 'subject' unless given."""
        if isinstance(data, dict) and "from" in data and "id" not in data:
            return {**data, "id": "subject"}
        return data

    @field_validator("suffix", "extension", "required", mode="before")
    @classmethod
    def _one_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        return ids_as_strings(value)

    @property
    def found(self) -> bool:
        """Subjects come from files on disk ('from' or 'bids'), not from the manifest alone."""
        return self.from_ is not None or self.bids is not None

    def templates(self) -> list[tuple[tuple[Any, ...], str | None, str]]:
        """(field path of the template in the recipe, its file column or None, template text)."""
        if self.bids is not None:
            from habitrun.spec.bids import bids_templates

            return [(("bids",), None, text) for text in bids_templates(self)]
        if isinstance(self.from_, str):
            return [(("from",), None, self.from_)]
        if isinstance(self.from_, tuple):
            return [(("from", i), None, text) for i, text in enumerate(self.from_)]
        if isinstance(self.from_, dict):
            return [(("from", name), name, text) for name, text in self.from_.items()]
        return []

    def patterns(self) -> dict[str, str]:
        """Each field's regex: the recipe's, or the BIDS entity's."""
        if self.bids is not None:
            from habitrun.spec.bids import bids_patterns

            return bids_patterns(self)
        return dict(self.fields)

    @model_validator(mode="after")
    def _sources(self) -> SubjectsSpec:
        problems: list[tuple[tuple[Any, ...], str]] = []
        given = self.model_fields_set
        if self.bids is not None and self.from_ is not None:
            problems.append((("bids",), "give either 'from' (path templates) or 'bids' (a BIDS folder), not both"))
        if self.manifest is None and not self.found:
            problems.append(((), "missing required key 'manifest' (or 'from' to find subjects from files, or 'bids')"))
        if self.bids is None:
            problems += [((k,), f"{k!r} belongs to 'bids' (a BIDS folder)") for k in _BIDS_KEYS if k in given]
        if not self.found:
            problems += [((k,), f"{k!r} belongs to 'from' (path templates) or 'bids'")
                         for k in _FOUND_KEYS if k in given and getattr(self, k)]
        if self.bids is not None:
            if self.datatype is None:
                problems.append(((), "missing required key 'datatype' (with bids: anat, func, dwi ...)"))
            if self.suffix is None:
                problems.append(((), "missing required key 'suffix' (with bids: e.g. [T1w, mask])"))
            for k in ("id", "pivot"):
                if k in given:
                    problems.append(((k,), f"{k!r} is fixed with bids (id sub-<label>[_ses-<label>], one column per suffix)"))
        if problems:
            raise LocatedError(problems)
        if self.found:
            from habitrun.spec.found_checks import check_found

            problems += check_found(self)
        if problems:
            raise LocatedError(problems)
        return self


class LaunchSpec(BaseModel):
    """How a train stage's rank group starts (torchrun's options)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nproc_per_node: int = Field(default=1, ge=1, description="Ranks on this machine.")
    max_restarts: int = Field(default=0, ge=0, description="Restarts of the whole group after a rank fails.")
    redirects: StdStream | dict[int, StdStream] = Field(default="none", description="Streams written only to the rank's log file (none/out/err/all, or per rank).")
    tee: StdStream | dict[int, StdStream] = Field(default="all", description="Streams written to the log file and to the console with a rank prefix.")
    local_ranks_filter: Optional[tuple[int, ...]] = Field(default=None, description="Ranks whose output reaches the console (null: all).")  # noqa: UP045
    monitor_interval_sec: float = Field(default=0.1, gt=0, le=MAX_WAIT_SEC, description="How often the group is checked.")
    start_method: Literal["spawn", "forkserver", "fork"] = Field(default="spawn", description="How function ranks start.")
    timeout_sec: Optional[float] = Field(default=None, gt=0, le=MAX_WAIT_SEC, description="Wall-clock budget of one attempt (null: none).")  # noqa: UP045
    nnodes: int = Field(default=1, ge=1, description="Nodes, one launcher agent each (c10d rendezvous; needs 'via' when more than 1).")
    via: Optional[Literal["local", "srun"]] = Field(default=None, description="How the node agents start: srun (one per node of the SLURM allocation) or local (all on this machine, to try it out); null: one node, no agent.")  # noqa: UP045
    rdzv_endpoint: Optional[str] = Field(default=None, pattern=r"^[^\s:]+:\d{1,5}$", description="host:port of the rendezvous store (null: the allocation's first host with srun, 127.0.0.1 locally; a free port).")  # noqa: UP045
    rdzv_timeout_sec: float = Field(default=900.0, gt=0, le=MAX_WAIT_SEC, description="How long the node agents wait for each other at every (re)start.")

    @model_validator(mode="after")
    def _nodes_need_a_way_to_start(self) -> LaunchSpec:
        if self.nnodes > 1 and self.via is None:
            raise ValueError(f"nnodes={self.nnodes} needs 'via': srun (one agent per node of the SLURM "
                             "allocation) or local (all agents on this machine)")
        if self.via is not None and self.timeout_sec is not None:
            raise ValueError("timeout_sec applies to one-node groups only; under 'via' use the "
                             "allocation's wall time (sbatch --time)")
        return self


PUBLISH_DEFAULT_DIR = "results/{stage}"
PublishMode = Literal["copy", "link"]


class PublishSpec(BaseModel):
    """Where a stage's current result files are copied (or hard-linked) in the study, under stable names.

    ``publish: true`` is ``{to: results/{stage}}``; ``publish: some/folder`` sets ``to``.
    Publishing never enters a key: changing it reruns nothing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: str = Field(default=PUBLISH_DEFAULT_DIR, min_length=1, description="Folder relative to the recipe's folder (or absolute); '{stage}' is the stage's name.")
    mode: PublishMode = Field(default="copy", description="copy: files of their own (safe to edit); link: hard links to the stored files (no extra space; never edit them in place), copied where a link cannot be made.")

    @field_validator("to")
    @classmethod
    def _only_the_stage_placeholder(cls, value: str) -> str:
        try:
            value.format(stage="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"'to' may hold only the placeholder {{stage}} ({exc!s} in {value!r})") from None
        return value


def _publish_shorthand(value: Any) -> Any:
    """``true`` → the default folder; ``false``/null → not published; a string → that folder."""
    if value is True:
        return PublishSpec()
    if value is False:
        return None
    if isinstance(value, str):
        return {"to": value}
    return value


class ContainerSpec(BaseModel):
    """Where a command stage's tool runs: an image and the engine that runs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(min_length=1, description="podman/docker: an image reference (localhost/name:tag); apptainer/singularity: a .sif file or sandbox folder; bwrap: an unpacked root file system folder (paths relative to the recipe).")
    engine: Optional[ContainerEngine] = Field(default=None, description="apptainer, singularity, podman, docker or bwrap; null: the first of apptainer, singularity, podman, docker found on PATH (bwrap for a folder image when none is).")  # noqa: UP045
    binds: tuple[str, ...] = Field(default=(), description="More host folders bound read-only at the same path (data roots outside the study); relative to the recipe.")
    network: bool = Field(default=False, description="Give the tool the network (off unless asked).")
    engine_options: tuple[str, ...] = Field(default=(), description="Arguments put right after the engine's name (podman: --runtime runc --storage-driver vfs ...).")
    run_options: tuple[str, ...] = Field(default=(), description="Arguments put after 'run'/'exec' (podman: --ulimit nofile=1024:1024 ...).")


class StageSpec(BaseModel):
    """One stage: a map over subjects, a collect of all results, or a train rank group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=STAGE_NAME_PATTERN, description="Unique stage name (a folder name too).")
    kind: StageKind = Field(default="map", description="map: per subject; collect: all results into one; train: a rank group.")
    operator: Optional[str] = Field(default=None, pattern=IMPORT_PATH_PATTERN, description="'module:attr' or 'module.attr' (map and collect).")  # noqa: UP045
    entrypoint: Optional[str] = Field(default=None, pattern=IMPORT_PATH_PATTERN, description="'module:function' run on every rank (train).")  # noqa: UP045
    command: Optional[tuple[str, ...]] = Field(default=None, min_length=1, description="train: argv run on every rank; map: the tool's argv per subject, with placeholders ({subject}, {workdir}, {threads}, a manifest column, {params.NAME}, {STAGE.OUTPUT}); never through a shell unless 'shell' is true.")  # noqa: UP045
    outputs: Optional[dict[str, Union[str, tuple[str, ...]]]] = Field(default=None, description="A command map stage's outputs: name -> a path or glob in the work folder that must match one file, or a list of globs (each matching at least one); the subject's result is {name: path(s)}.")  # noqa: UP007, UP045
    env: Optional[dict[str, str]] = Field(default=None, description="Environment variables set for the command (placeholders allowed).")  # noqa: UP045
    shell: bool = Field(default=False, description="Run the command through /bin/sh -c, every substituted value quoted (an explicit opt-in).")
    version: Optional[tuple[str, ...]] = Field(default=None, min_length=1, description="argv printing the tool's version ([dcm2niix, -v]): its output enters the key; null: the executable's content does.")  # noqa: UP045
    container: Optional[ContainerSpec] = Field(default=None, description="Run the command in a container (image, engine); the image's identity enters the key.")  # noqa: UP045
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the operator.")
    needs: tuple[str, ...] = Field(default=(), description="Stages whose results this stage reads.")
    policy: Optional[PolicyOverride] = Field(default=None, description="Fields of the recipe's policy this stage overrides.")  # type: ignore[valid-type]  # noqa: UP045
    launch: Optional[LaunchSpec] = Field(default=None, description="Rank-group options (train).")  # noqa: UP045
    inputs: tuple[str, ...] = Field(default=(), description="Files the stage reads that are not in the manifest (an atlas, a checkpoint): paths or globs relative to the recipe; their content enters every key of the stage.")
    fields: Optional[tuple[str, ...]] = Field(default=None, description="The manifest columns this stage uses: only these enter its keys (null: every column).")  # noqa: UP045
    code_version: Optional[str] = Field(default=None, min_length=1, description="Replaces the automatic code fingerprint: only this text counts for the code (bump it to rerun).")  # noqa: UP045
    publish: Optional[PublishSpec] = Field(default=None, description="Copy the stage's current result files into the study after it runs: true (to results/<stage>/), a folder, or {to, mode}.")  # noqa: UP045

    _publish_forms = field_validator(  # the schema admits the shorthands too
        "publish", mode="before", json_schema_input_type=Union[bool, str, PublishSpec, None],  # noqa: UP007
    )(_publish_shorthand)

    @field_validator("code_version", mode="before")
    @classmethod
    def _number_as_version(cls, value: Any) -> Any:
        """``code_version: 2`` is the text "2"."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _command_operator(cls, data: Any) -> Any:
        """A map stage with a ``command`` runs it through habitrun's own operator."""
        if isinstance(data, dict) and data.get("kind", "map") == "map" and data.get("command") is not None:
            if data.get("operator") in (None, COMMAND_OPERATOR):
                return {**data, "operator": COMMAND_OPERATOR}
        return data

    @property
    def runs_command(self) -> bool:
        """A map stage that runs a command-line tool (through :data:`COMMAND_OPERATOR`)."""
        return self.kind == "map" and self.command is not None

    @field_validator("command", "version", mode="before")
    @classmethod
    def _numbers_as_arguments(cls, value: Any) -> Any:
        """``--epochs, 5`` or ``"${vars.epochs}"`` (a number) is the argument "5"."""
        if isinstance(value, (list, tuple)):
            return tuple(
                str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value
            )
        return value

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> StageSpec:
        problems: list[tuple[tuple[Any, ...], str]] = []
        if self.runs_command:
            if self.operator != COMMAND_OPERATOR:
                problems.append((("operator",), "a map stage takes 'operator' or 'command', not both"))
            from habitrun.spec.placeholders import command_problems

            problems += command_problems(self)
        elif any(getattr(self, k) not in (None, False) for k in _COMMAND_ONLY):
            for k in _COMMAND_ONLY:
                if getattr(self, k) not in (None, False):
                    problems.append(((k,), f"'{k}' belongs to a map stage with a 'command', not to a "
                                           f"{self.kind} stage{' with an operator' if self.kind == 'map' else ''}"))
        if self.kind in ("map", "collect"):
            if self.operator is None:
                problems.append((("operator",), f"a {self.kind} stage needs an 'operator' ('module:attribute') "
                                                "or, for a map stage, a 'command'"))
            for extra in ("entrypoint", "command", "launch"):
                if getattr(self, extra) is not None and not (extra == "command" and self.runs_command):
                    problems.append(((extra,), f"'{extra}' belongs to train stages, not to a {self.kind} stage"))
        else:
            if self.operator is not None:
                problems.append((("operator",), "a train stage takes 'entrypoint' or 'command', not 'operator'"))
            if (self.entrypoint is None) == (self.command is None):
                where = ("command",) if self.command is not None else ("kind",)
                problems.append((where, "a train stage needs exactly one of 'entrypoint' or 'command'"))
        if self.kind == "collect" and not self.needs:
            problems.append((("kind",), "a collect stage needs at least one stage in 'needs'"))
        for i, col in enumerate(self.fields or ()):
            if col in (self.fields or ())[:i]:
                problems.append((("fields", i), f"'fields' lists column {col!r} twice"))
        for i, need in enumerate(self.needs):
            if need in self.needs[:i]:
                problems.append((("needs", i), f"'needs' lists stage {need!r} twice"))
        if problems:
            raise LocatedError(problems)
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
        problems: list[tuple[tuple[Any, ...], str]] = []
        names = [s.name for s in self.stages]
        first: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in first:
                problems.append((("stages", i, "name"), f"two stages are named {name!r} (stages[{first[name]}] and stages[{i}])"))
            first.setdefault(name, i)
        for i, stage in enumerate(self.stages):
            for j, need in enumerate(stage.needs):
                if need == stage.name:
                    problems.append((("stages", i, "needs", j), f"stage {stage.name!r} needs itself"))
                elif need not in first:
                    close = _closest(need, names)
                    hint = f" (did you mean {close!r}?)" if close else ""
                    problems.append((("stages", i, "needs", j), f"stage {stage.name!r} needs unknown stage {need!r}{hint}"))
                elif self.stages[first[need]].kind == "train" and stage.kind == "map":
                    problems.append((("stages", i, "needs", j), f"map stage {stage.name!r} cannot need train stage {need!r} (a train stage has no per-subject results)"))
        if not problems:
            cycle = _find_cycle({s.name: s.needs for s in self.stages})
            if cycle:
                i = first[cycle[0]]
                problems.append((("stages", i, "needs"), "the stages' needs form a cycle: " + " -> ".join(cycle)))
        for i, stage in enumerate(self.stages):
            try:
                self.policy.merged(stage.policy_override())
            except ValidationError as exc:
                for err in exc.errors():
                    inner = (err.get("ctx") or {}).get("error")
                    subs = inner.items if isinstance(inner, LocatedError) else [(tuple(err["loc"]), err["msg"])]
                    own = stage.policy_override()
                    for sub, message in subs:
                        at = ("stages", i, "policy", *sub) if sub and sub[0] in own else ("stages", i, "policy")
                        problems.append((at, f"merged over the recipe's policy, this override is invalid: {message}"))
        if problems:
            raise LocatedError(problems)
        return self

    @cached_property
    def stage_index(self) -> dict[str, StageSpec]:
        """Stage name -> stage: a lookup per stage must not scan every stage (2000 stages: 4 million steps)."""
        index: dict[str, StageSpec] = {}
        for stage in self.stages:
            index.setdefault(stage.name, stage)
        return index

    @cached_property
    def policy_by_stage(self) -> dict[str, RunPolicy]:
        """Each stage's merged policy, filled by :meth:`stage_policy` as it is asked."""
        return {}

    def stage(self, name: str) -> StageSpec:
        try:
            return self.stage_index[name]
        except KeyError:
            raise KeyError(name) from None

    def stage_policy(self, name: str) -> RunPolicy:
        """The recipe policy with the stage's override merged over it (merged once per stage)."""
        merged = self.policy_by_stage.get(name)
        if merged is None:
            merged = self.policy_by_stage[name] = self.policy.merged(self.stage(name).policy_override())
        return merged

    def ordered_stages(self) -> list[StageSpec]:
        """Stages in an order where every stage comes after the stages it needs (stable: of the
        stages whose needs are met, the first in the recipe comes next)."""
        waiting = {stage.name: len(set(stage.needs)) for stage in self.stages}
        needed_by: dict[str, list[int]] = {}
        for i, stage in enumerate(self.stages):
            for need in set(stage.needs):
                needed_by.setdefault(need, []).append(i)
        ready = [i for i, stage in enumerate(self.stages) if not waiting[stage.name]]
        heapq.heapify(ready)
        order: list[StageSpec] = []
        while ready:
            stage = self.stages[heapq.heappop(ready)]
            order.append(stage)
            for i in needed_by.get(stage.name, ()):
                name = self.stages[i].name
                waiting[name] -= 1
                if not waiting[name]:
                    heapq.heappush(ready, i)
        return order


def _find_cycle(graph: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A cycle of needs (``[a, b, a]``), or None. Depth-first without recursion: a chain of
    thousands of stages listed last-first is as deep as it is long."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in graph:
        if state.get(root) is not None:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(graph.get(root, ()))]
        while pending:
            for nxt in pending[-1]:
                if state.get(nxt) == 1:
                    return path[path.index(nxt):] + [nxt]
                if state.get(nxt) is None and nxt in graph:
                    state[nxt] = 1
                    path.append(nxt)
                    pending.append(iter(graph.get(nxt, ())))
                    break
            else:
                state[path.pop()] = 2
                pending.pop()
    return None


def _closest(word: str, choices: list[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return match[0] if match else None

