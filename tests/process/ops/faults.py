"""Operators that misbehave on purpose; each subject's ``fields["do"]`` says how."""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.handle = lambda: None  # pickling this exception fails

    def __reduce__(self):
        raise TypeError("cannot pickle Unpicklable")


def _allocate(mb, hold=0.0, step_mb=20):
    chunks = []
    for _ in range(max(1, mb // step_mb)):
        chunk = bytearray(step_mb * 1024 * 1024)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        chunks.append(chunk)
        time.sleep(0.02)
    time.sleep(hold)
    return chunks


def act(subject):
    do = subject.fields.get("do", "ok")
    if do == "ok":
        return {"id": subject.id, "pid": os.getpid()}
    if do == "sleep":
        time.sleep(float(subject.fields.get("sec", 3600)))
        return {"id": subject.id, "pid": os.getpid()}
    if do == "raise":
        raise ValueError(f"bad subject {subject.id}")
    if do == "exit3":
        os._exit(3)
    if do == "exit0":
        os._exit(0)
    if do == "sysexit0":
        sys.exit(0)
    if do == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if do == "segv":
        ctypes.string_at(0)
    if do == "memerror":
        raise MemoryError("cannot allocate")
    if do == "alloc":
        _allocate(int(subject.fields["mb"]), hold=float(subject.fields.get("hold", 5)))
        return "survived"
    if do == "alloc_then_sigkill":
        kept = _allocate(int(subject.fields["mb"]), hold=float(subject.fields.get("hold", 0.6)))
        os.kill(os.getpid(), signal.SIGKILL)
        return len(kept)
    if do == "unpicklable_result":
        return lambda: None
    if do == "unpicklable_exc":
        raise Unpicklable("weird failure")
    if do == "big":
        return b"x" * (50 * 1024 * 1024)
    if do == "env":
        return {k: os.environ.get(k) for k in (*THREAD_VARS, "CUDA_VISIBLE_DEVICES")}
    if do == "child_then_hang":
        # a subject that starts its own process and ignores SIGTERM
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(subject.fields["pidfile"]).write_text(str(child.pid))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    if do == "flaky":
        marker = Path(subject.workdir) / "tried"
        if not marker.exists():
            marker.write_text("1")
            raise RuntimeError("first attempt fails")
        return "second time lucky"
    if do == "say":
        # output by every route a subject has: Python, a C-level write, a child process
        print(f"python says {subject.id}")
        os.write(2, f"fd 2 says {subject.id}\n".encode())
        subprocess.run(["sh", "-c", f"echo child says {subject.id}"], check=True)
        return "said"
    if do == "swap_stdout":  # leaves sys.stdout pointing at something that is not fd 1
        import io
        sys.stdout = io.StringIO()
        return "swapped"
    if do == "close_stdout":  # leaves sys.stdout closed
        sys.stdout.close()
        return "closed"
    if do == "flood":
        sys.stdout.write("x" * (int(subject.fields["mb"]) << 20) + "\n")
        return "flooded"
    if do == "say_then_hang":
        print(f"about to hang {subject.id}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
        time.sleep(3600)
    if do == "say_then_exit3":
        print(f"about to exit {subject.id}", flush=True)
        os._exit(3)
    if do == "close_std":
        print("closing fds 1 and 2", flush=True)
        os.close(1)
        os.close(2)
        return "closed"
    if do == "daemon":
        start_daemon(subject.fields["pidfile"])
        return "left a daemon behind"
    if do == "daemon_then_hang":
        start_daemon(subject.fields["pidfile"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    if do == "child_outlives":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(subject.fields["pidfile"]).write_text(str(child.pid))
        return "left a child running"
    if do == "orphan":
        subprocess.run(["sh", "-c", "true & exit 0"], check=True)  # the backgrounded `true` is orphaned
        time.sleep(0.2)
        return "orphaned"
    if do == "zombies":
        return sorted(int(p) for p in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split())
    if do == "quiet":
        return "nothing to say"
    raise AssertionError(f"unknown action {do!r}")


def start_daemon(pidfile):
    """Double fork and setsid: a daemon outside the worker's process group, holding fds 1 and 2."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            Path(f"{pidfile}.tmp").write_text(str(os.getpid()))
            os.replace(f"{pidfile}.tmp", pidfile)  # whole or absent: the subject may end right after it appears
            time.sleep(120)
        os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while not Path(pidfile).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def daemon_op(subject, pidfile):
    start_daemon(f"{pidfile}.{subject.id}")
    print(f"{subject.id} left a daemon behind")
    return subject.id


def size_of(subject):
    return len(subject.input("big"))


def second_stage(subject):
    return {"stage": 2, "pid": os.getpid(), "id": subject.id}


class Built:
    """A class operator: counts how often it is built in this process."""

    builds = 0

    def __init__(self, tag="x"):
        type(self).builds += 1
        self.tag = tag

    def __call__(self, subject):
        return {"pid": os.getpid(), "builds": type(self).builds, "tag": self.tag}


def busy(subject, ms=1.0):
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass
    return subject.id


def total(collection):
    return sum(collection.values())


def once(subject, marks):
    """Sleep ``fields["sec"]`` (default 0), failing if this subject already ran (a marker file per subject)."""
    fd = os.open(os.path.join(marks, subject.id), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.close(fd)
    time.sleep(float(subject.fields.get("sec", 0)))
    return {"id": subject.id, "pid": os.getpid(), "ended": time.monotonic()}
