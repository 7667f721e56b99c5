"""Run folders, the event log and the provenance record."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from habitrun.errors import StoreError
from habitrun.store.events import EventLog
from habitrun.store.provenance import (
    collect_provenance,
    git_state,
    package_versions,
    start_git_state,
)
from habitrun.store.runs import RunFolder, latest_run, list_runs, work_dir


def make_run(root: Path, text: str = "habitrun: 1\n") -> RunFolder:
    return RunFolder.create(root, resolved_yaml=text, recipe_path=root / "recipe.yaml", argv=["habitrun", "run"])


def test_create_and_open(tmp_path: Path) -> None:
    run = make_run(tmp_path / ".habitrun", "name: x\n")
    assert run.path.parent == tmp_path / ".habitrun" / "runs"
    stamp, rand = run.run_id.rsplit("-", 1)
    assert len(stamp) == len("20240101-120000") and len(rand) == 6
    assert run.recipe_file.read_text() == "name: x\n"
    again = RunFolder.open(run.path)
    assert again.source["recipe_path"] == str((tmp_path / ".habitrun" / "recipe.yaml").resolve())
    assert again.source["root"] == str((tmp_path / ".habitrun").resolve())
    assert run.subject_log("feat", "S%2F1") == run.path / "logs" / "feat" / "S%2F1.log"
    assert run.subject_log("feat", "x").parent.is_dir() and run.stage_dir("train").is_dir()
    assert work_dir(tmp_path, "feat", "S1") == tmp_path / "work" / "feat" / "S1"


def test_open_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a run folder"):
        RunFolder.open(tmp_path)
    with pytest.raises(StoreError, match="no such folder"):
        RunFolder.open(tmp_path / "missing")


def test_latest_run_is_the_newest_even_within_one_second(tmp_path: Path) -> None:
    assert latest_run(tmp_path) is None and list_runs(tmp_path) == []
    runs = [make_run(tmp_path) for _ in range(5)]
    (tmp_path / "runs" / "junk").mkdir()  # not a run: ignored
    assert [r.run_id for r in list_runs(tmp_path)] == [r.run_id for r in runs]
    assert latest_run(tmp_path).run_id == runs[-1].run_id


def test_provenance_write_finish_read(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.write_provenance({"started_at": "t0", "pid": 1})
    run.finish("failed", {"failed": 2})
    info = run.read_provenance()
    assert info["started_at"] == "t0" and info["outcome"] == "failed" and info["summary"] == {"failed": 2}
    assert info["ended_at"]
    assert not list(run.path.glob(".*.tmp"))  # atomic replace leaves no temp file


def test_event_log_skips_a_torn_line_and_does_not_glue_onto_it(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.write({"event": "start"})
    log.write_many([{"event": "done", "subject": "S1"}, {"event": "done", "subject": "S2"}])
    log.close()
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"event": "done", "subj')  # killed mid-write
    assert [e["event"] for e in EventLog(tmp_path / "events.jsonl").read()] == ["start", "done", "done"]
    with EventLog(tmp_path / "events.jsonl") as again:
        again.write({"event": "resumed"})
    events = list(EventLog(tmp_path / "events.jsonl").read())
    assert [e["event"] for e in events] == ["start", "done", "done", "resumed"]
    assert all(isinstance(e["ts"], float) for e in events)


def test_collect_provenance(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("x")
    info = collect_provenance(recipe_path=recipe, recipe_sha256="ab" * 32, argv=["habitrun", "run"],
                              operator_modules=["study_ops.a", "numpy.linalg"], backend={"name": "serial"})
    for field in ("started_at", "user", "host", "pid", "argv", "python", "platform", "habitrun"):
        assert info[field] is not None, field
    assert info["recipe"] == {"path": str(recipe.resolve()), "sha256": "ab" * 32}
    assert info["operator_packages"]["study_ops.a"] is None
    assert "numpy" in info["operator_packages"]["numpy.linalg"]
    assert info["git"]["commit"] is None  # tmp_path is no repository
    json.dumps(info)  # JSON-safe


def test_the_early_thread_reads_the_platform_before_the_provenance_wants_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, callers = platform.platform, []

    def spy(*args: object, **kwargs: object) -> str:
        callers.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(platform, "platform", spy)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("x")
    start_git_state(tmp_path)
    info = collect_provenance(recipe_path=recipe, recipe_sha256="ab" * 32, argv=["habitrun", "run"],
                              operator_modules=[], backend={})
    assert callers == ["habitrun-git-state", "MainThread"]  # the second is served from platform's cache
    assert info["platform"] == real()
    assert info["git"] == {"commit": None, "dirty": None, "root": None}


def test_git_state_commit_and_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, timeout=30)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = git_state(tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "a.txt").write_text("2")
    assert git_state(tmp_path)["dirty"] is True


def test_package_versions_never_import(tmp_path: Path) -> None:
    assert package_versions(["definitely_not_a_module_xyz.sub"]) == {"definitely_not_a_module_xyz.sub": None}


def test_event_lines_carry_one_stamp_first_and_keep_every_field(tmp_path: Path) -> None:
    with EventLog(tmp_path / "events.jsonl") as log:
        log.write_many([{"event": "done", "subject": "S1", "error": 'quote " and\nnewline', "n": 1.5}, {},
                        {"event": "own", "ts": 7}])
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith('{"ts":') for line in lines)
    events = list(EventLog(tmp_path / "events.jsonl").read())
    assert events[0] == {"ts": events[0]["ts"], "event": "done", "subject": "S1", "error": 'quote " and\nnewline', "n": 1.5}
    assert events[1] == {"ts": events[0]["ts"]} and events[2] == {"ts": 7, "event": "own"}
    assert lines[2].count('"ts"') == 1


def _packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()`` as 3.11+ computes it: top_level.txt, else the
    top-level names of the files a distribution ships (3.10's reads top_level.txt alone, so it misses
    every distribution built without one: typer, rich, numpy, pydantic_core)."""
    import importlib.metadata as md

    out: dict[str, list[str]] = {}
    for dist in md.distributions():
        tops = (dist.read_text("top_level.txt") or "").split() or {
            f.parts[0] if len(f.parts) > 1 else f.with_suffix("").name
            for f in (dist.files or []) if f.suffix == ".py"}
        for top in tops:
            out.setdefault(top, []).append(dist.metadata["Name"])
    return out


def test_package_versions_agree_with_the_full_scan_of_installed_distributions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcuts (study's own folder, a distribution named like the module) give what the scan gives."""
    import importlib.metadata as md

    (tmp_path / "own_study_ops").mkdir()
    (tmp_path / "own_study_ops" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = ["own_study_ops.synth", "numpy.linalg", "yaml", "typer", "rich.console", "pydantic_core",
               "ruamel.yaml", "_pytest.python", "json", "os.path", "definitely_not_a_module_xyz"]
    every = _packages_distributions()
    scanned = {m: {d: md.version(d) for d in sorted(set(every.get(m.split(".")[0], [])))} or None
               for m in modules}
    got = package_versions(modules)
    assert got == scanned
    assert got["own_study_ops.synth"] is None and got["yaml"] == {"PyYAML": md.version("PyYAML")}
    assert "own_study_ops" not in sys.modules
