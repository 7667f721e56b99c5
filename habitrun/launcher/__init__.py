"""Rank groups for train stages, torchrun-style, usable on its own from Python.

``launch`` runs a group to the end (restarts, timeout, stop, root cause);
``start_processes`` gives the lower-level context (wait / poll / pids / close);
``record`` decorates a rank's main function so its exception lands in its
error file. Imports nothing of habitrun but ``habitrun.errors``.
"""

from habitrun.launcher.environment import TORCHRUN_VARIABLES, rank_env
from habitrun.launcher.errorfile import ErrorInfo, read_error_file, record, write_error_file
from habitrun.launcher.ports import PortReservation
from habitrun.launcher.processes import ProcessContext, start_processes
from habitrun.launcher.results import GroupResult, RankResult
from habitrun.launcher.std import Std
from habitrun.launcher.supervisor import LaunchResult, launch

__all__ = [
    "TORCHRUN_VARIABLES",
    "ErrorInfo",
    "GroupResult",
    "LaunchResult",
    "PortReservation",
    "ProcessContext",
    "RankResult",
    "Std",
    "launch",
    "rank_env",
    "read_error_file",
    "record",
    "start_processes",
    "write_error_file",
]
