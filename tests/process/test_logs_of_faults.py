"""Every failed subject's log exists and says what it printed and what happened; logs stay bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.engine.contract import FailureKind
from tests.process.conftest import op, run


@pytest.mark.timeout(60)
def test_a_timed_out_subject_ignoring_sigterm_leaves_a_log_with_its_output_and_the_timeout(make_backend, tasks):
    b = make_backend(workers=1, subject_timeout_sec=1, graceful_shutdown_sec=0.5)
    items = tasks({"do": "say_then_hang"}, {"do": "ok"})
    got = run(b, op("act"), items)
    assert got["S0"].kind == FailureKind.TIMEOUT and got["S1"].ok
    log = Path(items[0].log_path).read_text()
    assert "about to hang S0" in log
    assert "timed out after" in log and "SIGKILL" in log, log
    assert not list(Path(items[0].log_path).parent.parent.parent.glob("**/habitrun-worker-*.out"))


@pytest.mark.parametrize("mode", ["persistent", "isolated"])
def test_a_worker_that_exits_mid_subject_leaves_a_log_with_its_output_and_the_exit_code(make_backend, tasks, mode):
    b = make_backend(workers=1, parallel_mode=mode)
    items = tasks({"do": "say"}, {"do": "say_then_exit3"}, {"do": "ok"})
    got = run(b, op("act"), items)
    assert got["S1"].kind == FailureKind.WORKER_DIED and got["S0"].ok and got["S2"].ok
    log = Path(items[1].log_path).read_text()
    assert "about to exit S1" in log and "worker exited with code 3" in log, log
    assert "python says S0" not in log


def test_a_subject_closing_fds_1_and_2_does_not_break_the_next_one_on_the_same_worker(make_backend, tasks):
    b = make_backend(workers=1)
    items = tasks({"do": "close_std"}, {"do": "say"}, {"do": "say"})
    got = run(b, op("act"), items)
    assert all(o.ok for o in got.values()), {k: o.error for k, o in got.items()}
    assert len({o.worker_pid for o in got.values()}) == 1
    for item in items[1:]:
        log = Path(item.log_path).read_text()
        assert f"python says {item.subject_id}" in log and f"fd 2 says {item.subject_id}" in log


def test_control_characters_of_a_subject_id_are_escaped_in_its_log_header(make_backend, tasks, tmp_path):
    b = make_backend(workers=1)
    items = tasks({"id": "S\x1b[31mred\x07", "do": "raise"})
    items[0].log_path = str(tmp_path / "logs" / "s" / "evil.log")
    run(b, op("act"), items)
    header = Path(items[0].log_path).read_text().splitlines()[0]  # the rest is what the subject printed
    assert "\x1b" not in header and "\x07" not in header
    assert "subject S\\x1b[31mred\\x07 attempt" in header


@pytest.mark.timeout(90)
def test_a_subject_printing_100_mb_leaves_a_log_of_head_and_tail_within_log_max_mb(make_backend, tasks):
    b = make_backend(workers=1)  # log_max_mb: 10 by default
    items = tasks({"do": "flood", "mb": 100}, {"do": "say"})
    got = run(b, op("act"), items)
    assert got["S0"].ok and got["S1"].ok
    log = Path(items[0].log_path)
    assert log.stat().st_size < 10.1 * (1 << 20)
    with log.open("rb") as f:
        head = f.read(200)
        f.seek(5 * (1 << 20) - 100)
        middle = f.read(400)
    assert head.count(b"x") > 100 and b"bytes cut here" in middle
    assert "python says S1" in Path(items[1].log_path).read_text()


def test_log_max_mb_is_a_policy_field(make_backend, tasks):
    b = make_backend(workers=1, log_max_mb=1)
    items = tasks({"do": "flood", "mb": 3})
    assert run(b, op("act"), items)["S0"].ok
    assert Path(items[0].log_path).stat().st_size < 1.05 * (1 << 20)
