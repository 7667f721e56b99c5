"""Operators of the backend behaviour suite: each subject's ``fields["do"]`` says what to do.

Used both through ``Backend.run_tasks`` (found through ``OperatorRef.search_path``)
and from a recipe (the file is copied beside it). Every call appends a line to
``marker_dir/<subject>.log`` when a ``marker_dir`` is given, so a test counts
how often each subject really ran.
"""

import os
import signal
import time


def _mark(marker_dir, sid):
    if marker_dir:
        with open(os.path.join(marker_dir, f"{sid}.log"), "a") as f:
            f.write(f"start {os.getpid()}\n")


def _runs(marker_dir, sid):
    try:
        with open(os.path.join(marker_dir, f"{sid}.log")) as f:
            return len(f.read().splitlines())
    except FileNotFoundError:
        return 0


def _hog(limit_mb):
    """Allocate (and touch) 20 MB at a time until stopped, at most ``limit_mb``."""
    blocks = []
    for _ in range(limit_mb // 20):
        block = bytearray(20 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        blocks.append(block)
        time.sleep(0.02)
    return len(blocks)


def act(subject, marker_dir=None, fail_file=None):
    """The subject's action; ``fail_file`` lists ids that fail now (changed between runs, keys stay)."""
    _mark(marker_dir, subject.id)
    do = subject.fields.get("do") or "ok"
    print(f"suite op runs {subject.id}: {do}")
    if fail_file and os.path.exists(fail_file):
        with open(fail_file) as f:
            if subject.id in f.read().split():
                raise ValueError(f"subject {subject.id} is listed to fail")
    if do == "sleep":
        time.sleep(float(subject.fields.get("sec") or 3600))
    elif do == "raise":
        raise ValueError(f"subject {subject.id} is broken on purpose")
    elif do == "exit3":
        os._exit(3)
    elif do == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif do == "hog":
        return {"survived": _hog(2000)}
    elif do == "raise_once" and _runs(marker_dir, subject.id) == 1:
        raise RuntimeError(f"first attempt of {subject.id} fails")
    elif do == "die_once" and _runs(marker_dir, subject.id) == 1:
        os._exit(3)
    elif do == "exit0":
        os._exit(0)
    elif do == "gpu":  # the device a worker was pinned to (no GPU needed: it is an environment variable)
        time.sleep(float(subject.fields.get("sec") or 0))
        return {"id": subject.id, "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
    elif do not in ("ok", "raise_once", "die_once"):
        raise AssertionError(f"unknown action {do!r}")
    return {"id": subject.id, "pid": os.getpid(), "stage": 1}


def second(subject, marker_dir=None):
    """A second stage's operator: a worker bound to the first stage's must not answer for it."""
    _mark(marker_dir, f"second-{subject.id}")
    return {"id": subject.id, "pid": os.getpid(), "stage": 2}


class Unbuildable:
    """A class operator whose constructor raises (as when a dependency is missing on the worker)."""

    def __init__(self, marker_dir=None):
        raise ImportError("No module named 'nibabel'")

    def __call__(self, subject):
        raise AssertionError("never called: the class was never built")
