"""Memory-aware admission against fixed worker counts, under a real memory limit (a cgroup v1 memory cgroup).

A skewed synthetic study (default: 3 subjects of about 600 MB first in the
manifest, 12 of about 50 MB; each holds its memory for ``--sleep`` seconds
so that cores are not the limit; a second stage, ``half``, takes half of
that) runs with `habitrun run` inside a fresh memory cgroup of ``--limit-mb``
(1.5 GB), once per setting: fixed `workers: 1`, `2`, `4` with today's OOM
backoff, and `workers: 4` with `memory_budget_mb: auto`. Printed side by side
(median of ``--repeat`` runs): wall time, OOM kills (the cgroup's
``oom_kill`` counter), re-executions (attempts beyond one per subject and
stage, plus kills retried alone under the budget), the cgroup's peak memory
(``memory.max_usage_in_bytes``).

Then prediction quality: the budget's study is run a second time (every
subject again, ``policy.resume=false``), so every prediction comes from the
first run's trace; per stage, the median absolute error of predicted vs
measured peak (and relative), next to the first run's (learned as it went).

Needs root and the cgroup v1 memory controller (``/sys/fs/cgroup/memory``).

    python benchmarks/memory_admission.py                 # 1 repeat
    python benchmarks/memory_admission.py --repeat 3 --sleep 0.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from habitrun.cli.memory_text import run_memory  # noqa: E402
from habitrun.store.checkpoint import CheckpointStore  # noqa: E402
from tests.engine.memstudy import MemoryCgroup, cgroup_v1_available, make_skewed_study  # noqa: E402

SETTINGS = (("fixed workers 1", {"workers": 1, "memory_budget_mb": None}),
            ("fixed workers 2", {"workers": 2, "memory_budget_mb": None}),
            ("fixed workers 4", {"workers": 4, "memory_budget_mb": None}),
            ("budget (workers 4, auto)", {"workers": 4, "memory_budget_mb": "auto"}))


def latest_provenance(recipe: Path) -> dict:
    runs = sorted((recipe.parent / ".habitrun" / "runs").iterdir())
    return json.loads((runs[-1] / "provenance.json").read_text())


def attempts(recipe: Path) -> int:
    with CheckpointStore.open(recipe.parent / ".habitrun" / "store", create=False, read_only=True) as store:
        return len(store.trace())


def one_run(folder: Path, policy: dict, args: argparse.Namespace) -> dict:
    recipe = make_skewed_study(folder, small=args.small, big=args.big, small_mb=args.small_mb, big_mb=args.big_mb,
                               sleep=args.sleep, policy=policy, half_stage=True)
    with MemoryCgroup(args.limit_mb) as cg:
        started = time.monotonic()
        done = cg.run(["run", str(recipe), "-q"], cwd=recipe.parent, timeout=600)
        wall = time.monotonic() - started
        kills, peak = cg.oom_kills(), cg.peak_mb()
    subjects = (args.small + args.big) * 2
    memory = run_memory(latest_provenance(recipe)) or {}
    retried_alone = sum(st.get("oom_retried_alone", 0) for st in (memory.get("stages") or {}).values())
    return {"wall": wall, "kills": kills, "reexec": attempts(recipe) - subjects + retried_alone, "peak": peak,
            "exit": done.returncode, "recipe": recipe, "memory": memory}


def second_run(recipe: Path, args: argparse.Namespace) -> dict:
    with MemoryCgroup(args.limit_mb) as cg:
        started = time.monotonic()
        done = cg.run(["run", str(recipe), "-q", "policy.resume=false"], cwd=recipe.parent, timeout=600)
        wall = time.monotonic() - started
        kills, peak = cg.oom_kills(), cg.peak_mb()
    return {"wall": wall, "kills": kills, "peak": peak, "exit": done.returncode,
            "memory": run_memory(latest_provenance(recipe)) or {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--limit-mb", type=int, default=1536)
    parser.add_argument("--small", type=int, default=12)
    parser.add_argument("--big", type=int, default=3)
    parser.add_argument("--small-mb", type=int, default=50)
    parser.add_argument("--big-mb", type=int, default=600)
    parser.add_argument("--sleep", type=float, default=1.0)
    args = parser.parse_args()
    why = cgroup_v1_available()
    if why:
        sys.exit(f"memory_admission: needs a cgroup v1 memory controller, as root: {why}")
    print(f"study: {args.big} x {args.big_mb} MB + {args.small} x {args.small_mb} MB subjects, sleep {args.sleep} s, "
          f"stages hog + half (half the memory); cgroup limit {args.limit_mb} MB; median of {args.repeat}")
    results: dict[str, list[dict]] = {name: [] for name, _ in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="habitrun-memadm-") as tmp:
        for rep in range(args.repeat):
            for index, (name, policy) in enumerate(SETTINGS):  # interleaved: a load spike hits every setting
                results[name].append(one_run(Path(tmp) / f"r{rep}-{index}", policy, args))
        print(f"{'setting':26} {'wall s':>8} {'OOM kills':>10} {'re-exec':>8} {'cgroup peak MB':>15} {'exit':>5}")
        for name, runs in results.items():
            med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "kills", "reexec", "peak")}
            walls = ", ".join(f"{r['wall']:.1f}" for r in runs)
            print(f"{name:26} {med['wall']:8.1f} {med['kills']:10.0f} {med['reexec']:8.0f} {med['peak']:15.0f} "
                  f"{','.join(str(r['exit']) for r in runs):>5}   ({walls})")
        first = results[SETTINGS[-1][0]][-1]
        budget = first["memory"]
        print(f"\nbudget: {budget.get('budget_mb')} MB ({budget.get('source')})")
        again = second_run(first["recipe"], args)
        print(f"second run of the budget's study (every subject again, predicted from the first run's trace): "
              f"wall {again['wall']:.1f} s, OOM kills {again['kills']}, cgroup peak {again['peak']:.0f} MB, "
              f"exit {again['exit']}")
        print(f"{'stage':8} {'run':7} {'predicted':>10} {'median abs err MB':>18} {'median rel err':>15} "
              f"{'under':>6} {'waits':>6} {'wait s':>7} {'alone':>6}")
        for label, memory in (("first", budget), ("second", again["memory"])):
            for stage, st in (memory.get("stages") or {}).items():
                rel = st.get("median_rel_error")
                print(f"{stage:8} {label:7} {st.get('predicted_subjects', 0):10d} "
                      f"{st.get('median_abs_error_mb') if st.get('median_abs_error_mb') is not None else '-':>18} "
                      f"{(f'{rel:.1%}' if rel is not None else '-'):>15} {st.get('under_predicted', 0):6d} "
                      f"{st.get('waits', 0):6d} {st.get('wait_sec', 0.0):7.1f} {st.get('ran_alone', 0):6d}")


if __name__ == "__main__":
    main()
