"""A command map stage's operator: habitrun's own class, bound and called like any study's operator.

A recipe's ``command:`` on a map stage names this class as the stage's operator
(``spec.recipe.COMMAND_OPERATOR``) and its params give it the
stage's argv, outputs, env and container (``engine/command/params.py``), so a tool runs on every backend under
everything a Python operator has: the per-subject timeout and memory limit,
retries, isolation, logs, Ctrl-C, resume and the trace. Per subject it fills
the placeholders (:mod:`habitrun.spec.placeholders`), runs the tool through
:func:`~habitrun.engine.command.runtool.run_tool` in the subject's work folder,
and returns the declared outputs as paths, or fails naming the one missing.
"""

from __future__ import annotations

import glob
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from habitrun.engine.command.containers import Mounts, container_argv
from habitrun.engine.command.runtool import run_tool
from habitrun.engine.process.threads import THREAD_ENV_VARS
from habitrun.errors import ToolError
from habitrun.planner.tools import choose_engine
from habitrun.spec.placeholders import BUILTINS, substitute
from habitrun.spec.recipe import ContainerSpec

if TYPE_CHECKING:
    from habitrun.engine.subject import Subject

_GLOB = frozenset("*?[")


def _threads() -> int:
    text = os.environ.get("OMP_NUM_THREADS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CommandOperator:
    """Runs one command-line tool per subject (see the module docstring)."""

    def __init__(self, *, stage: str, command: list[str], outputs: Mapping[str, Any], env: Mapping[str, str],
                 shell: bool, container: Mapping[str, Any] | None, params: Mapping[str, Any], root: str,
                 run_root: str, file_columns: list[str]) -> None:
        self.stage = stage
        self.command = list(command)
        self.outputs = dict(outputs)
        self.env = dict(env)
        self.shell = shell
        self.params = dict(params)
        self.root = root
        self.run_root = run_root
        self.file_columns = frozenset(file_columns)
        self.container = ContainerSpec(**container) if container is not None else None
        self.engine: tuple[str, str, str] | None = None
        if self.container is not None:  # once per worker: which engine, where, and the image as it runs
            self.engine = choose_engine(self.container, Path(root))

    def lookup(self, subject: Subject) -> Any:
        """name -> value for the placeholders of ``subject``."""

        def value(name: str) -> Any:
            head, dot, rest = name.partition(".")
            if not dot:
                if name in ("subject", "id"):
                    return subject.id
                if name == "workdir":
                    return str(subject.workdir)
                if name == "threads":
                    return _threads()
                if name in self.params:
                    return self.params[name]
                return self.field(subject, name)
            if head == "params":
                return self.params[rest]
            if head == "fields":
                return self.field(subject, rest)
            result = subject.inputs.get(head)
            if not isinstance(result, Mapping) or rest not in result:
                have = sorted(result) if isinstance(result, Mapping) else type(result).__name__
                raise ToolError(f"{{{name}}}: stage {head!r}'s result for this subject has no {rest!r} (it has {have})")
            return _text(result[rest])

        return value

    def field(self, subject: Subject, name: str) -> Any:
        if name not in subject.fields:
            raise ToolError(f"{{{name}}}: the subject has no field {name!r} (nor is it a param or one of "
                            f"{', '.join(BUILTINS)})")
        cell = subject.fields[name]
        if name not in self.file_columns or not isinstance(cell, str):
            return "" if cell is None else cell
        paths = self.paths(cell)
        return paths[0] if len(paths) == 1 else paths

    def paths(self, cell: str) -> list[str]:
        """A file column's cell as absolute paths (relative ones are under the study folder)."""
        return [os.path.join(self.root, p.strip()) for p in cell.split(";") if p.strip()]

    def outside(self, subject: Subject) -> list[str]:
        """The subject's input files outside the study and run folders: a container needs them bound."""
        roots = tuple(os.path.join(r, "") for r in (self.root, self.run_root))
        out = []
        for col in sorted(self.file_columns):
            cell = subject.fields.get(col)
            if isinstance(cell, str):
                out += [p for p in self.paths(cell) if not os.path.abspath(p).startswith(roots)]
        return out

    def argv(self, subject: Subject) -> tuple[list[str], dict[str, str]]:
        """The subject's argv (wrapped for its container) and the env entries it adds."""
        lookup = self.lookup(subject)
        quote = shlex.quote if self.shell else None
        argv: list[str] = []
        try:
            for item in self.command:
                made = substitute(item, lookup, quote)
                argv.extend(made if isinstance(made, list) else [made])
            env = {k: str(substitute(v, lookup)) for k, v in self.env.items()}
        except ValueError as exc:
            raise ToolError(str(exc)) from exc
        if self.shell:
            argv = ["/bin/sh", "-c", " ".join(argv)]
        if self.engine is None:
            return argv, env
        engine, engine_path, image = self.engine
        spec = self.container
        assert spec is not None
        passed = {k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ}
        read_only = [self.root, self.run_root, *(os.path.join(self.root, b) for b in spec.binds),
                     *self.outside(subject)]
        mounts = Mounts(read_only=tuple(read_only), workdir=str(subject.workdir), env={**passed, **env},
                        network=spec.network)
        wrapped = container_argv(engine, engine_path, image, argv, mounts, engine_options=spec.engine_options,
                                 run_options=spec.run_options)
        return wrapped, {}

    def __call__(self, subject: Subject) -> dict[str, Any]:
        argv, env = self.argv(subject)
        run_tool(argv, cwd=subject.workdir, env=env)
        return self.collect(subject.workdir)

    def collect(self, workdir: Path) -> dict[str, Any]:
        """The declared outputs found in ``workdir``; ToolError naming the first one missing."""
        out: dict[str, Any] = {}
        for name, pattern in self.outputs.items():
            if isinstance(pattern, str):
                found = _matches(workdir, pattern)
                if len(found) != 1:
                    what = "nothing" if not found else f"{len(found)} files ({', '.join(p.name for p in found[:5])})"
                    raise ToolError(f"output {name!r} ({pattern}) matched {what} in the work folder; "
                                    "a single path or glob must match one file (a list of globs takes several)")
                out[name] = found[0]
            else:
                paths: list[Path] = []
                for one in pattern:
                    found = _matches(workdir, one)
                    if not found:
                        raise ToolError(f"output {name!r}: {one} matched nothing in the work folder")
                    paths.extend(p for p in found if p not in paths)
                out[name] = paths
        return out


def _text(value: Any) -> Any:
    """A path as its text (lists item by item); anything else as it is."""
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _matches(workdir: Path, pattern: str) -> list[Path]:
    if not _GLOB & set(pattern):
        path = workdir / pattern
        return [path] if path.exists() else []
    return sorted(Path(p) for p in glob.glob(os.path.join(glob.escape(str(workdir)), pattern)))
