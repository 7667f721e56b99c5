"""Each subject's output lands in its own log file, by whatever route it was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.engine.invoke import SCRATCH_RESET_BYTES
from tests.process.conftest import op, run


@pytest.mark.timeout(120)
def test_python_c_level_and_child_output_reach_the_subjects_own_log(make_backend, tasks):
    b = make_backend(workers=2)
    work = tasks(*[{"do": "say", "id": f"S{i}"} for i in range(6)], {"do": "quiet", "id": "Q"})
    got = run(b, op("act"), work)
    assert all(o.ok for o in got.values())
    for task in work[:6]:
        log = Path(task.log_path).read_text()
        sid = task.subject_id
        assert f"python says {sid}\n" in log and f"fd 2 says {sid}\n" in log and f"child says {sid}\n" in log
        assert log.count("says") == 3  # nobody else's lines
    assert not Path(work[6].log_path).exists()  # a subject that wrote nothing costs no file


@pytest.mark.timeout(120)
def test_after_a_flood_past_the_scratch_limit_the_next_subject_logs_only_its_own_lines(make_backend, tasks):
    b = make_backend(workers=1)
    mb = SCRATCH_RESET_BYTES // (1 << 20) + 1
    work = tasks({"do": "flood", "mb": mb, "id": "F"}, {"do": "say", "id": "A"}, {"do": "say", "id": "B"})
    got = run(b, op("act"), work)
    assert all(o.ok for o in got.values())
    assert Path(work[0].log_path).stat().st_size > mb << 20
    for task in work[1:]:
        log = Path(task.log_path).read_text()
        assert log.count("says") == 3 and "xxx" not in log


@pytest.mark.timeout(120)
def test_a_subject_that_swaps_or_closes_sys_stdout_does_not_cost_the_next_one_its_log(make_backend, tasks):
    """Each subject starts with sys.stdout writing to the captured fd 1, whatever the one before did to it."""
    b = make_backend(workers=1)
    work = tasks({"do": "say", "id": "A"}, {"do": "swap_stdout", "id": "W"}, {"do": "say", "id": "B"},
                 {"do": "close_stdout", "id": "C"}, {"do": "say", "id": "D"})
    got = run(b, op("act"), work)
    assert all(o.ok for o in got.values())
    assert len({o.worker_pid for o in got.values()}) == 1  # one worker ran them all, in turn
    for task in (work[0], work[2], work[4]):
        log = Path(task.log_path).read_text()
        assert f"python says {task.subject_id}\n" in log, log
