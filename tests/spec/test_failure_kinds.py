"""Every failure kind has an explicit retry group, and a kind stays its text wherever it goes."""

from __future__ import annotations

import json
import pickle
import sqlite3

import pytest

from habitrun.spec.failures import FailureKind
from habitrun.spec.policy import RETRY_GROUP, RETRY_KINDS, RunPolicy


@pytest.mark.parametrize("kind", list(FailureKind))
def test_every_kind_has_a_retry_group(kind: FailureKind) -> None:
    assert kind in RETRY_GROUP, f"{kind.name} has no entry in spec/policy.py RETRY_GROUP (None: never retried)"
    assert RETRY_GROUP[kind] is None or RETRY_GROUP[kind] in RETRY_KINDS


def test_the_groups_name_only_kinds() -> None:
    assert set(RETRY_GROUP) == {k.value for k in FailureKind}


def test_retries_follow_the_groups() -> None:
    everything = RunPolicy(auto_retry_on="all")
    assert {k for k in FailureKind if everything.retries(k)} == {k for k, g in RETRY_GROUP.items() if g}
    default = RunPolicy()
    assert default.retries("oom") and default.retries(FailureKind.WORKER_DIED)
    assert not default.retries(FailureKind.TIMEOUT) and not default.retries("exception")
    assert not everything.retries(FailureKind.DISK_FULL) and not everything.retries(FailureKind.INTERRUPTED)
    assert RunPolicy(auto_retry_on=["exception"]).retries(None)  # a failure without a kind: an exception
    with pytest.raises(KeyError):
        everything.retries("no-such-kind")


def test_a_kind_is_its_text_in_json_sqlite_pickle_and_format() -> None:
    kind = FailureKind.SPAWN_TIMEOUT
    assert kind == "spawn_timeout" and f"{kind}" == str(kind) == "{}".format(kind) == "spawn_timeout"  # noqa: UP032
    assert json.dumps({"kind": kind}) == '{"kind": "spawn_timeout"}'
    back = pickle.loads(pickle.dumps(kind, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is str and back == kind
    assert b"FailureKind" not in pickle.dumps(kind, protocol=pickle.HIGHEST_PROTOCOL)
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (k TEXT)")
    con.execute("INSERT INTO t VALUES (?)", (kind,))
    assert con.execute("SELECT k, typeof(k) FROM t").fetchall() == [("spawn_timeout", "text")]
