"""The SLURM commands habitrun runs (sbatch, squeue, scancel, scontrol): argv in, plain answers or a SlurmError out.

The one place habitrun talks to SLURM, so that every call is bounded by a
timeout and every way it can go wrong (a missing command, a refusal, a hung
controller) becomes a :class:`~habitrun.errors.SlurmError` naming the command,
its exit code and the last line it wrote to stderr, never a traceback. The
message is SLURM's text as data; the CLI escapes it when it prints.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from habitrun.errors import SlurmError
from habitrun.spec.policy import SlurmSettings

TIMEOUT_SEC = 60.0
"""Longest wait for one SLURM command: a controller that does not answer within it is an error, not a hang."""

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")

# A line of `squeue -o "%i %T"`: "123_4 RUNNING", or an array's pending tasks folded as "123_[5-9%2] PENDING".
_TASK_LINE = re.compile(r"^(\d+)_(\d+|\[[^\]]*\])$")
_GONE = "invalid job id"  # squeue/scancel/scontrol about a job SLURM no longer knows


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run(argv: Sequence[str], *, ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run one SLURM command (bounded by TIMEOUT_SEC); SlurmError when it cannot run, hangs or fails."""
    name = argv[0]
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_SEC,
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{name} is not installed here (not found on PATH): is this a SLURM cluster's "
                         "login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{name} did not answer within {TIMEOUT_SEC:.0f} s (is the SLURM controller "
                         "reachable?)") from None
    except OSError as exc:
        raise SlurmError(f"{name} could not be started: {exc.strerror or exc}") from None
    if done.returncode not in ok_codes:
        raise failed(name, done.returncode, done.stderr or done.stdout)
    return done


def failed(name: str, code: int, stderr: str) -> SlurmError:
    """The error of a SLURM command that exited ``code``: the command, the code, stderr's last line."""
    last = _last_line(stderr)
    return SlurmError(f"{name} failed (exit {code})" + (f": {last}" if last else ""))


def why_unavailable() -> str | None:
    """None when sbatch, squeue, scancel and scontrol are on PATH; else which are missing, in words."""
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if not missing:
        return None
    return (f"backend 'slurm' needs the SLURM commands on PATH; not found: {', '.join(missing)} "
            "(run habitrun on the cluster's login node)")


def sbatch_argv(settings: SlurmSettings, *, workers: int, worker_threads: int, job_name: str, array: str,
                output: str, script: Path, script_args: Sequence[str]) -> list[str]:
    """The sbatch command submitting ``script`` as the array ``array`` ("0-K") of worker sessions.

    Each task asks for ``cpus_per_task`` (default: its ``workers`` × ``worker_threads``), is warned
    ``signal_sec`` before its end with USR1 (the session stops and requeues itself) and is requeued on
    pre-emption or a node failure when ``settings.requeue``. ``--parsable`` makes the answer a job id.
    """
    if settings.max_running is not None and "%" not in array:
        array = f"{array}%{settings.max_running}"
    cpus = settings.cpus_per_task or max(1, workers) * max(1, worker_threads)
    # --open-mode=append: a requeued task's output follows its first run's (SLURM truncates it otherwise)
    argv = ["sbatch", "--parsable", f"--job-name={job_name}", f"--array={array}", f"--output={output}",
            "--open-mode=append",
            f"--signal=B:USR1@{settings.signal_sec}", "--requeue" if settings.requeue else "--no-requeue",
            f"--cpus-per-task={cpus}"]
    for option, value in (("--partition", settings.partition), ("--time", settings.time),
                          ("--mem", settings.mem), ("--gres", settings.gres), ("--account", settings.account),
                          ("--qos", settings.qos)):
        if value is not None:
            argv.append(f"{option}={value}")
    argv.extend(settings.extra)
    argv.append(str(script))
    argv.extend(script_args)
    return argv


def submit(argv: Sequence[str]) -> str:
    """Submit with sbatch (``argv`` from :func:`sbatch_argv`); the job id of the array.

    ``--parsable`` prints "123" or "123;cluster". An array larger than the cluster allows is refused
    by sbatch as an "invalid job array specification": the message then says the cluster's MaxArraySize.
    """
    try:
        done = _run(argv)
    except SlurmError as exc:
        if "array specification" in exc.message.lower() and any(a.startswith("--array") for a in argv):
            try:
                limit = max_array_size()
            except SlurmError:
                raise exc from None
            raise SlurmError(f"{exc.message} (this cluster's MaxArraySize is {limit}: an array's task "
                             f"indices must be below {limit})") from None
        raise
    job_id = _last_line(done.stdout).split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered no job id: {_last_line(done.stdout) or '(nothing)'!r}")
    return job_id


@functools.lru_cache(maxsize=1)
def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``), asked once per process: array task
    indices must be below it."""
    done = _run(["scontrol", "show", "config"])
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "MaxArraySize":
            try:
                return int(value.strip())
            except ValueError:
                break
    raise SlurmError("scontrol show config gave no MaxArraySize (set slurm.max_array_size in the policy)")


def _indices(spec: str) -> list[int]:
    """The task indices of a folded array spec: "[5-9%2]", "[1,3,5-7]", "[0-10:2]"."""
    body = spec.strip("[]").split("%", 1)[0]
    out: list[int] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        span, _, step_text = part.partition(":")
        first_text, _, last_text = span.partition("-")
        try:
            first = int(first_text)
            last = int(last_text) if last_text else first
            step = int(step_text) if step_text else 1
        except ValueError:
            continue
        out.extend(range(first, last + 1, max(1, step)))
    return out


def parse_squeue(text: str, array_ids: Sequence[str] = ()) -> dict[tuple[str, int], str]:
    """(array id, task index) -> state from lines of ``squeue -o "%i %T"``; other lines are left out.

    Folded pending tasks ("123_[5-9%2]") are unfolded, each with the line's state. ``array_ids``: keep
    only those arrays (empty: all).
    """
    wanted = set(array_ids)
    out: dict[tuple[str, int], str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        match = _TASK_LINE.match(fields[0])
        if match is None:
            continue
        array_id, task = match.groups()
        if wanted and array_id not in wanted:
            continue
        for index in _indices(task) if task.startswith("[") else [int(task)]:
            out[(array_id, index)] = fields[1]
    return out


def live_tasks(array_ids: Sequence[str]) -> dict[tuple[str, int], str]:
    """The array tasks SLURM still holds, (array id, task index) -> state (PENDING, RUNNING, ...).

    One ``squeue -r`` call for all arrays (pending tasks listed one by one). Arrays SLURM has
    forgotten are simply absent; all gone -> {} (squeue then exits 1 "Invalid job id": no error).
    """
    ids = [str(i) for i in dict.fromkeys(array_ids)]
    if not ids:
        return {}
    argv = ["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i %T"]
    done = _run(argv, ok_codes=(0, 1))
    if done.returncode != 0:
        if _GONE in (done.stderr or "").lower():
            return {}
        raise failed("squeue", done.returncode, done.stderr or done.stdout)
    return parse_squeue(done.stdout, ids)


def cancel(ids: Sequence[str], *, signal: str | None = None, batch: bool = False) -> None:
    """Cancel these jobs or arrays (``scancel``); one that already ended is no error.

    ``signal`` (e.g. "INT"): send it instead of cancelling; ``batch``: only to the batch shell (the
    habitrun session of an array task), not to every process of the job."""
    ids = [str(i) for i in dict.fromkeys(ids)]
    if not ids:
        return
    options = ([f"--signal={signal}"] if signal else []) + (["--batch"] if batch else [])
    done = _run(["scancel", *options, *ids], ok_codes=(0, 1))
    if done.returncode != 0:
        errors = [line for line in (done.stderr or "").splitlines() if "error" in line.lower()]
        if errors and all(_GONE in line.lower() or "already" in line.lower() for line in errors):
            return
        raise failed("scancel", done.returncode, done.stderr or done.stdout)


def requeue(job_id: str) -> None:
    """Put a running job (an array task: its own SLURM_JOB_ID) back in the queue (``scontrol requeue``)."""
    _run(["scontrol", "requeue", str(job_id)])
