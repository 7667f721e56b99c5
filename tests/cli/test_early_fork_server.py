"""`habitrun run` boots the workers' fork server at its start; the run adopts it only when it fits."""

from __future__ import annotations

import textwrap
from pathlib import Path

import psutil
import pytest

from habitrun.cli.app import main
from habitrun.engine.process import early
from habitrun.engine.process.spawner import BASE_PRELOAD, WorkerSpawner


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _booted() -> tuple[object, int]:
    early.start(BASE_PRELOAD)
    server = early.booted()
    assert server is not None and server.pid is not None
    return server, server.pid


def test_a_launcher_with_the_same_caps_adopts_the_early_server_and_stops_it() -> None:
    server, pid = _booted()
    launcher = WorkerSpawner("forkserver", early.DEFAULT_THREADS)
    try:
        assert launcher._server(BASE_PRELOAD, ()) is server
        assert early.booted() is None  # adopted once
    finally:
        launcher.close()
    assert _gone(pid)


def test_other_caps_do_not_adopt_it_and_discard_kills_it() -> None:
    server, pid = _booted()
    try:
        assert early.adopt(BASE_PRELOAD, early.DEFAULT_THREADS + 1) is None
        assert early.adopt((*BASE_PRELOAD, "study_ops"), early.DEFAULT_THREADS) is None
        assert early.booted() is server
    finally:
        early.discard()
    assert early.booted() is None and _gone(pid)


@pytest.mark.parametrize("threads", [1, 2])
def test_run_uses_or_discards_the_early_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                threads: int) -> None:
    """Default caps: the run forks its workers from it; other caps: it is killed, the run starts its own."""
    (tmp_path / "ops.py").write_text("def double(subject):\n    return {'n': 2 * int(subject.fields['n'])}\n")
    (tmp_path / "subjects.csv").write_text("subject_id,n\nA,1\nB,2\nC,3\n")
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(f"""\
        habitrun: 1
        name: early
        subjects: {{manifest: subjects.csv, id: subject_id}}
        policy: {{backend: process, workers: 2, worker_threads: {threads}}}
        stages:
          - name: double
            operator: ops:double
        """))
    monkeypatch.chdir(tmp_path)
    adopted: list[object] = []
    original = early.adopt

    def watched(preload: tuple[str, ...], caps: int) -> object:
        server = original(preload, caps)
        adopted.append(server)
        return server

    monkeypatch.setattr(early, "adopt", watched)
    with pytest.raises(SystemExit) as done:
        main(["run", "recipe.yaml", "-q"])
    assert done.value.code == 0
    assert (adopted[0] is not None) == (threads == early.DEFAULT_THREADS)
    assert early.booted() is None
