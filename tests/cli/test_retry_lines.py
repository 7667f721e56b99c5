"""A retry round's line names its subjects (up to a few, then "and N more") and their failure kinds (issue 32).

Through the CLI, with real failures: exceptions and a subject killed at its timeout on the process backend.
Ids are user text: one that looks like rich markup is printed as written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OPS = textwrap.dedent('''
    import os
    import time


    def flaky(subject, marks):
        """The first attempt raises (mode 'raise', 'markup') or hangs (mode 'hang'); the second succeeds."""
        mark = os.path.join(marks, f"{subject.fields['n']}-first")
        first = not os.path.exists(mark)
        open(mark, "a").close()
        if first and subject.fields["mode"] in ("raise", "markup"):
            raise RuntimeError("first attempt fails")
        if first and subject.fields["mode"] == "hang":
            time.sleep(60)
        return 1


    def second(subject, marks):
        mark = os.path.join(marks, f"{subject.fields['n']}-second")
        first = not os.path.exists(mark)
        open(mark, "a").close()
        if first and subject.fields["mode"] == "markup":
            raise RuntimeError("first attempt fails")
        return 2
''')

# eight subjects fail their first attempt in stage 'a' (seven raise, one hangs); in stage 'b' only the one
# whose id looks like markup
ROWS = [("S1", "raise"), ("S2", "raise"), ("S3", "raise"), ("S4", "raise"), ("S5", "raise"), ("S6", "raise"),
        ("S7", "hang"), ("S8", "ok"), ("[bold red]S9[/]", "markup")]


def write_study(folder: Path) -> Path:
    (folder / "marks").mkdir(parents=True)
    (folder / "ops.py").write_text(OPS)
    rows = "".join(f"{sid},{n},{mode}\n" for n, (sid, mode) in enumerate(ROWS))
    (folder / "subjects.csv").write_text("subject_id,n,mode\n" + rows)
    recipe = {
        "habitrun": 1, "name": "retry", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 3, "subject_timeout_sec": 4, "auto_retry_rounds": 1,
                   "auto_retry_on": "all"},
        "stages": [{"name": "a", "operator": "ops:flaky", "params": {"marks": str(folder / "marks")}},
                   {"name": "b", "operator": "ops:second", "params": {"marks": str(folder / "marks")},
                    "needs": ["a"]}],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


@pytest.mark.timeout(120)
def test_retry_lines_name_subjects_and_kinds(tmp_path: Path) -> None:
    recipe = write_study(tmp_path / "study")
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "run", str(recipe)], capture_output=True,
                          text=True, timeout=100, cwd=recipe.parent, env={**os.environ, "COLUMNS": "400"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out

    # stage a: S1-S6 raised, S7 timed out, "[bold red]S9[/]" raised: eight, five named, kinds counted
    line = next(ln for ln in out.splitlines() if ln.startswith("[a] retrying"))
    match = re.fullmatch(r"\[a\] retrying 8 subject\(s\), attempt 2 \((.*)\): (.*) and 3 more", line)
    assert match, line
    assert sorted(match.group(1).split(", ")) == ["exception: 7", "timeout: 1"], line
    named = match.group(2).split(", ")
    assert len(named) == 5 and set(named) <= {"S1", "S2", "S3", "S4", "S5", "S6", "S7", "[bold red]S9[/]"}, line

    # stage b: one subject, its id printed as written (not read as markup), with its kind
    assert "[b] retrying 1 subject(s), attempt 2 (exception: 1): [bold red]S9[/]" in out, out

    # the run's events keep them too
    events = next((recipe.parent / ".habitrun" / "runs").iterdir()) / "events.jsonl"
    rounds = [json.loads(x) for x in events.read_text().splitlines() if '"retry_round"' in x]
    assert [(r["stage"], r["subjects"], r["kinds"], len(r["subject_ids"])) for r in rounds] == [
        ("a", 8, {"exception": 7, "timeout": 1}, 5), ("b", 1, {"exception": 1}, 1)]
