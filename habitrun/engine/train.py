"""A ``kind: train`` stage: the recipe's launch options -> one launcher run -> a TrainOutcome.

The stage's result, stored like any other stage's, is:

- for an ``entrypoint`` (``module:function``, called with no arguments in every
  rank, reading RANK, HABITRUN_INPUTS, ... from the environment): rank 0's
  return value, which must be picklable (keep it JSON-able: numbers, strings,
  paths, small dicts);
- for a ``command``: the JSON in ``$HABITRUN_WORKDIR/result.json`` if the
  program wrote one (rank 0 should), else ``{"workdir": "<HABITRUN_WORKDIR>"}``.

Every rank runs with the recipe's folder as its working directory and on its
PYTHONPATH, so ``python train.py`` and ``study_ops.train:main`` both resolve.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from habitrun.engine.control import StopFlag
from habitrun.errors import HabitrunError
from habitrun.launcher import launch
from habitrun.launcher.nodes import launch_nodes
from habitrun.spec.operators import resolve_operator
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import LaunchSpec, StageSpec

RESULT_FILE = "result.json"
INPUTS_FILE = "inputs.json"


@dataclass
class TrainOutcome:
    """How a train stage ended; ``error`` is ``"interrupted"`` after a stop, starts with ``timeout`` on one."""

    ok: bool
    result: Any
    error: str | None
    traceback: str | None
    attempts: int
    log_dir: str
    duration_sec: float


def run_entrypoint(path: str, search_path: tuple[str, ...], stage: str) -> Any:
    """Rank-side: import ``module:function`` from the recipe's folder and call it with no arguments."""
    fn = resolve_operator(path, search_path, stage=stage)
    return fn()


_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([A-Za-z_]+)\}")


def substitute(argv: Sequence[str], values: dict[str, str]) -> list[str]:
    """Replace ``${workdir}``, ``${inputs}``, ``${stage_dir}``, ``${run_id}`` in every argument.

    ``$${`` is a literal ``${`` (``$${workdir}`` stays ``${workdir}``), in one left-to-right
    pass so a value that happens to contain ``${`` is never substituted again.
    """

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        return values.get(match.group(1), match.group(0))

    return [_PLACEHOLDER.sub(one, arg) for arg in argv]


def _write_inputs(stage_dir: Path, inputs: dict[str, Any]) -> Path:
    path = stage_dir / INPUTS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(inputs, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _command_result(workdir: Path) -> Any:
    path = workdir / RESULT_FILE
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    return {"workdir": str(workdir)}


@dataclass(frozen=True)
class _Setup:
    """What launching here and launching on nodes share: the folders, the inputs file, the ranks' path."""

    stage_dir: Path
    workdir: Path
    inputs_path: Path
    root: str  # the ranks' working directory (the recipe's folder), first on their PYTHONPATH
    pythonpath: str
    started: float

    def outcome(self, ok: bool, result: Any, error: str | None, tb: str | None, attempts: int) -> TrainOutcome:
        return TrainOutcome(ok, result, error, tb, attempts, str(self.stage_dir), time.monotonic() - self.started)

    def command(self, stage: StageSpec, run_id: str) -> list[str]:
        """A ``command`` stage's argv, placeholders filled; an earlier attempt's result file removed."""
        assert stage.command is not None
        (self.workdir / RESULT_FILE).unlink(missing_ok=True)
        return substitute(stage.command, {"workdir": str(self.workdir), "inputs": str(self.inputs_path),
                                          "stage_dir": str(self.stage_dir), "run_id": run_id})

    def ended(self, stage: StageSpec, *, ok: bool, error: str | None, tb: str | None, attempts: int,
              value: Any) -> TrainOutcome:
        """How the group ended; a ``command`` stage's result is the file its rank 0 wrote, else ``value``."""
        if not ok:
            return self.outcome(False, None, error, tb, attempts)
        if stage.command is not None:
            try:
                value = _command_result(self.workdir)
            except ValueError as exc:
                return self.outcome(False, None, str(exc), None, attempts)
        return self.outcome(True, value, None, None, attempts)


def run_train_stage(
    stage: StageSpec,
    policy: RunPolicy,
    *,
    stage_dir: Path,
    workdir: Path,
    inputs: dict[str, Any],
    search_path: tuple[str, ...],
    run_id: str,
    stop: StopFlag,
    console: Callable[[str], None] | None = None,
) -> TrainOutcome:
    """Run the stage's rank group to its end (see the module docstring for the result)."""
    started = time.monotonic()
    spec = stage.launch or LaunchSpec()
    stage_dir = Path(stage_dir).absolute()
    workdir = Path(workdir).absolute()
    stage_dir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    if stop.is_set():
        return TrainOutcome(False, None, "interrupted", None, 0, str(stage_dir), time.monotonic() - started)
    _clear_earlier_attempts(stage_dir)
    inputs_path = _write_inputs(stage_dir, inputs)
    root = str(Path(search_path[0]).absolute()) if search_path else os.getcwd()
    pythonpath = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    setup = _Setup(stage_dir, workdir, inputs_path, root, pythonpath, started)
    if spec.via is not None:
        return _run_on_nodes(stage, spec, policy, setup, search_path=search_path, run_id=run_id, stop=stop)
    return _run_here(stage, spec, policy, setup, search_path=search_path, run_id=run_id, stop=stop, console=console)


def _run_here(stage: StageSpec, spec: LaunchSpec, policy: RunPolicy, setup: _Setup, *, search_path: tuple[str, ...],
              run_id: str, stop: StopFlag, console: Callable[[str], None] | None) -> TrainOutcome:
    """One launcher run on this machine."""
    stage_dir, workdir, inputs_path, root, pythonpath = (setup.stage_dir, setup.workdir, setup.inputs_path,
                                                          setup.root, setup.pythonpath)
    entry: Any
    if stage.command is not None:
        entry = setup.command(stage, run_id)
        args: tuple[Any, ...] = ()
    else:
        assert stage.entrypoint is not None
        entry = run_entrypoint
        args = (stage.entrypoint, tuple(str(p) for p in search_path), stage.name)
    try:
        launched = launch(
            entry,
            nprocs=spec.nproc_per_node,
            log_dir=str(stage_dir),
            name=stage.name,
            args=args,
            run_id=run_id,
            max_restarts=spec.max_restarts,
            redirects=_std(spec.redirects),
            tee=_std(spec.tee),
            local_ranks_filter=spec.local_ranks_filter,
            start_method=spec.start_method,
            cwd=root,
            env={"PYTHONPATH": pythonpath},
            inputs=str(inputs_path),
            workdir=str(workdir),
            grace=policy.graceful_shutdown_sec,
            timeout=spec.timeout_sec,
            period=spec.monitor_interval_sec,
            console=console,
            wake=[stop.fileno()],
            hurry=lambda: stop.hard,  # a second Ctrl-C ends the ranks' grace at once
            stop_signal=lambda: stop.signum,  # the ranks get the signal habitrun got, as under torchrun
        )
    except HabitrunError as exc:  # the group could not start (a command not found, ...)
        return setup.outcome(False, None, str(exc), None, 0)
    return setup.ended(stage, ok=launched.ok, error=launched.error, tb=launched.traceback,
                       attempts=len(launched.attempts), value=launched.return_values.get(0) if launched.ok else None)


def _run_on_nodes(stage: StageSpec, spec: LaunchSpec, policy: RunPolicy, setup: _Setup, *,
                  search_path: tuple[str, ...], run_id: str, stop: StopFlag) -> TrainOutcome:
    """``launch.via``: one launcher agent per node (srun, or all here), c10d rendezvous between them."""
    agents: dict[str, Any] = {
        "nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node, "rdzv_endpoint": spec.rdzv_endpoint,
        "rdzv_timeout_sec": spec.rdzv_timeout_sec, "run_id": run_id, "max_restarts": spec.max_restarts,
        "name": stage.name, "grace": policy.graceful_shutdown_sec, "cwd": setup.root,
        "env": {"PYTHONPATH": setup.pythonpath}, "inputs": str(setup.inputs_path), "workdir": str(setup.workdir),
        "start_method": spec.start_method,
    }
    if stage.command is not None:
        agents["command"] = setup.command(stage, run_id)
    else:
        agents["function"] = f"{run_entrypoint.__module__}:{run_entrypoint.__name__}"
        agents["args"] = [stage.entrypoint, [str(p) for p in search_path], stage.name]
    try:
        done = launch_nodes(agents, via=str(spec.via), log_dir=str(setup.stage_dir),
                            grace=policy.graceful_shutdown_sec, wake=[stop.fileno()], hurry=lambda: stop.hard,
                            stop_signal=lambda: stop.signum)
    except HabitrunError as exc:
        return setup.outcome(False, None, str(exc), None, 0)
    return setup.ended(stage, ok=done.ok, error=done.error, tb=done.traceback, attempts=done.attempts,
                       value=done.return_value if done.ok else None)


def _clear_earlier_attempts(stage_dir: Path) -> None:
    """A rerun of the stage replaces the ``attempt_<n>`` log folders an earlier run of it wrote here.

    ``stage_dir`` is habitrun's own run folder; the launcher itself never deletes
    (it refuses a log_dir that already holds attempt folders).
    """
    for old in stage_dir.glob("attempt_*"):
        if old.is_dir() and re.fullmatch(r"attempt_\d+", old.name):
            shutil.rmtree(old)


def _std(value: str | Mapping[int, str]) -> Any:
    return dict(value) if isinstance(value, dict) else value
