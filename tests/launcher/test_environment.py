"""Each rank gets torchrun's environment, a race-free port, its own session, and habitrun's two paths."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from habitrun.launcher import PortReservation, launch, rank_env
from tests.launcher import ranks


def test_function_ranks_report_the_torchrun_environment(tmp_path, console):
    result = launch(
        ranks.report_env, nprocs=3, log_dir=tmp_path / "logs", name="envs", run_id="run-42",
        max_restarts=2, inputs=str(tmp_path / "inputs.json"), workdir=str(tmp_path / "work"),
        console=console, env={"OMP_NUM_THREADS": "3"},
    )
    assert result.ok, result.error
    reports = result.return_values
    assert sorted(reports) == [0, 1, 2]
    ports = {r["env"]["MASTER_PORT"] for r in reports.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, rep in reports.items():
        env = rep["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["GROUP_RANK"] == "0" and env["ROLE_NAME"] == "default"
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "3"
        assert env["GROUP_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_RUN_ID"] == "run-42"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert env["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "logs" / "attempt_0" / str(rank) / "error.json")
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["OMP_NUM_THREADS"] == "3"  # an explicit value is kept
        assert env["HABITRUN_INPUTS"] == str(tmp_path / "inputs.json")
        assert env["HABITRUN_WORKDIR"] == str(tmp_path / "work")
        # every rank leads its own session and process group
        assert rep["pid"] == rep["pgid"] == rep["sid"]
        assert rep["pid"] != os.getpid()


def test_command_ranks_get_the_same_environment_and_cwd(tmp_path, console):
    code = (
        "import json, os, sys; from tests.launcher.ranks import report_env; "
        "rep = report_env(); open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps(rep))"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = launch(
        [sys.executable, "-c", code, str(tmp_path / "rank")], nprocs=2, log_dir=tmp_path / "logs",
        cwd=str(cwd), env={"PYTHONPATH": os.getcwd()}, console=console,
    )
    assert result.ok, (result.error, result.traceback)
    reps = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert [r["env"]["RANK"] for r in reps] == ["0", "1"]
    assert reps[0]["env"]["MASTER_PORT"] == reps[1]["env"]["MASTER_PORT"]
    for rep in reps:
        assert rep["cwd"] == str(cwd)
        assert rep["pid"] == rep["pgid"] == rep["sid"]  # exec'd program itself leads its group
        assert result.last.ranks[int(rep["env"]["RANK"])].pid == rep["pid"]


def test_omp_threads_follow_torchrun_default():
    base = {"PATH": "/bin"}
    common = dict(run_id="r", restart_count=0, max_restarts=0, master_addr="127.0.0.1",
                  master_port=1, error_file="e", base=base)
    assert rank_env(0, 2, **common)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in rank_env(0, 1, **common)  # torchrun sets it only for >1 rank
    assert rank_env(0, 2, **{**common, "base": {"OMP_NUM_THREADS": "4"}})["OMP_NUM_THREADS"] == "4"


def test_reserved_ports_are_distinct_and_bindable_by_rank_zero():
    held = [PortReservation() for _ in range(20)]
    try:
        ports = {r.port for r in held}
        assert len(ports) == 20
        # ports handed out by the OS meanwhile never collide with a held one
        others = []
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            others.append(s)
        assert not ports & {s.getsockname()[1] for s in others}
        for s in others:
            s.close()
        # rank 0's store (SO_REUSEADDR, as TCPStore does) can bind and listen on the held port
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", held[0].port))
        server.listen()
        client = socket.create_connection(("127.0.0.1", held[0].port), timeout=5)
        client.close()
        server.close()
    finally:
        for r in held:
            r.release()


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_function_ranks_under_every_start_method(tmp_path, console, method):
    result = launch(ranks.return_value, nprocs=2, log_dir=tmp_path, start_method=method, console=console)
    assert result.ok, result.error
    assert result.return_values == {r: {"rank": r, "squares": [0, 1, 4, 9]} for r in range(2)}
