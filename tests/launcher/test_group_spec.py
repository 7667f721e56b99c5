"""The value-based launcher API: a RankGroupSpec run by ``launch_group`` / ``start_group``, and a StopChannel."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from habitrun.launcher import (
    AttemptPlan,
    ProcessContext,
    RankGroupSpec,
    StopChannel,
    launch_group,
    start_group,
)
from habitrun.launcher.command_ranks import CommandRanks
from habitrun.launcher.function_ranks import FunctionRanks
from tests.launcher import ranks


def test_launch_group_runs_a_spec_and_an_attempt_plan(tmp_path, console):
    group = RankGroupSpec(ranks.return_value, {0: (), 1: ()}, name="fit", console=console)
    result = launch_group(group, AttemptPlan(2, "run-7"), tmp_path)
    assert result.ok, result.error
    assert len(result.attempts) == 1
    assert sorted(result.return_values) == [0, 1]
    assert (tmp_path / "attempt_0" / "1").is_dir()


def test_start_group_picks_the_class_of_the_rank_kind(tmp_path, console):
    envs = {0: {**os.environ, "RANK": "0"}}
    command = start_group(RankGroupSpec([sys.executable, "-c", "pass"], {0: ()}, console=console), envs,
                          str(tmp_path / "c"))
    function = start_group(RankGroupSpec(ranks.return_value, {0: ()}, console=console), envs, str(tmp_path / "f"))
    assert type(command) is CommandRanks and type(function) is FunctionRanks
    done_c, done_f = command.wait(), function.wait()
    assert done_c is not None and done_f is not None
    assert done_c.ranks[0].exitcode == 0 and done_c.return_values == {0: None}
    assert done_f.return_values[0] == {"rank": 0, "squares": [0, 1, 4, 9]}
    with pytest.raises(TypeError):
        ProcessContext(RankGroupSpec(ranks.return_value, {0: ()}), envs, str(tmp_path / "x"))  # type: ignore[abstract]


def test_stop_channel_reports_a_request_forwards_the_signal_and_drains(tmp_path):
    read_end, write_end = os.pipe()
    try:
        asked = {"hard": False}
        stop = StopChannel([read_end], hurry=lambda: asked["hard"], stop_signal=lambda: signal.SIGINT)
        assert not stop.requested() and not stop.hurried()
        os.write(write_end, b"x")
        assert stop.requested()
        assert stop.signum() == signal.SIGINT
        stop.drain()
        assert not stop.requested()
        asked["hard"] = True
        assert stop.hurried()
        assert StopChannel().signum() == signal.SIGTERM and not StopChannel().requested()
        assert StopChannel(stop_signal=lambda: None).signum() == signal.SIGTERM
    finally:
        os.close(read_end)
        os.close(write_end)
