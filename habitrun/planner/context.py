"""Everything outside the recipe text that a plan's keys depend on, gathered once per plan.

Per stage: its code (:mod:`habitrun.planner.code`), its declared input files,
the packages its code imports, its cache mode and the manifest columns it
uses. Per subject: the text of its input files (:mod:`habitrun.planner.subject_files`).
From these, :meth:`KeyContext.parts` gives each map stage's subject parts and
:meth:`KeyContext.fingerprint` the stage's fingerprint (see
:mod:`habitrun.planner.keys` for how they make a key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.errors import RecipeError
from habitrun.planner.code import CodeInfo, code_info
from habitrun.planner.files import Digester, stage_inputs
from habitrun.planner.fingerprint import command_fingerprint, legacy_fingerprint
from habitrun.planner.keys import canonical_json, subject_parts, variant_parts
from habitrun.planner.subject_files import SubjectFiles, cell_paths, file_columns, scan_subjects
from habitrun.planner.tools import ToolProblem, stage_tools
from habitrun.spec.placeholders import BUILTINS, names, tool_word
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe
    from habitrun.store.checkpoint import CheckpointStore

Variant = tuple[Any, ...]

# Generations of keys an older habitrun gave the same inputs, whose stored results still count:
# before issue 10 the code counted by its module's bytes; before issue 31 by ``ast.dump`` of its
# syntax tree (which differs between Pythons), and a found subject's files by absolute path.
BEFORE_10 = "before-10"
BEFORE_31 = "before-31"


@dataclass
class StageInputs:
    """What one stage's keys depend on besides its definition and upstream stages."""

    stage: StageSpec
    code: CodeInfo
    fingerprint: str  # code (or code_version), declared inputs, packages when they count
    inputs: dict[str, str]  # declared input as written -> digest (lenient: size)
    mode: str  # cache mode
    packages_in_key: bool
    file_cols: tuple[str, ...]  # the file columns its subject parts cover
    variant: Variant | None  # None: the subject parts habitrun always computed
    legacy_fingerprints: dict[str, str] = field(default_factory=dict)  # generation -> its fingerprint
    tools: dict[str, str] = field(default_factory=dict)  # a command stage's tool or image -> its identity

    def code_components(self) -> Any:
        if self.stage.code_version is not None:
            return {"code_version": self.stage.code_version}
        return self.code.modules or self.fingerprint[:16]


@dataclass
class KeyContext:
    """Per-plan inputs of the keys (see the module docstring)."""

    loaded: LoadedRecipe
    subjects: Sequence[Any]
    stages: dict[str, StageInputs]
    files: SubjectFiles | None
    digester: Digester | None
    _parts: dict[Any, Mapping[str, str]] = field(default_factory=dict)

    def fingerprint(self, name: str) -> str:
        return self.stages[name].fingerprint

    def legacy_parts(self, name: str) -> Mapping[str, str] | None:
        """The subject parts habitrun gave map stage ``name`` before issue 31, when they differ
        from today's: a found subject's files were in its row by their absolute paths."""
        info = self.stages[name]
        roots = getattr(getattr(self.subjects, "discovery", None), "roots", None)
        if info.variant is None or roots is None or not getattr(self.subjects, "file_columns", ()):
            return None
        key = ("absolute", info.variant)
        found = self._parts.get(key)
        if found is None:
            found = self._parts[key] = variant_parts(
                self.subjects, info.stage.fields, self._file_texts(info), info.file_cols,
                resolve=(self.subjects.file_columns, roots.resolve_cell))  # type: ignore[attr-defined]
        return found

    def parts(self, name: str, digests: Mapping[str, str] | None = None) -> Mapping[str, str]:
        """subject id -> subject part of map stage ``name`` (shared by stages of one variant)."""
        info = self.stages[name]
        if info.variant is None:
            if digests is not None:
                return digests
            info_key: Any = None
        else:
            info_key = info.variant
        found = self._parts.get(info_key)
        if found is None:
            if info.variant is None:
                found = subject_parts(self.subjects)
            else:
                found = variant_parts(self.subjects, info.stage.fields, self._file_texts(info), info.file_cols)
            self._parts[info_key] = found
        return found

    def _file_texts(self, info: StageInputs) -> Mapping[str, str] | None:
        if self.files is None or not info.file_cols:
            return None
        lenient = info.mode == "lenient"
        table = self.files.lenient if lenient else self.files.content
        if info.file_cols == self.files.columns:
            return table  # every column: joined once by the scan
        index = [self.files.columns.index(c) for c in info.file_cols]
        return {sid: "\x1e".join([texts.split("\x1e")[i] for i in index]) for sid, texts in table.items()}

    def subject_files(self, name: str, sid: str, fields: Mapping[str, Any]) -> dict[str, str]:
        """column -> ``path=digest;...`` (lenient: ``path#size``) of a subject's files in stage
        ``name``, as its records keep them for reasons."""
        info = self.stages[name]
        if self.files is None or not info.file_cols:
            return {}
        lenient = info.mode == "lenient"
        texts = self.files.per_column(sid, lenient)
        if not texts:
            return {}
        sep = "#" if lenient else "="
        out = {}
        for col in info.file_cols:
            text = texts[self.files.columns.index(col)]
            if not text:
                out[col] = ""
                continue
            values = text.split(";")
            paths = cell_paths(fields.get(col))
            if len(paths) != len(values):
                paths = [f"#{i}" for i in range(len(values))]
            out[col] = ";".join(
                f"{p.rstrip('/')}/{sep}{v[1:]}" if v.startswith("/") else f"{p}{sep}{v}"
                for p, v in zip(paths, values, strict=True) if v or p
            )
        return out

    def save(self, store: CheckpointStore | None) -> None:
        """Keep the digests of files read for this plan in the store's table (best effort)."""
        if self.digester is not None:
            self.digester.save(store)


def stage_code(stage: StageSpec, search_path: tuple[str, ...], root: Path) -> CodeInfo:
    """A stage's code: its modules and packages (an operator or entrypoint), else a version or argv."""
    if stage.runs_command:  # habitrun's own operator: the tool's identity is in the key instead
        return CodeInfo("command-stage:" + (stage.code_version or ""))
    target = stage.operator or stage.entrypoint
    if target is not None:
        return code_info(target, search_path, code_version=stage.code_version)
    if stage.code_version is not None:
        return CodeInfo("version:" + stage.code_version)
    return CodeInfo("command:" + command_fingerprint(stage.command or (), root))


def build_context(
    loaded: LoadedRecipe,
    subjects: Sequence[Any],
    store: CheckpointStore | None,
    *,
    save: bool = True,
    verify_only: bool = False,
) -> KeyContext:
    """Read code, packages and input files for one plan; RecipeError (exit 2) for a missing or
    unreadable input file, listing every one found (up to 20).

    ``verify_only`` (validate): only check that every input file is there and readable; nothing
    is hashed and no code is read (syntax trees, package versions), so the keys of that context
    are not the plan's."""
    recipe = loaded.recipe
    columns = file_columns(loaded, subjects)
    policies = {s.name: recipe.stage_policy(s.name) for s in recipe.stages}
    modes = {name: p.cache for name, p in policies.items()}
    problems: list[str] = []
    digester = files = None
    if columns or any(s.inputs for s in recipe.stages):
        digester = Digester(
            None if verify_only else store,
            deep=any(m == "deep" for m in modes.values()),
            content=not verify_only and any(m != "lenient" for m in modes.values()),
            check_readable=verify_only,
        )
        if columns:
            try:
                files = scan_subjects(loaded, subjects, columns, digester,
                                      lenient=any(m == "lenient" for m in modes.values()))
            except RecipeError as exc:
                problems.extend(exc.problems)
    present = set(subjects[0].fields) if subjects else set()
    stages: dict[str, StageInputs] = {}
    code_memo: dict[tuple[Any, ...], Any] = {}  # stages of one module share its code's reading
    for i, stage in enumerate(recipe.stages):
        for j, col in enumerate(stage.fields or ()):
            if col not in present:
                problems.append(f"{loaded.locate(('stages', i, 'fields', j))}: column {col!r} is not in the manifest")
        if stage.runs_command and subjects:
            problems.extend(_unknown_columns(loaded, i, present))
        stages[stage.name] = _stage_inputs(loaded, i, columns, digester, policies[stage.name], problems,
                                           verify_only=verify_only, code_memo=code_memo)
    if problems:
        raise RecipeError(problems)
    context = KeyContext(loaded, subjects, stages, files, digester)
    if save:
        context.save(store)
    return context


def _stage_inputs(loaded: LoadedRecipe, index: int, columns: Mapping[str, bool], digester: Digester | None,
                  policy: RunPolicy, problems: list[str], *, verify_only: bool,
                  code_memo: dict[tuple[Any, ...], Any] | None = None) -> StageInputs:
    """What one stage's keys depend on; a declared input that cannot be read goes to ``problems``."""
    stage = loaded.recipe.stages[index]
    mode = policy.cache
    inputs: dict[str, str] = {}
    if stage.inputs and digester is not None:
        try:
            inputs = stage_inputs(loaded, index, digester, lenient=mode == "lenient")
        except RecipeError as exc:
            problems.extend(exc.problems)
    search_path, root = tuple(loaded.search_path), Path(loaded.root)
    # validate keeps no key: its context skips reading the code (syntax trees, package versions)
    memo = {} if code_memo is None else code_memo
    what = (stage.operator, stage.entrypoint, tuple(stage.command or ()))  # all that stage_code reads but the version
    if verify_only:
        code = CodeInfo("verify-only")
    else:
        code_key = ("code", *what, stage.code_version)
        known = memo.get(code_key)
        if known is None:
            known = memo[code_key] = stage_code(stage, search_path, root)
        code = known
    tools: dict[str, str] = {}
    if stage.runs_command:
        tool_memo = memo.get(("tools", verify_only))
        if tool_memo is None:
            tool_memo = memo[("tools", verify_only)] = {}
        what_tool = (tool_word(stage), stage.version, stage.container)
        try:
            found = tool_memo.get(what_tool)
            if found is None:
                found = tool_memo[what_tool] = stage_tools(stage, root, identify=not verify_only)
            tools = found
        except ToolProblem as exc:
            at = ("stages", index, "container") if stage.container is not None else ("stages", index, "command", 0)
            problems.append(f"{loaded.locate(at)}: stage {stage.name!r}: {exc}")
            tools = {}
    in_key = policy.rerun_on_package_change
    pieces = [code.fingerprint]
    if tools:
        pieces.append("tools:" + canonical_json(tools))
    if inputs:
        pieces.append("inputs:" + canonical_json(inputs))
    if in_key and code.packages:
        pieces.append("packages:" + canonical_json(code.packages))
    cols = tuple(c for c in sorted(columns) if stage.fields is None or c in stage.fields) if stage.kind == "map" else ()
    variant = (stage.fields, cols, mode == "lenient") if cols or stage.fields is not None else None
    legacy: dict[str, str] = {}
    if not verify_only and code.legacy is not None:
        legacy[BEFORE_31] = "\x00".join([code.legacy, *pieces[1:]])
    if not verify_only and variant is None and not stage.inputs and stage.code_version is None \
            and not (in_key and code.packages) and not stage.runs_command:
        legacy_key = ("legacy", *what)
        before_10 = memo.get(legacy_key)
        if before_10 is None:
            before_10 = memo[legacy_key] = legacy_fingerprint(stage, search_path, root)
        legacy[BEFORE_10] = before_10
    return StageInputs(
        stage=stage, code=code, fingerprint="\x00".join(pieces), inputs=inputs, mode=mode,
        packages_in_key=in_key, file_cols=cols, variant=variant, legacy_fingerprints=legacy, tools=tools,
    )


def _unknown_columns(loaded: LoadedRecipe, index: int, present: set[str]) -> list[str]:
    """A command stage's bare placeholder names that are no builtin, param or manifest column."""
    stage = loaded.recipe.stages[index]
    out = []
    templates: list[tuple[tuple[str, int | str], str]] = [
        (("command", i), t) for i, t in enumerate(stage.command or ())]
    templates += [(("env", k), v) for k, v in (stage.env or {}).items()]
    for where, template in templates:
        for name in names(template):
            head, dot, rest = name.partition(".")
            if dot and head != "fields":
                continue  # {params.X} and {STAGE.OUTPUT}: checked with the recipe
            if not dot and (name in BUILTINS or name in stage.params):
                continue
            column = rest if dot else name
            if column not in present:
                out.append(f"{loaded.locate(('stages', index, *where))}: {{{name}}}: no manifest column "
                           f"{column!r} (columns: {', '.join(sorted(present)) or 'none'}), nor a param of the "
                           f"stage or one of {', '.join('{' + b + '}' for b in BUILTINS)}")
    return out


def fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    """stage name -> code fingerprint (code and code_version only; no files are read)."""
    search_path = tuple(loaded.search_path)
    return {s.name: stage_code(s, search_path, Path(loaded.root)).fingerprint for s in loaded.recipe.stages}
