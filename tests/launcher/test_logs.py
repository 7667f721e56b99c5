"""attempt_<n>/<rank>/ logs; redirects and tee per stream and per rank; prefixes; local_ranks_filter."""

from __future__ import annotations

import os
import sys

import pytest

from habitrun.errors import LaunchError
from habitrun.launcher import Std, launch
from habitrun.launcher.std import plan_streams
from tests.launcher import ranks


def _read(path) -> str:
    return path.read_text() if path.exists() else ""


def test_tee_all_writes_files_and_prefixed_console_lines(tmp_path, console):
    result = launch(ranks.chatter, nprocs=2, log_dir=tmp_path, name="fit", tee="all", console=console)
    assert result.ok, result.error
    for rank in range(2):
        rank_dir = tmp_path / "attempt_0" / str(rank)
        assert _read(rank_dir / "stdout.log") == f"out {rank} 0\nout {rank} 1\ntail {rank} no newline"
        assert _read(rank_dir / "stderr.log") == f"err {rank} 0\nerr {rank} 1\n"
        assert result.last.ranks[rank].stdout == str(rank_dir / "stdout.log")
    lines = set(console.lines)
    for rank in range(2):
        assert {f"[fit/{rank}] out {rank} 0", f"[fit/{rank}] err {rank} 1",
                f"[fit/{rank}] tail {rank} no newline"} <= lines
    # a rank's own lines keep their order on the console
    rank0 = [line for line in console.lines if line.startswith("[fit/0] out")]
    assert rank0 == ["[fit/0] out 0 0", "[fit/0] out 0 1"]


def test_redirects_keep_streams_off_the_console(tmp_path, console):
    result = launch(ranks.chatter, nprocs=2, log_dir=tmp_path, name="fit",
                    redirects="all", tee="none", console=console,
                    start_method="forkserver")
    assert result.ok
    assert console.lines == []
    assert "out 1 1" in _read(tmp_path / "attempt_0" / "1" / "stdout.log")
    assert "err 0 0" in _read(tmp_path / "attempt_0" / "0" / "stderr.log")


def test_tee_and_redirect_per_stream_and_per_rank(tmp_path, console):
    # rank 0: stdout teed, stderr to file only; rank 1: stderr teed, stdout to file only
    result = launch(ranks.chatter, nprocs=2, log_dir=tmp_path, name="t",
                    redirects={0: "err", 1: "out"}, tee={0: "out", 1: "err"}, console=console,
                    start_method="forkserver")
    assert result.ok
    assert "[t/0] out 0 0" in console.lines and "[t/1] err 1 0" in console.lines
    assert not [line for line in console.lines if line.startswith("[t/0] err") or line.startswith("[t/1] out")]
    for rank in range(2):
        assert "out" in _read(tmp_path / "attempt_0" / str(rank) / "stdout.log")
        assert "err" in _read(tmp_path / "attempt_0" / str(rank) / "stderr.log")


def test_local_ranks_filter_limits_the_console_not_the_files(tmp_path, console):
    result = launch(ranks.chatter, nprocs=3, log_dir=tmp_path, name="f", tee="all",
                    local_ranks_filter=[1], console=console, start_method="forkserver")
    assert result.ok
    assert console.lines and all(line.startswith("[f/1] ") for line in console.lines)
    for rank in range(3):
        assert f"out {rank} 1" in _read(tmp_path / "attempt_0" / str(rank) / "stdout.log")


def test_streams_neither_redirected_nor_teed_go_straight_to_the_console(tmp_path, console, capfd):
    code = "import os; print('plain', os.environ['RANK'], flush=True)"
    result = launch([sys.executable, "-c", code], nprocs=2, log_dir=tmp_path, redirects="none",
                    tee="none", console=console)
    assert result.ok
    assert console.lines == []
    out = capfd.readouterr().out
    assert "plain 0" in out and "plain 1" in out
    assert result.last.ranks[0].stdout is None
    assert not (tmp_path / "attempt_0" / "0" / "stdout.log").exists()


def test_command_ranks_are_teed_with_prefixes(tmp_path, console):
    code = "import os, sys; print('hi', os.environ['RANK']); print('oops', file=sys.stderr)"
    result = launch([sys.executable, "-c", code], nprocs=2, log_dir=tmp_path, name="cmd", console=console)
    assert result.ok
    assert {"[cmd/0] hi 0", "[cmd/1] hi 1", "[cmd/0] oops", "[cmd/1] oops"} <= set(console.lines)


def test_plan_streams_matrix():
    dirs = {0: "/d/0", 1: "/d/1"}
    plans = plan_streams(2, dirs, redirects={1: Std.OUT}, tee=Std.ERR, local_ranks_filter=None)
    assert plans[0]["out"].mode == "inherit" and plans[0]["out"].path is None
    assert plans[0]["err"].mode == "tee" and plans[0]["err"].path == "/d/0/stderr.log"
    assert plans[1]["out"].mode == "file" and plans[1]["err"].mode == "tee"
    filtered = plan_streams(2, dirs, redirects="none", tee="none", local_ranks_filter=[0])
    assert filtered[0]["out"].mode == "inherit" and filtered[1]["out"].mode == "file"


@pytest.mark.parametrize("bad", ["everything", 7, {5: "out"}])
def test_bad_stream_selection_is_a_launch_error(bad):
    with pytest.raises(LaunchError):
        plan_streams(2, {0: "a", 1: "b"}, redirects=bad, tee="none", local_ranks_filter=None)


def test_start_processes_never_deletes_the_folder_it_is_given(tmp_path, console):
    import psutil

    from habitrun.launcher import start_processes

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    keep = tmp_path / "mine.txt"
    keep.write_text("precious")
    envs = {0: {**os.environ, "RANK": "0"}}
    with pytest.raises(LaunchError, match="not empty"):
        start_processes("t", ranks.return_value, {0: ()}, envs, str(tmp_path), console=console)
    assert keep.read_text() == "precious"
    # an empty or missing folder is fine, and is created
    ctx = start_processes("t", ranks.return_value, {0: ()}, envs, str(tmp_path / "new"), console=console)
    assert not ctx.wait().failed
    assert (tmp_path / "new" / "0").is_dir()
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= before


def test_launch_refuses_a_log_dir_with_an_earlier_launchs_attempts(tmp_path, console):
    (tmp_path / "notes.txt").write_text("mine")  # other files in log_dir are fine and left alone
    assert launch(ranks.return_value, nprocs=1, log_dir=tmp_path, console=console).ok
    with pytest.raises(LaunchError, match="already holds"):
        launch(ranks.return_value, nprocs=1, log_dir=tmp_path, console=console)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "attempt_0" / "0").is_dir()
