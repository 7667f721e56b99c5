"""Work repeated after a SIGKILL of the runner: executions per subject over many kills and resumes.

A study of ``--subjects`` subjects (one map stage, ``--ms`` ms each, 2 persistent
workers) whose operator appends a line to its subject's marker file at every start.
The runner is SIGKILLed at a random moment of the stage ``--kills`` times (``run``
first, then ``resume``), its workers are waited for, and a last ``resume`` finishes
the study. Every start beyond a subject's first is a repeated execution; the repeats
that happen in the run after a kill are charged to that kill. With ``--against`` the
other tree (a checkout whose ``habitrun`` is imported instead, by ``PYTHONPATH``) is
measured the same way, after this one.

    python benchmarks/kill_repeats.py --kills 20
    python benchmarks/kill_repeats.py --kills 20 --against /tmp/main-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

OPS = textwrap.dedent('''
    import os
    import time


    def work(subject, marker_dir, ms):
        with open(os.path.join(marker_dir, subject.id), "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        end = time.perf_counter() + ms / 1000.0
        while time.perf_counter() < end:
            pass
        return {"id": subject.id, "n": 1}
''')


def make_study(folder: Path, subjects: int, ms: float, workers: int) -> Path:
    """The study: one map stage whose every execution leaves a line in ``markers/<subject>``."""
    folder.mkdir(parents=True)
    (folder / "markers").mkdir()
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:04d}\n" for i in range(subjects)))
    recipe = {
        "habitrun": 1, "name": "kill-repeats", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": workers, "parallel_mode": "persistent",
                   "subject_timeout_sec": 600},
        "stages": [{"name": "work", "operator": "ops:work",
                    "params": {"marker_dir": str(folder / "markers"), "ms": ms}}],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


def executions(folder: Path) -> dict[str, int]:
    """subject -> how many times it started."""
    return {f.name: len(f.read_text().splitlines()) for f in (folder / "markers").iterdir()}


def repeats(folder: Path) -> int:
    return sum(n - 1 for n in executions(folder).values())


def _env(tree: Path | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return
        time.sleep(0.02)


def one_kill(recipe: Path, command: str, tree: Path | None, rng: random.Random, window: tuple[float, float]) -> bool:
    """Start ``command``, SIGKILL it at a random moment once its subjects run; False when it ended first."""
    folder = recipe.parent
    started = sum(executions(folder).values())
    proc = subprocess.Popen([sys.executable, "-m", "habitrun.cli.app", command, str(recipe), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(tree), cwd=folder)
    deadline = time.monotonic() + 60
    while sum(executions(folder).values()) == started:  # wait for this run's first subject
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.wait()
            return False
        time.sleep(0.01)
    time.sleep(rng.uniform(*window))
    workers = _descendants(proc.pid)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _wait_gone(workers)
    return True


def measure(tree: Path | None, kills: int, subjects: int, ms: float, workers: int, seed: int) -> dict:
    """Kill and resume ``kills`` times; the repeats charged to each kill."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        recipe = make_study(Path(tmp) / "study", subjects, ms, workers)
        per_kill: list[int] = []
        done_kills = 0
        before = 0
        command = "run"
        while done_kills < kills:
            killed = one_kill(recipe, command, tree, rng, (0.2, 1.5))
            now = repeats(recipe.parent)
            if done_kills:
                per_kill.append(now - before)  # what the run after the previous kill repeated
            before = now
            if not killed:
                break  # the study finished before the kill: start over would change the figures
            done_kills += 1
            command = "resume"
        final = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "resume", str(recipe), "-q"],
                               capture_output=True, text=True, env=_env(tree), cwd=recipe.parent, timeout=600)
        if final.returncode != 0:
            raise SystemExit(f"the last resume failed ({final.returncode}): {final.stdout}{final.stderr}")
        if done_kills:
            per_kill.append(repeats(recipe.parent) - before)
        ran = executions(recipe.parent)
        missing = subjects - len(ran)
        return {"kills": done_kills, "per_kill": per_kill, "total": sum(per_kill), "missing": missing,
                "executions": sum(ran.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--subjects", type=int, default=2000, help="enough that the stage outlasts every kill")
    parser.add_argument("--ms", type=float, default=50.0, help="busy milliseconds per subject (default 50)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--against", type=Path, default=None, help="another checkout, measured after this one")
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.against is not None:
        trees.append((str(args.against), args.against.resolve()))
    rows = []
    for name, tree in trees:
        got = measure(tree, args.kills, args.subjects, args.ms, args.workers, args.seed)
        rows.append((name, got))
        print(f"{name}: repeats per kill {got['per_kill']}", flush=True)
    print(f"\n{args.subjects} subjects x {args.ms:g} ms, {args.workers} persistent workers, SIGKILL of the runner "
          "mid-stage then resume")
    print(f"{'tree':40} {'kills':>5} {'repeats':>8} {'median/kill':>11} {'max/kill':>8} {'lost':>5}")
    for name, got in rows:
        med = statistics.median(got["per_kill"]) if got["per_kill"] else 0
        top = max(got["per_kill"], default=0)
        print(f"{name[:40]:40} {got['kills']:>5} {got['total']:>8} {med:>11g} {top:>8} {got['missing']:>5}")


if __name__ == "__main__":
    main()
