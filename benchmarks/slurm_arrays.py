"""Many short subjects on SLURM: habitrun's job arrays against Dask-on-SLURM and one ``sbatch`` per subject.

N subjects (default 2000) of an operator that sleeps M ms (default 50) and
returns a value, on the SLURM this machine runs (``tests/cluster/slurm_up.sh``:
one node, 2 CPUs, ``MaxArraySize`` 4), three ways, one after the other in one
run, each on a fresh study folder:

* ``slurm``: ``habitrun run recipe.yaml`` with ``backend: slurm`` (job arrays
  of warm worker sessions, ``workers: 1`` per array task, ``chunk_size``
  subjects per task), as a subprocess, timed from start to exit.
  Jobs submitted = the array tasks of every array each batch folder's
  ``arrays.json`` lists (one per task however often it was requeued; a
  resubmission of lost subjects is a new batch, so it counts), ``sbatch`` calls =
  those arrays; without ``arrays.json``, the tasks whose output files
  (``.habitrun/slurm/<batch>/out/slurm-<array>_<task>.out``) the run left.
* ``dask``: ``habitrun run recipe.yaml`` with ``backend: dask`` and
  ``dask.jobqueue`` on SLURM (``workers: 2``, one core per job: 2 jobs), as a
  subprocess, timed the same way. Jobs submitted = the distinct job ids in
  ``.habitrun/dask-jobs/logs/`` (dask-jobqueue names each job's output after it).
* ``sbatch``: the pattern of Snakemake's SLURM plugin, one job per subject:
  a driver submits one ``sbatch --wrap "python -c ..."`` per subject (each
  imports the same operator, runs it on its subject and writes the result to a
  file), polls ``squeue`` until none is left, then reads every result file.
  Timed from the first ``sbatch`` to the last file checked. Like Snakemake's
  ``--jobs N``, at most ``--per-job-queue`` (default 20) of its jobs are queued
  at once, so that the jobs of others on the shared cluster are not stuck
  behind a wall of them. It may run on fewer subjects (``--per-job-n``, default
  at most 100: about 1.2 s per job here): the table then says so and compares
  its rate, it never extrapolates its wall time.

Every leg's correctness is checked (every subject's value, exit code 0), and a
failed leg prints its error in its row while the others go on. While a leg runs,
a thread lists its jobs in ``squeue`` every 0.5 s: the ``squeue saw`` column
(a cross-check of the jobs count; a task shorter than the poll can be missed).

Every job is named ``hr-bench-<leg>`` (habitrun's arrays through
``slurm.extra: ["--job-name=..."]``, Dask's through ``job_extra_directives``);
at exit, on Ctrl-C or SIGTERM the script stops its runs and cancels jobs of
those names only (``scancel --name``), never anyone else's.

    python benchmarks/slurm_arrays.py --n 100               # quick: all three legs
    python benchmarks/slurm_arrays.py                       # 2000 x 50 ms (the issue's figures)
    python benchmarks/slurm_arrays.py --only slurm dask --n 2000

Ratio = this leg's seconds per subject / habitrun slurm's (if that leg failed,
the first leg that worked is the reference, and the header says which).
The cluster is shared: the jobs of others in ``squeue`` at each leg's start are
printed in its note.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LEGS = ("slurm", "dask", "sbatch")
TITLES = {"slurm": "habitrun slurm arrays", "dask": "habitrun dask-jobqueue", "sbatch": "sbatch per subject"}
NAMES = {leg: f"hr-bench-{leg}" for leg in LEGS}  # every job this script makes is named so
STAGE = "nap"

OPS = textwrap.dedent('''
    import time


    def nap(subject, ms=50.0):
        """Sleep ``ms`` milliseconds; the value proves the subject ran with its own fields."""
        time.sleep(ms / 1000.0)
        return {"value": int(subject.fields["n"]) * 2}
''')

# One subject, as one job of the per-subject leg runs it (argv: study, subject id, n, ms, result file).
ONE_SUBJECT = (
    "import json, os, sys, types; study, sid, n, ms, out = sys.argv[1:6]; sys.path.insert(0, study); "
    "import ops; value = ops.nap(types.SimpleNamespace(id=sid, fields={'n': n}), ms=float(ms)); "
    "tmp = out + '.tmp'; open(tmp, 'w').write(json.dumps(value)); os.replace(tmp, out)"
)


@dataclass
class Row:
    """One leg's line of the table."""

    leg: str
    subjects: int
    wall: float | None = None
    jobs: str = "-"
    seen: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class JobWatcher:
    """Every job (array tasks one by one) named ``name`` that squeue lists while the watcher runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"watch-{name}", daemon=True)

    def __enter__(self) -> JobWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.seen.update(queued(self.name) or ())
            self._stop.wait(0.5)


def queued(name: str | None = None) -> list[str] | None:
    """Job ids in squeue (array tasks one by one), only those named ``name`` if given; None if squeue failed."""
    argv = ["squeue", "-h", "-r", "-o", "%i|%j"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # e.g. slurmctld busy: not "no jobs"
        return None
    out = done.stdout
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return [i for i, j in rows if name is None or j == name]


def foreign_jobs() -> int:
    """Jobs in the queue that are not this script's (the cluster is shared)."""
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30).stdout
    return sum(1 for name in out.split() if not name.startswith("hr-bench"))


def cancel_ours(wait: float = 30.0) -> None:
    """Cancel this script's jobs (by their names only) and wait for squeue to drop them."""
    for name in NAMES.values():
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=60, check=False)
    deadline = time.monotonic() + wait
    while any(queued(n) != [] for n in NAMES.values()) and time.monotonic() < deadline:
        time.sleep(0.5)


def make_study(folder: Path, n: int, ms: float, policy: dict[str, object]) -> Path:
    """A one-stage study of ``n`` subjects napping ``ms`` ms; its recipe's path."""
    folder.mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    rows = ["subject_id,n"] + [f"S{i:05d},{i}" for i in range(n)]
    (folder / "subjects.csv").write_text("\n".join(rows) + "\n")
    recipe = {
        "habitrun": 1,
        "name": folder.name,
        "subjects": {"manifest": "subjects.csv"},
        "policy": {"subject_timeout_sec": 120, "auto_retry_rounds": 0, **policy},
        "stages": [{"name": STAGE, "operator": f"ops:{STAGE}", "params": {"ms": ms}}],
    }
    path = folder / "recipe.yaml"
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML
    return path


def last_words(text: str) -> str:
    """The last non-empty line of a command's output: what it said when it failed."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def habitrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "habitrun.cli.app", *args]


CHILDREN: list[subprocess.Popen[str]] = []


def run_habitrun(recipe: Path, timeout: float) -> tuple[float, int, str]:
    """``habitrun run -q`` of the recipe: (wall seconds, exit code, output)."""
    log = recipe.parent / "run.log"
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(habitrun_cmd("run", str(recipe), "-q"), stdout=out, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        CHILDREN.append(proc)  # stopped by main's clean-up if this wait is interrupted
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            code = -1
        CHILDREN.remove(proc)
    wall = time.perf_counter() - start
    text = log.read_text(errors="replace")
    if code == -1:
        text += f"\nno end within {timeout:.0f} s (stopped; raise --timeout)"
    return wall, code, text


def stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C a habitrun run (an attached run cancels what it submitted), then kill it if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def check_results(recipe: Path, n: int) -> str | None:
    """None if ``habitrun results`` has every subject with its value, else what is wrong."""
    table = recipe.parent / "results.csv"
    done = subprocess.run(habitrun_cmd("results", str(recipe), STAGE, "-o", str(table)),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"results: {last_words(done.stdout + done.stderr)}"
    with table.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    wrong = [r for r in rows if int(float(r["value"])) != 2 * int(r["subject_id"][1:])]
    if len(rows) != n or wrong:
        return f"results: {len(rows)} rows of {n}, {len(wrong)} wrong values"
    return None


def slurm_jobs(study: Path) -> tuple[int, int]:
    """(array tasks, sbatch calls) habitrun submitted: from each batch folder's ``arrays.json`` (every
    array it submitted, started or not), else from its tasks' output files (tasks that started)."""
    tasks = arrays = 0
    for batch in (study / ".habitrun" / "slurm").glob("*/"):
        try:
            parts = json.loads((batch / "arrays.json").read_text())["parts"]
            tasks += sum(int(p["count"]) for p in parts)
            arrays += len(parts)
        except (OSError, ValueError, KeyError, TypeError):
            started = {p.stem for p in batch.glob("out/*.out")}
            tasks += len(started)
            arrays += len({t.split("_", 1)[0] for t in started})
    return tasks, arrays


def dask_jobs(study: Path) -> int:
    """Jobs dask-jobqueue submitted: its log files are named ``<job name>-<job id>.out/.err``."""
    logs = (study / ".habitrun" / "dask-jobs" / "logs").glob("*-*.*")
    return len({p.stem.rsplit("-", 1)[1] for p in logs if p.suffix in (".out", ".err")})


def leg_habitrun(leg: str, root: Path, n: int, ms: float, args: argparse.Namespace) -> Row:
    """Legs ``slurm`` and ``dask``: one ``habitrun run`` of a fresh study."""
    row = Row(leg, n)
    if leg == "slurm":
        slurm: dict[str, object] = {"partition": "debug", "time": args.time, "mem": "1G",
                                    "extra": [f"--job-name={NAMES[leg]}"]}
        if args.chunk_size == "auto":  # habitrun's own chunking (no history: at most 100 tasks)
            row.notes.append("chunk_size left to habitrun, workers 1 per task")
        else:
            slurm["chunk_size"] = int(args.chunk_size) if args.chunk_size else math.ceil(n / 4)
            row.notes.append(f"chunk_size {slurm['chunk_size']}, workers 1 per task")
        policy: dict[str, object] = {"backend": "slurm", "workers": 1, "slurm": slurm}
    else:
        jobqueue = {"system": "slurm", "cores": 1, "memory": "1GB", "queue": "debug", "walltime": args.time,
                    "death_timeout_sec": 30, "job_extra_directives": [f"--job-name={NAMES[leg]}"]}
        policy = {"backend": "dask", "workers": 2, "dask": {"jobqueue": jobqueue}}
        row.notes.append("2 workers, 1 core per job")
    recipe = make_study(root / NAMES[leg], n, ms, policy)
    with JobWatcher(NAMES[leg]) as watcher:
        wall, code, output = run_habitrun(recipe, args.timeout)
    row.seen = len(watcher.seen)
    if leg == "slurm":
        tasks, arrays = slurm_jobs(recipe.parent)
        row.jobs = f"{tasks}" if tasks else "?"
        row.notes.append(f"{arrays} sbatch calls")
    else:
        jobs = dask_jobs(recipe.parent)
        row.jobs = f"{jobs}" if jobs else "?"
    if code != 0:
        row.error = f"exit {code}: {last_words(output)}"
        return row
    problem = check_results(recipe, n)
    if problem:
        row.error = problem
        return row
    row.wall = wall
    return row


def leg_sbatch(root: Path, n: int, ms: float, args: argparse.Namespace) -> Row:
    """Leg ``sbatch``: one job per subject, the driver polls squeue, then reads every result."""
    row = Row("sbatch", n)
    name = NAMES["sbatch"]
    study = make_study(root / name, n, ms, {"backend": "process"}).parent
    out, logs = study / "results", study / "out"
    out.mkdir()
    logs.mkdir()
    ids: list[str] = []
    limit = args.per_job_queue or n
    sbatch_sec = 0.0
    with JobWatcher(name) as watcher:
        start = time.perf_counter()
        deadline = time.monotonic() + args.timeout
        live = 0
        while len(ids) < n or live:
            if time.monotonic() > deadline:
                row.error = f"jobs still queued after {args.timeout:.0f} s (raise --timeout)"
                return row
            for i in range(len(ids), min(n, len(ids) + limit - live)):
                sid = f"S{i:05d}"
                wrap = shlex.join([sys.executable, "-c", ONE_SUBJECT, str(study), sid, str(i), str(ms),
                                   str(out / f"{sid}.json")])
                argv = ["sbatch", "--parsable", f"--job-name={name}", "--partition=debug", "--cpus-per-task=1",
                        "--mem=1G", f"--time={args.time}", f"--output={logs}/%j.out", "--wrap", wrap]
                began = time.perf_counter()
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                sbatch_sec += time.perf_counter() - began
                if done.returncode != 0:
                    row.error = f"sbatch {sid}: {last_words(done.stderr)}"
                    return row
                ids.append(done.stdout.strip().split(";", 1)[0])
            time.sleep(0.5)
            now = queued(name)
            live = len(now) if now is not None else max(live, 1)  # squeue failed: ask again
        missing = wrong = never = 0
        for i, job in enumerate(ids):
            try:
                value = json.loads((out / f"S{i:05d}.json").read_text())["value"]
            except (OSError, ValueError, KeyError):
                missing += 1
                never += not (logs / f"{job}.out").exists()
                continue
            wrong += value != 2 * i
        wall = time.perf_counter() - start
    row.seen = len(watcher.seen)
    row.jobs = str(len(ids))
    if args.per_job_queue:
        row.notes.append(f"at most {args.per_job_queue} queued at once (--per-job-queue)")
    row.notes.append(f"sbatch calls took {sbatch_sec:.1f} s ({sbatch_sec / n * 1000:.0f} ms each)")
    if missing or wrong:
        row.error = f"{missing} result files missing, {wrong} wrong of {n}" + (
            f" ({never} jobs left the queue without starting: cancelled by someone else?)" if never else "")
        return row
    row.wall = wall
    return row


def print_table(rows: Sequence[Row], n: int, ms: float) -> None:
    ok = [r for r in rows if r.wall is not None]
    ref = next((r for r in ok if r.leg == "slurm"), ok[0] if ok else None)
    per = {r.leg: r.wall / r.subjects for r in ok if r.wall is not None}
    label = "x habitrun" if ref is None or ref.leg == "slurm" else f"x {ref.leg}"
    print()
    if ref is not None and ref.leg != "slurm":
        print(f"# the habitrun slurm leg did not run or failed: ratios are against {TITLES[ref.leg]}")
    print(f"# {n} subjects x {ms:g} ms; ideal on 2 CPUs {n * ms / 1000 / 2:.1f} s; ratio = s/subject {label}")
    print(f"{'tool':<24} {'subjects':>8} {'wall s':>8} {'jobs':>6} {'squeue saw':>10} {'subj/s':>8} {label:>11}  note")
    for r in rows:
        notes = list(r.notes)
        if r.subjects != n:
            notes.insert(0, f"ran {r.subjects} of {n} subjects (--per-job-n): rate, not extrapolated")
        if r.wall is None:
            print(f"{TITLES[r.leg]:<24} {r.subjects:>8} {'-':>8} {r.jobs:>6} {r.seen:>10} {'-':>8} {'-':>11}  "
                  f"FAILED: {r.error}" + (f"; {'; '.join(notes)}" if notes else ""))
            continue
        ratio = f"{per[r.leg] / (ref.wall / ref.subjects):.2f}" if ref is not None and ref.wall else "-"
        print(f"{TITLES[r.leg]:<24} {r.subjects:>8} {r.wall:>8.1f} {r.jobs:>6} {r.seen:>10} "
              f"{r.subjects / r.wall:>8.1f} {ratio:>11}  {'; '.join(notes)}", flush=True)


def on_term(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="subjects (default 2000)")
    parser.add_argument("--ms", type=float, default=50.0, help="ms each subject sleeps (default 50)")
    parser.add_argument("--only", nargs="+", choices=LEGS, default=list(LEGS), help="legs to run, in this order")
    parser.add_argument("--per-job-n", type=int, default=None,
                        help="subjects of the one-job-per-subject leg (default: --n, at most 100)")
    parser.add_argument("--per-job-queue", type=int, default=20,
                        help="jobs of that leg queued at once, as snakemake --jobs (default 20; 0: all at once); "
                             "the cluster is shared: others' jobs get in between")
    parser.add_argument("--chunk-size", default=None,
                        help="subjects per array task of the slurm leg (default: ceil(n / 4), one array of 4; "
                             "'auto': habitrun chooses, as a recipe without chunk_size does)")
    parser.add_argument("--time", default="00:30:00", help="SLURM wall time of every job (default 00:30:00)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a leg may take (default 3600)")
    parser.add_argument("--keep", action="store_true", help="keep the study folders (printed)")
    args = parser.parse_args()
    if args.chunk_size not in (None, "auto") and not (args.chunk_size.isdigit() and int(args.chunk_size) > 0):
        parser.error(f"--chunk-size {args.chunk_size!r}: a whole number > 0, or 'auto'")
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    per_job_n = args.per_job_n or min(args.n, 100)
    print(f"# {os.cpu_count()} cpus here; sinfo: {last_words(subprocess.run(['sinfo', '-h', '-o', '%P %c CPUs %m MB %t'], capture_output=True, text=True, timeout=30).stdout)}; python {sys.version.split()[0]}")
    rows: list[Row] = []
    tmp = tempfile.mkdtemp(prefix="hr-bench-slurm-")
    try:
        for leg in args.only:
            cancel_ours()
            others = foreign_jobs()
            started = time.strftime("%H:%M:%S")
            if leg == "sbatch":
                row = leg_sbatch(Path(tmp), per_job_n, args.ms, args)
            else:
                row = leg_habitrun(leg, Path(tmp), args.n, args.ms, args)
            row.notes.append(f"{others} other jobs queued at start ({started})")
            rows.append(row)
            status = f"{row.wall:.1f} s" if row.wall is not None else f"FAILED: {row.error}"
            print(f"# {TITLES[leg]}: {status}", flush=True)
    except KeyboardInterrupt:
        print("# interrupted: stopping runs and cancelling the hr-bench-* jobs", file=sys.stderr)
    finally:
        for proc in list(CHILDREN):
            stop(proc)
        cancel_ours()
        if args.keep:
            print(f"# study folders kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_table(rows, args.n, args.ms)


if __name__ == "__main__":
    main()
