"""Rank groups for train stages, torchrun-style, usable on its own from Python.

``launch`` runs a group to the end (restarts, timeout, stop, root cause);
``launch_nodes`` runs one across nodes (an agent per node, c10d rendezvous);
``start_processes`` gives the lower-level context (wait / poll / pids / close);
``record`` decorates a rank's main function so its exception lands in its
error file. Imports nothing of habitrun but ``habitrun.errors``.

The names are loaded on first use, so a process that needs one small module
(a worker importing ``habitrun.launcher.lifeline``) does not pay for the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "TORCHRUN_VARIABLES": "environment",
    "rank_env": "environment",
    "ErrorInfo": "errorfile",
    "read_error_file": "errorfile",
    "record": "errorfile",
    "write_error_file": "errorfile",
    "PortReservation": "ports",
    "ProcessContext": "processes",
    "start_processes": "processes",
    "GroupResult": "results",
    "RankResult": "results",
    "Std": "std",
    "LaunchResult": "supervisor",
    "launch": "supervisor",
    "NodesResult": "nodes",
    "launch_nodes": "nodes",
}

__all__ = [
    "TORCHRUN_VARIABLES",
    "ErrorInfo",
    "GroupResult",
    "LaunchResult",
    "NodesResult",
    "PortReservation",
    "ProcessContext",
    "RankResult",
    "Std",
    "launch",
    "launch_nodes",
    "rank_env",
    "read_error_file",
    "record",
    "start_processes",
    "write_error_file",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'habitrun.launcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"habitrun.launcher.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors
    from habitrun.launcher.environment import TORCHRUN_VARIABLES, rank_env
    from habitrun.launcher.errorfile import ErrorInfo, read_error_file, record, write_error_file
    from habitrun.launcher.nodes import NodesResult, launch_nodes
    from habitrun.launcher.ports import PortReservation
    from habitrun.launcher.processes import ProcessContext, start_processes
    from habitrun.launcher.results import GroupResult, RankResult
    from habitrun.launcher.std import Std
    from habitrun.launcher.supervisor import LaunchResult, launch
