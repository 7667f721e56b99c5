"""RunPolicy: the design's names and defaults, its rules, and its round trips."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from ruamel.yaml import YAML

from habitrun.spec.policy import RunPolicy
from habitrun.spec.yamlpos import dump_yaml

DESIGN_DEFAULTS = {
    "workers": 1,
    "subject_timeout_sec": 900,
    "subject_spawn_timeout_sec": 120,
    "graceful_shutdown_sec": 15,
    "on_subject_failure": "continue",
    "oom_backoff": True,
    "oom_reduce_workers_by": 1,
    "cap_workers_to_gpu_pool": False,
    "resume": True,
    "checkpoint_dir": None,
    "parallel_mode": "persistent",
    "auto_retry_rounds": 2,
    "auto_retry_on": ("worker_died", "oom"),
    "retry_failed_subjects": False,
    "force_rerun_subjects": (),
    "clear_checkpoint_on_success": False,
    "strict_checkpoint_hash": False,
    "persistent_worker_max_consecutive_failures": 1,
    "persistent_worker_recycle_after_tasks": 0,
    "worker_threads": 1,
    "worker_memory_limit_mb": None,
    "backend": "process",
}


def test_defaults_are_the_designs():
    policy = RunPolicy()
    for name, value in DESIGN_DEFAULTS.items():
        assert getattr(policy, name) == value, name


def test_frozen_and_closed():
    with pytest.raises(ValidationError):
        RunPolicy(wrkers=2)
    with pytest.raises(ValidationError):
        RunPolicy().workers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        {"workers": 0},
        {"subject_timeout_sec": 0},
        {"subject_spawn_timeout_sec": -1},
        {"oom_reduce_workers_by": 0},
        {"worker_threads": 0},
        {"worker_memory_limit_mb": 0},
        {"on_subject_failure": "stop"},
        {"parallel_mode": "pooled"},
        {"backend": "threads"},
        {"force_rerun_subjects": [None]},
        {"backend": "serial", "workers": 2, "subject_timeout_sec": None},
        {"backend": "serial"},  # the default timeout needs a process boundary
        {"backend": "serial", "subject_timeout_sec": None, "parallel_mode": "isolated"},
        {"backend": "serial", "subject_timeout_sec": None, "worker_memory_limit_mb": 100},
        {"parallel_mode": "isolated", "persistent_worker_recycle_after_tasks": 5},
        {"dask": {}},
    ],
)
def test_rejected(fields):
    with pytest.raises(ValidationError):
        RunPolicy(**fields)


def test_accepted_edges():
    assert RunPolicy(subject_timeout_sec=None).subject_timeout_sec is None
    assert RunPolicy(backend="serial", subject_timeout_sec=None).backend == "serial"
    assert RunPolicy(force_rerun_subjects=["a", 7]).force_rerun_subjects == ("a", "7")
    assert RunPolicy(force_rerun_subjects="a").force_rerun_subjects == ("a",)


def test_merged_override():
    base = RunPolicy(workers=4)
    assert base.merged({"parallel_mode": "isolated"}).workers == 4
    assert base.merged(None) is base
    with pytest.raises(ValidationError):
        base.merged({"workers": 0})


policies = st.builds(
    RunPolicy,
    workers=st.integers(1, 64),
    subject_timeout_sec=st.one_of(st.none(), st.floats(0.001, 1e6)),
    on_subject_failure=st.sampled_from(["continue", "fail_fast"]),
    parallel_mode=st.just("persistent"),
    force_rerun_subjects=st.lists(st.text(min_size=1, max_size=10), max_size=4).map(tuple),
    worker_memory_limit_mb=st.one_of(st.none(), st.integers(1, 10**6)),
    checkpoint_dir=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    persistent_worker_recycle_after_tasks=st.integers(0, 100),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies)
def test_dict_and_yaml_round_trip(policy: RunPolicy):
    assert RunPolicy.from_dict(policy.to_dict()) == policy
    text = dump_yaml(policy.to_dict())
    assert RunPolicy.from_dict(YAML(typ="safe", pure=True).load(text)) == policy


def test_yaml_round_trip_of_awkward_text():
    policy = RunPolicy(force_rerun_subjects=("\x85", "a\u2028b", "é", " x ", "null", "1"), checkpoint_dir="~/x: y")
    assert RunPolicy.from_dict(YAML(typ="safe", pure=True).load(dump_yaml(policy.to_dict()))) == policy
