"""A small real study for the trace, results and report tests: operators that use memory, CPU and fail."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Any

from habitrun.spec.loader import load_recipe
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.trace import TRACE_COLUMNS

# A name of its own: the serial backend imports operators into the test process itself, where
# another test's `ops` module may already sit in sys.modules.
OPS_MODULE = "habitrun_trace_test_ops"
OPS_SOURCE = textwrap.dedent('''
    import subprocess
    import sys
    import time


    def touch(mb):
        block = bytearray(mb * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        return block


    def use(subject, **_):
        f = subject.fields
        if f.get("mode") == "hold_child":  # a tiny child started while the subject holds its memory
            held = touch(int(f["mb"]))
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            del held
        elif int(f.get("mb") or 0):
            block = touch(int(f["mb"]))
            del block
        if int(f.get("child_mb") or 0):
            code = (f"b = bytearray({int(f['child_mb'])} * 1024 * 1024)\\n"
                    "for i in range(0, len(b), 4096): b[i] = 1\\n")
            subprocess.run([sys.executable, "-c", code], check=True)
        if f.get("mode") == "sleep":
            time.sleep(float(f["sec"]))
        elif f.get("mode") == "busy":
            end = time.process_time() + float(f["sec"])
            while time.process_time() < end:
                pass
        if f.get("fail"):
            print("about to fail", subject.id)
            raise ValueError(f"subject {subject.id} fails: {f['fail']}")
        return {"id": subject.id, "size": {"mb": int(f.get("mb") or 0), "label": f"<b>{subject.id}</b>"},
                "n": len(subject.id)}


    def double(subject):
        got = subject.input("use")
        return {"twice": got["n"] * 2, "nested": {"deep": {"x": 1}}}


    def total(results):
        return {"count": len(results)}
''')


def write_study(folder: Path, rows: list[dict[str, Any]], *, policy: dict[str, Any] | None = None,
                stages: str = "one") -> Path:
    """A study whose subjects' fields say what each does (mb, child_mb, mode, sec, fail)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{OPS_MODULE}.py").write_text(OPS_SOURCE)
    columns = ["subject_id", "mb", "child_mb", "mode", "sec", "fail"]
    with open(folder / "subjects.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([[r.get(c, "") for c in columns] for r in rows])
    pol = {"backend": "process", "workers": 1, "subject_timeout_sec": 60, "graceful_shutdown_sec": 3}
    pol.update(policy or {})
    stage_list: list[dict[str, Any]] = [{"name": "use", "operator": f"{OPS_MODULE}:use"}]
    if stages == "three":
        stage_list += [{"name": "double", "operator": f"{OPS_MODULE}:double", "needs": ["use"]},
                       {"name": "total", "kind": "collect", "operator": f"{OPS_MODULE}:total", "needs": ["double"]}]
    recipe = {"habitrun": 1, "name": "trace-test", "subjects": {"manifest": "subjects.csv"},
              "policy": pol, "stages": stage_list}
    path = folder / "recipe.yaml"
    path.write_text(json.dumps(recipe, indent=2))
    return path


def trace_rows(recipe: Path) -> list[dict[str, Any]]:
    """Every stored trace row of the study, as dicts."""
    loaded = load_recipe(recipe)
    with CheckpointStore.open(loaded.store_dir(), create=False) as store:
        return [dict(zip(TRACE_COLUMNS, row, strict=True)) for row in store.trace()]
