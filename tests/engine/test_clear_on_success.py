"""`clear_checkpoint_on_success` after a retry round: cleared when every subject ends up succeeding,
kept when any subject's failure is final (see docs/recipes.md for the rule)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.engine.study import run_cli

OPS = textwrap.dedent('''
    import os


    def flaky(subject, attempts_dir, fail_times):
        """Fails the first ``fail_times[id]`` attempts of a subject, then succeeds."""
        mark = os.path.join(attempts_dir, subject.id)
        with open(mark, "a") as fh:
            fh.write("x")
        tries = os.path.getsize(mark)
        if tries <= int(fail_times.get(subject.id, 0)):
            raise RuntimeError(f"attempt {tries} of {subject.id} fails on purpose")
        return {"id": subject.id, "tries": tries}
''')


def make_study(folder: Path, fail_times: dict[str, int]) -> Path:
    folder.mkdir(parents=True)
    (folder / "attempts").mkdir()
    (folder / "ops.py").write_text(OPS)
    (folder / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i}\n" for i in range(4)))
    recipe = {
        "habitrun": 1, "name": "clear", "subjects": {"manifest": "subjects.csv"},
        "policy": {"backend": "process", "workers": 2, "subject_timeout_sec": 60, "auto_retry_rounds": 1,
                   "auto_retry_on": "all",  # the failures here are exceptions, retried only when asked
                   "clear_checkpoint_on_success": True},
        "stages": [{"name": "flaky", "operator": "ops:flaky",
                    "params": {"attempts_dir": str(folder / "attempts"), "fail_times": fail_times}}],
    }
    (folder / "recipe.yaml").write_text(json.dumps(recipe, indent=1))
    return folder / "recipe.yaml"


def stored_done(study: Path) -> int:
    plan = run_cli("status", "recipe.yaml", "--json", cwd=study)
    return json.loads(plan.stdout)["stages"]["flaky"]["done"]


def test_a_failure_fixed_by_a_retry_round_still_clears_the_store(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study", {"S1": 1}).parent
    done = run_cli("run", "recipe.yaml", cwd=study)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "S1 failed" not in out  # not a final failure
    assert "[flaky] retrying 1 subject(s), attempt 2" in out
    assert "[flaky] checkpoint cleared: 4 record(s) removed" in out and "1 after a retry" in out, out
    assert (study / "attempts" / "S1").read_text() == "xx"
    assert stored_done(study) == 0  # cleared: a new run computes every subject again
    run_dir = next((study / ".habitrun" / "runs").iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "subject_failed" and e["subject"] == "S1" and not e["final"] for e in events), \
        "the failed attempt is still on record in the run's events"


def test_a_final_failure_keeps_the_store(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study", {"S1": 5}).parent
    done = run_cli("run", "recipe.yaml", cwd=study)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "checkpoint cleared" not in out
    assert stored_done(study) == 3
