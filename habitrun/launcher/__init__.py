"""Rank groups for train stages, torchrun-style, usable on its own from Python.

``launch`` runs a group to the end (restarts, timeout, stop, root cause);
``launch_group`` does the same from a ``RankGroupSpec`` (what runs and how),
an ``AttemptPlan`` (attempts, timeout, environments) and a ``StopChannel``;
``launch_nodes`` runs one across nodes (an agent per node, c10d rendezvous);
``start_processes`` / ``start_group`` give the lower-level context (wait / poll / pids / close);
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
    "ProcessContext": "group",
    "RankGroupSpec": "groupspec",
    "start_group": "processes",
    "start_processes": "processes",
    "GroupResult": "results",
    "RankResult": "results",
    "Std": "std",
    "StopChannel": "signalling",
    "AttemptPlan": "supervisor",
    "LaunchResult": "supervisor",
    "launch": "supervisor",
    "launch_group": "supervisor",
    "NodesResult": "nodes",
    "launch_nodes": "nodes",
}

__all__ = [
    "TORCHRUN_VARIABLES",
    "AttemptPlan",
    "ErrorInfo",
    "GroupResult",
    "LaunchResult",
    "NodesResult",
    "PortReservation",
    "ProcessContext",
    "RankGroupSpec",
    "RankResult",
    "Std",
    "StopChannel",
    "launch",
    "launch_group",
    "launch_nodes",
    "rank_env",
    "read_error_file",
    "record",
    "start_group",
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
    from habitrun.launcher.group import ProcessContext
    from habitrun.launcher.groupspec import RankGroupSpec
    from habitrun.launcher.nodes import NodesResult, launch_nodes
    from habitrun.launcher.ports import PortReservation
    from habitrun.launcher.processes import start_group, start_processes
    from habitrun.launcher.results import GroupResult, RankResult
    from habitrun.launcher.signalling import StopChannel
    from habitrun.launcher.std import Std
    from habitrun.launcher.supervisor import AttemptPlan, LaunchResult, launch, launch_group
