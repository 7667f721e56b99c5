"""Behaviours 10 and 11: GPU pool capping and pinning, BLAS/OpenMP thread caps."""

from __future__ import annotations

import pytest

from habitrun.engine.process.gpu import detect_gpus
from tests.process.conftest import op, run


def test_workers_are_capped_to_the_gpu_pool_and_pinned_one_each(make_backend, tasks, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    b = make_backend(workers=4, cap_workers_to_gpu_pool=True)
    assert b.effective_workers == 2
    got = run(b, op("act"), tasks(*[{"do": "env"}] * 8))
    seen = {o.worker_pid: o.result["CUDA_VISIBLE_DEVICES"] for o in got.values()}
    assert set(seen.values()) <= {"3", "5"}
    assert len(seen) == len(set(seen.values()))  # each worker its own device


def test_no_gpu_detected_means_no_capping(make_backend, tasks, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi either
    assert detect_gpus() == []
    b = make_backend(workers=3, cap_workers_to_gpu_pool=True)
    assert b.effective_workers == 3


@pytest.mark.parametrize("visible, expected", [("0,1,2", ["0", "1", "2"]), ("", []), ("-1", []),
                                               ("GPU-abc, GPU-def", ["GPU-abc", "GPU-def"])])
def test_detection_reads_cuda_visible_devices(visible, expected):
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": visible}) == expected


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_thread_caps_override_the_parents_values(make_backend, tasks, monkeypatch, method):
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "64")
    b = make_backend(workers=1, worker_threads=3, start_method=method)
    got = run(b, op("act"), tasks({"do": "env"}))
    env = got["S0"].result
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        assert env[var] == "3", var
