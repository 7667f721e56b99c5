"""torchrun's error-file format, written by ``record`` and read back as the group's root cause."""

from __future__ import annotations

import json
import sys

import pytest

from habitrun.launcher import launch, read_error_file, record
from tests.launcher import ranks
from tests.launcher.conftest import needs_torch


def test_record_writes_torchruns_json_and_reraises(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def broken():
        raise ValueError("bad value 7")

    try:
        broken()
    except ValueError:
        pass
    else:
        raise AssertionError("record swallowed the exception")
    data = json.loads(path.read_text())
    message = data["message"]
    assert message["message"] == "ValueError: bad value 7"
    assert "raise ValueError(\"bad value 7\")" in message["extraInfo"]["py_callstack"]
    assert int(message["extraInfo"]["timestamp"]) > 1_600_000_000
    info = read_error_file(path)
    assert info.message == "ValueError: bad value 7" and "broken" in info.traceback


def test_record_returns_none_on_exit_zero_and_records_exit_messages(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    assert record(lambda: sys.exit(0))() is None
    assert not path.exists()
    try:
        record(lambda: sys.exit("install the thing"))()
    except SystemExit:
        pass
    assert read_error_file(path).message == "SystemExit: install the thing"


@pytest.mark.torch
@needs_torch
def test_error_files_are_readable_by_torch_and_torchs_by_us(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    for path, deco in ((ours, record), (theirs, torch_record)):
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

        @deco
        def fail():
            raise OSError("disk gone")

        try:
            fail()
        except OSError:
            pass
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(ours))
    assert failure.message["message"] == "OSError: disk gone"  # torch keeps the structured message
    assert failure.timestamp == read_error_file(ours).timestamp
    assert read_error_file(theirs).message == "OSError: disk gone"
    assert "disk gone" in read_error_file(theirs).traceback


def test_unreadable_error_files_are_ignored(tmp_path):
    (tmp_path / "junk.json").write_text("{not json")
    assert read_error_file(tmp_path / "junk.json") is None
    assert read_error_file(tmp_path / "missing.json") is None
    (tmp_path / "plain.json").write_text(json.dumps({"message": "just text"}))
    assert read_error_file(tmp_path / "plain.json").message == "just text"


def test_root_cause_names_the_failing_rank_with_its_traceback(tmp_path, console):
    result = launch(ranks.crash_one, nprocs=3, log_dir=tmp_path, args=("exception", 2, str(tmp_path)),
                    grace=5, console=console, start_method="forkserver")
    assert result.status == "failed"
    cause = result.root_cause
    assert cause.local_rank == 2 and not cause.stopped
    assert result.error.startswith(f"rank 2 (pid {cause.pid}) exited with code 1: RuntimeError: rank 2 broke")
    assert "in crash_one" in result.traceback and 'raise RuntimeError(f"rank {rank} broke' in result.traceback
    assert cause.error_file == str(tmp_path / "attempt_0" / "2" / "error.json")
    # the ranks stopped because of it are not blamed
    others = [result.last.ranks[r] for r in (0, 1)]
    assert all(r.stopped and r.signal == 15 for r in others)


def test_command_decorated_with_record_gives_the_root_cause(tmp_path, console):
    code = "from tests.launcher.ranks import decorated_failure; decorated_failure()"
    result = launch([sys.executable, "-c", code], nprocs=1, log_dir=tmp_path, console=console)
    assert result.status == "failed"
    assert result.error.endswith("KeyError: 'missing-thing'")
    assert "decorated_failure" in result.traceback


def test_undecorated_command_failure_points_at_its_stderr(tmp_path, console):
    code = "import sys; print('last words', file=sys.stderr); sys.exit(4)"
    result = launch([sys.executable, "-c", code], nprocs=1, log_dir=tmp_path, console=console)
    assert result.status == "failed"
    assert "exited with code 4" in result.error and "no error file" in result.error
    assert "stderr.log" in result.error
    assert result.traceback == "last words"


def test_flat_error_files_keep_their_top_level_timestamp(tmp_path, console):
    # torch's flat format, as a script without @record (or an older torch) writes it
    (tmp_path / "int.json").write_text(json.dumps({"message": "boom", "timestamp": 10}))
    (tmp_path / "str.json").write_text(json.dumps({"message": "boom", "timestamp": "1700000000"}))
    (tmp_path / "bad.json").write_text(json.dumps({"message": "boom", "timestamp": "soon"}))
    assert read_error_file(tmp_path / "int.json").timestamp == 10
    assert read_error_file(tmp_path / "str.json").timestamp == 1_700_000_000
    assert read_error_file(tmp_path / "bad.json").timestamp is None
    # a real rank writing the flat format: the launcher reads its timestamp back
    import psutil

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    code = ("import json, os, sys; json.dump({'message': 'flat failure', 'timestamp': 42}, "
            "open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w')); sys.exit(3)")
    result = launch([sys.executable, "-c", code], nprocs=1, log_dir=tmp_path / "logs", console=console)
    assert result.status == "failed"
    assert result.root_cause.error.message == "flat failure" and result.root_cause.error.timestamp == 42
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= before
