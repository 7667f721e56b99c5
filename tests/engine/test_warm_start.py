"""The workers' fork server boots while the run is still checking its operators, and never outlives a failed check."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from habitrun.engine.runner import run_study
from habitrun.errors import RecipeError
from habitrun.spec.loader import load_recipe
from tests.engine.study import make_study


def fork_servers() -> list[psutil.Process]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "habitrun.engine.process.forkserver" in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def test_fork_server_is_booting_when_the_operator_check_is_waited_for(tmp_path: Path) -> None:
    loaded = load_recipe(make_study(tmp_path / "study", subjects=2))
    seen: list[int] = []

    def preflight() -> None:
        seen.append(len(fork_servers()))

    summary = run_study(loaded, preflight=preflight, install_signal_handlers=False)
    assert summary.outcome == "success"
    assert seen == [1]  # already started before the check was waited for
    assert not fork_servers()


def test_a_failed_operator_check_stops_the_fork_server(tmp_path: Path) -> None:
    loaded = load_recipe(make_study(tmp_path / "study", subjects=2))

    def preflight() -> None:
        assert fork_servers()
        raise RecipeError("stage 'square': operator is broken (the check said so)")

    with pytest.raises(RecipeError):
        run_study(loaded, preflight=preflight, install_signal_handlers=False)
    assert not fork_servers()
    assert not (tmp_path / "study" / ".habitrun" / "runs").exists() or \
        not any((tmp_path / "study" / ".habitrun" / "runs").iterdir())
