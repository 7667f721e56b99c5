"""Start a group of ranks: ``start_group`` from a ``RankGroupSpec``, ``start_processes`` from keywords.

Two entrypoint kinds, as in torch.distributed.elastic: a picklable function
(run in a ``multiprocessing`` child, spawn by default, with one argument tuple
per rank: ``function_ranks``) and a command (an argv list, exec'd directly,
never through a shell: ``command_ranks``). Both give a ``ProcessContext``
(``group``) to wait on, poll and close.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from habitrun.launcher.command_ranks import CommandRanks
from habitrun.launcher.function_ranks import FunctionRanks
from habitrun.launcher.group import ProcessContext
from habitrun.launcher.groupspec import RankGroupSpec


def start_group(spec: RankGroupSpec, envs: Mapping[int, Mapping[str, str]], log_dir: str, *,
                attempt: int = 0) -> ProcessContext:
    """Start one rank per entry of ``envs`` (complete environments, see ``rank_env``).

    Logs go to ``log_dir/<rank>/stdout.log|stderr.log|error.json`` and set
    TORCHELASTIC_ERROR_FILE; a ``log_dir`` holding anything is refused, never emptied.
    """
    kind = CommandRanks if spec.runs_command else FunctionRanks
    ctx = kind(spec, envs, log_dir, attempt=attempt)
    ctx.start()
    return ctx


def start_processes(
    name: str,
    entrypoint: Callable[..., Any] | Sequence[str],
    args: Mapping[int, tuple[Any, ...]],
    envs: Mapping[int, Mapping[str, str]],
    log_dir: str,
    *,
    attempt: int = 0,
    **options: Any,
) -> ProcessContext:
    """``start_group`` with the spec's fields as arguments.

    ``options``: the other ``RankGroupSpec`` fields (``redirects``, ``tee``,
    ``local_ranks_filter``, ``start_method``, ``cwd``, ``console``, ``grace``,
    ``period``). ``entrypoint`` is a picklable function (called as
    ``fn(*args[rank])``, its return value in the result) or an argv list
    (``args[rank]`` appended).
    """
    spec = RankGroupSpec(entrypoint, args, name=name, **options)
    return start_group(spec, envs, log_dir, attempt=attempt)
