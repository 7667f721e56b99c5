"""The console script skips the interpreter's teardown only when what a normal exit does is done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Ends by exit_now(CODE) after leaving work for the shutdown: an atexit handler, buffered
# output on stdout and stderr, optionally a non-daemon thread still writing a file.
SCRIPT = """
import atexit, sys, threading, time
from habitrun.cli.fastexit import exit_now
code = eval(sys.argv[1])
out = sys.argv[2]
atexit.register(lambda: print("atexit ran", flush=False))
sys.stdout.write("buffered out")
sys.stderr.write("buffered err")
if out != "-":
    def late() -> None:
        time.sleep(0.3)
        with open(out, "w") as f:
            f.write("thread finished")
    threading.Thread(target=late).start()
(exit_now if sys.argv[3] == "fast" else sys.exit)(code)
"""


def run(code: str, out: str = "-", how: str = "fast") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, code, out, how], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("None", 0), ("3", 3), ("True", 1), ("-1", 255),
                                              ("'no such thing'", 1)])
def test_exit_status_output_and_atexit_are_those_of_sys_exit(code: str, status: int) -> None:
    fast, normal = run(code), run(code, how="normal")
    assert (fast.returncode, fast.stdout, fast.stderr) == (normal.returncode, normal.stdout, normal.stderr)
    assert fast.returncode == status
    assert fast.stdout == "buffered outatexit ran\n"
    assert fast.stderr.startswith("buffered err")


def test_a_running_non_daemon_thread_is_waited_for(tmp_path: Path) -> None:
    out = tmp_path / "late.txt"
    done = run("4", str(out))
    assert done.returncode == 4
    assert out.read_text() == "thread finished"
    assert "atexit ran" in done.stdout


def test_the_console_script_keeps_its_exit_codes_and_messages(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "validate", str(missing)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "no such recipe file" in done.stderr
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "habitrun 0.1.0\n")


# A store written through a connection left open, as the runner's recorder thread leaves its own.
DATABASE = """
import sqlite3, sys, threading
from habitrun.cli.fastexit import exit_now
db, held = sys.argv[1], sys.argv[2]
kept = []
def write() -> None:
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (x)")
    with con:
        con.execute("INSERT INTO t VALUES (1)")
    if held == "global":
        kept.append(con)  # alive at exit: only the teardown closes it
    # else: freed only by the cycle collector (its statement cache refers back to it)
if sys.argv[3] == "frozen":
    import gc
    gc.freeze()  # as the CLI does after its imports: the connection is made after, as a command's are
thread = threading.Thread(target=write)
thread.start()
thread.join()
exit_now(0)
"""


@pytest.mark.parametrize("frozen", ["frozen", "-"])
@pytest.mark.parametrize("held", ["cycle", "global"])
def test_a_database_left_open_is_closed_and_its_wal_checkpointed(tmp_path: Path, held: str, frozen: str) -> None:
    db = tmp_path / "cache.db"
    done = subprocess.run([sys.executable, "-c", DATABASE, str(db), held, frozen], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.db"]  # no -wal / -shm left behind
    assert b"CREATE TABLE t" in db.read_bytes()


def test_importing_every_command_opens_no_database() -> None:
    """exit_now looks for open connections only among objects made after the CLI froze its imports."""
    code = ("import gc, sqlite3\n"
            "from habitrun.cli.app import load_commands\n"
            "load_commands()\n"
            "print(sum(isinstance(o, sqlite3.Connection) for o in gc.get_objects()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr


# Records the order in which modules are first imported while the console script's module loads.
IMPORT_ORDER = """
import sys
seen = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        seen.append(name)
        return None
already = sorted({"logging", "multiprocessing.util", "concurrent.futures"} & set(sys.modules))
sys.meta_path.insert(0, Recorder())
from habitrun.cli.app import main
from habitrun.engine.process import early
import logging, multiprocessing.util
print(already)
print(*seen)
"""


def test_the_fast_exit_handler_is_registered_before_any_other() -> None:
    """atexit runs handlers last in, first out: modules that register one at import come after fastexit."""
    done = subprocess.run([sys.executable, "-c", IMPORT_ORDER], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    already, seen = done.stdout.splitlines()
    assert already == "[]"
    order = seen.split()
    first = order.index("habitrun.cli.fastexit")
    for registers_at_import in ("logging", "multiprocessing.util"):
        assert order.index(registers_at_import) > first, order[:first]
