"""The options `run` and `resume` share, declared once: what to (re)run, how much to print, the report.

:func:`run_options` adds them to a command whose last parameter is
``chosen: Chosen``; typer sees the options, the command gets them as one value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import typer

from habitrun.cli.execute import (
    ACCEPT_LOSS_HELP,
    DETACH_HELP,
    RECORD_NOOP_HELP,
    RERUN_HELP,
    RETRY_FAILED_HELP,
    STAGE_HELP,
    Selection,
)


@dataclass(frozen=True)
class Chosen:
    """The shared options as given on the command line."""

    selection: Selection
    quiet: bool = False
    report: bool = False
    accept_loss: bool = False
    detach: bool = False


def _option(name: str, annotation: Any, option: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


SHARED = (
    _option("quiet", bool, typer.Option(False, "--quiet", "-q", help="Print only the final summary.")),
    _option("retry_failed", bool, typer.Option(False, "--retry-failed", help=RETRY_FAILED_HELP)),
    _option("rerun", Optional[list[str]],  # noqa: UP045 (typer reads the annotation on Python 3.10)
            typer.Option(None, "--rerun", metavar="SUBJECT", help=RERUN_HELP)),
    _option("stage", Optional[str], typer.Option(None, "--stage", metavar="NAME", help=STAGE_HELP)),  # noqa: UP045
    _option("record_noop", bool, typer.Option(False, "--record-noop", help=RECORD_NOOP_HELP)),
    _option("report", bool, typer.Option(False, "--report",
                                         help="Write report.html into the run folder at the end (as policy.report).")),
    _option("accept_loss", bool, typer.Option(False, "--accept-loss", help=ACCEPT_LOSS_HELP)),
    _option("detach", bool, typer.Option(False, "--detach", help=DETACH_HELP)),
)


def chosen_from(values: dict[str, Any]) -> Chosen:
    """The shared options' values (by parameter name) as one :class:`Chosen`."""
    selection = Selection(values["retry_failed"], tuple(values["rerun"] or ()), values["stage"], values["record_noop"])
    return Chosen(selection, quiet=values["quiet"], report=values["report"], accept_loss=values["accept_loss"],
                  detach=values["detach"])


def run_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command(..., chosen: Chosen)`` as a callback taking the shared options in place of ``chosen``."""
    own = inspect.signature(command, eval_str=True)
    params = [p for name, p in own.parameters.items() if name != "chosen"]

    @functools.wraps(command)
    def with_options(**values: Any) -> None:
        shared = {p.name: values.pop(p.name) for p in SHARED}
        command(**values, chosen=chosen_from(shared))

    with_options.__signature__ = own.replace(parameters=[*params, *SHARED])  # type: ignore[attr-defined]
    return with_options
