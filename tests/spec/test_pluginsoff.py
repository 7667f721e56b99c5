"""habitrun's own models are built without pydantic's plugin lookup, and nothing else is affected.

A real pydantic plugin (an entry point in a distribution on ``sys.path``) records every
model it is offered; each case runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = '''
class Recorder:
    def new_schema_validator(self, schema, schema_type, schema_type_path, schema_kind, config, plugin_settings):
        print("PLUGIN", schema_type_path.module, schema_type_path.name, flush=True)
        return None, None, None


plugin = Recorder()
'''


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A folder holding an installed (dist-info) pydantic plugin that prints each model it sees."""
    (tmp_path / "recorder_plugin.py").write_text(PLUGIN)
    info = tmp_path / "recorder_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recorder-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nrecorder = recorder_plugin:plugin\n")
    return tmp_path


def run_script(script: str, plugin_path: Path) -> str:
    code = f"import sys; sys.path.insert(0, {str(plugin_path)!r})\n" + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          cwd=plugin_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_own_models_skip_plugins_and_leave_no_trace(plugin_path: Path) -> None:
    out = run_script('''
        import os, subprocess, sys
        import habitrun.spec.loader
        print("ENV", os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
        child = [sys.executable, "-c", "import os; print('CHILD', os.environ.get('PYDANTIC_DISABLE_PLUGINS'))"]
        print(subprocess.run(child, capture_output=True, text=True).stdout.strip())
        from pydantic import BaseModel

        class UserModel(BaseModel):
            x: int = 0
    ''', plugin_path)
    assert "PLUGIN habitrun" not in out  # the recipe and policy models: no lookup
    assert "PLUGIN __main__ UserModel" in out  # a model built later still finds the plugin
    assert "ENV None" in out
    assert "CHILD None" in out


def test_with_another_thread_alive_the_plugins_stay_on(plugin_path: Path) -> None:
    out = run_script('''
        import threading
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            import habitrun.spec.loader
        finally:
            stop.set()
            t.join()
    ''', plugin_path)
    assert "PLUGIN habitrun.spec.policy RunPolicy" in out


def test_a_variable_set_by_the_user_is_kept(plugin_path: Path) -> None:
    out = run_script('''
        import os
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        import habitrun.spec.loader
        print("ENV", os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
    ''', plugin_path)
    assert "ENV __all__" in out
    assert "PLUGIN" not in out


def test_a_thread_marked_as_starting_no_python_does_not_keep_the_plugins_on(plugin_path: Path) -> None:
    out = run_script('''
        import threading
        from habitrun.spec.pluginsoff import starts_no_python
        stop = threading.Event()
        t = starts_no_python(threading.Thread(target=stop.wait))
        t.start()
        try:
            import habitrun.spec.loader
        finally:
            stop.set()
            t.join()
    ''', plugin_path)
    assert "PLUGIN habitrun" not in out


def test_a_cli_run_builds_every_model_without_the_lookup(plugin_path: Path, tmp_path: Path) -> None:
    """`run` imports the policy models through the engine, with git's state read in a thread meanwhile."""
    study = tmp_path / "study"
    study.mkdir()
    (study / "ops.py").write_text("def one(subject):\n    return {'n': 1}\n")
    (study / "subjects.csv").write_text("subject_id\na\nb\n")
    (study / "recipe.yaml").write_text(
        "habitrun: 1\nname: p\nsubjects: {manifest: subjects.csv, id: subject_id}\n"
        "policy: {backend: process, workers: 1}\nstages:\n  - {name: one, operator: ops:one}\n")
    out = run_script(f'''
        import sys, threading
        from habitrun.cli.app import main
        from habitrun.store.provenance import start_git_state
        start_git_state({str(study)!r})  # as the console script does before the command imports
        code = 0
        try:
            main(["run", {str(study / "recipe.yaml")!r}, "-q"])
        except SystemExit as done:
            code = done.code
        print("EXIT", code)
        import pydantic.plugin._loader as loader
        print("LOOKED UP", loader._plugins is not None)
    ''', plugin_path)
    assert "EXIT 0" in out, out
    assert "LOOKED UP False" in out, out
    assert "PLUGIN habitrun" not in out, out
