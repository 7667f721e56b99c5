"""Dispatch never leaves a worker idle (or unstarted) while a subject waits.

Subjects of unknown or long duration go one to a worker, and every worker the
policy allows starts while subjects are pending; only subjects known to be
short are queued ahead in a worker (see test_pipelining for those).
"""

from __future__ import annotations

import time

import pytest

from tests.process.conftest import op, run


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_four_long_subjects_on_four_workers_take_one_subjects_time(make_backend, tasks):
    # Queued two to a worker, two workers would run them in 2 x 3 s (6.6 s measured);
    # one to each of four workers, they take 3 s and the workers' start.
    b = make_backend(workers=4)
    start = time.monotonic()
    got = run(b, op("act"), tasks(*[{"do": "sleep", "sec": 3}] * 4))
    wall = time.monotonic() - start
    assert all(o.ok for o in got.values())
    assert len({o.worker_pid for o in got.values()}) == 4  # each ran on a worker of its own
    assert wall < 5.5, f"4 x 3 s on 4 workers took {wall:.1f} s: some ran one after another"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_busy_worker_is_not_handed_the_next_subject_while_durations_are_unknown(make_backend, tasks):
    # One long subject and four short ones on two workers: the short ones all go to the
    # worker that is free, none waits queued behind the long one.
    b = make_backend(workers=2)
    fields = [{"do": "sleep", "sec": 4}] + [{"do": "sleep", "sec": 0.2}] * 4
    got = run(b, op("act"), tasks(*fields))
    assert all(o.ok for o in got.values())
    long_pid = got["S0"].worker_pid
    assert all(got[f"S{i}"].worker_pid != long_pid for i in range(1, 5))
