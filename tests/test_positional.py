"""The positional builders of the per-subject types: same object as the keyword call, defaults kept."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from habitrun.engine.contract import SubjectOutcome, SubjectTask, new_outcome, new_task
from habitrun.positional import builder
from habitrun.store.records import Record


@dataclass(slots=True, kw_only=True)
class _Sample:
    a: int
    b: str = "b"
    c: list = field(default_factory=list)


def test_builder_sets_given_fields_and_defaults() -> None:
    make = builder(_Sample, "a")
    one, two = make(1), make(2)
    assert one == _Sample(a=1) and two == _Sample(a=2)
    assert one.c is not two.c  # a default factory is called per object, as __init__ does


def test_builder_takes_names_in_any_order() -> None:
    assert builder(_Sample, "b", "a")("x", 3) == _Sample(a=3, b="x")


def test_builder_refuses_unknown_repeated_or_missing_fields() -> None:
    with pytest.raises(TypeError, match="unknown or repeated"):
        builder(_Sample, "a", "z")
    with pytest.raises(TypeError, match="unknown or repeated"):
        builder(_Sample, "a", "a")
    with pytest.raises(TypeError, match="'a' has no default"):
        builder(_Sample, "b")


def test_hot_path_builders_match_the_keyword_constructors() -> None:
    from habitrun.engine.events import SubjectDone
    from habitrun.engine.ledger import _new_record
    from habitrun.engine.tracing import _new_done

    task = new_task("k", "s", {"f": 1}, {}, "/w", "/l", 2)
    assert task == SubjectTask(key="k", subject_id="s", fields={"f": 1}, inputs={}, workdir="/w", log_path="/l",
                               attempt=2)
    assert new_outcome(task, True, 5, None, None, None, 0.5, 7, None) == SubjectOutcome(
        task=task, ok=True, result=5, duration_sec=0.5, worker_pid=7)
    assert _new_record("st", "k", "s", True, 5, None, None, 2, "{}", "r", "/l", 0.5) == Record(
        stage="st", key="k", subject_id="s", ok=True, result=5, attempts=2, components="{}", run_id="r",
        log_path="/l", duration_sec=0.5)
    assert _new_done("st", "s", 1, 0.5, 7, 1.0, 2.0, 3.0, 0.1, 12.0, None, None, "h", None) == SubjectDone(
        stage="st", subject="s", attempt=1, duration_sec=0.5, pid=7, queued_at=1.0, started_at=2.0, ended_at=3.0,
        cpu_sec=0.1, peak_rss_mb=12.0, read_bytes=None, write_bytes=None, host="h", gpu=None)
