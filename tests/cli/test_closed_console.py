"""A closed console never stops the work: the run goes on, the rest of its output goes to console.log.

Through the real CLI: its stdout (and stderr) is a pipe whose reader goes away
(`| head -1`, a pager quit, a dead log shipper); the run must end with the exit
code its subjects earn, every subject done, provenance finished, and `status`
saying so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.engine.study import habitrun_cmd, make_study, markers, run_cli

SUBJECTS = 8


def _study(tmp_path: Path, sleep: float = 0.0) -> Path:
    return make_study(tmp_path / "study", subjects=SUBJECTS,
                      square_params={"sleep": sleep} if sleep else None).parent


def _start(study: Path, *, stderr: int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe, block-buffered as in a shell
    return subprocess.Popen(habitrun_cmd("run", "recipe.yaml"), cwd=study, stdout=subprocess.PIPE,
                            stderr=stderr, env=env)


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode() if proc.stderr is not None else ""
    if proc.stderr is not None:
        proc.stderr.close()
    return code, err


def _check_finished(study: Path, err: str) -> str:
    """Every subject ran to its end, console.log holds the rest, `status` tells the truth; its text."""
    assert "Traceback" not in err and "Exception ignored" not in err, err
    ends = {name: [m for m in marks if m[0] == "end"] for name, marks in markers(study).items()}
    assert len([n for n in ends if n.startswith("square-") and ends[n]]) == SUBJECTS
    assert len([n for n in ends if n.startswith("plus_one-") and ends[n]]) == SUBJECTS
    (run,) = (study / ".habitrun" / "runs").iterdir()
    log = (run / "console.log").read_text()
    assert f"run folder: {run}" in log, log  # the summary's last line: the rest of the output is there
    assert "[total] finished: 1 done" in log, log
    status = run_cli("status", "recipe.yaml", cwd=study)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.splitlines()[0] == f"run {run.name}: success", status.stdout
    return log


@pytest.mark.timeout(120)
def test_head_one_lets_the_run_finish(tmp_path: Path) -> None:
    """`habitrun run recipe.yaml | head -1`: exit 0, every subject done, the rest in console.log."""
    study = _study(tmp_path)
    proc = _start(study)
    assert proc.stdout is not None
    first = proc.stdout.readline().decode()
    proc.stdout.close()  # head -1 has its line and goes
    code, err = _finish(proc)
    assert first.startswith("habitrun run "), first
    assert code == 0, err
    _check_finished(study, err)
    assert "the console was closed; the rest of the output goes to" in err  # said where it went


@pytest.mark.timeout(120)
def test_reader_closed_mid_run(tmp_path: Path) -> None:
    """The reader goes while subjects run: the run goes on to the end and exits 0."""
    study = _study(tmp_path, sleep=0.3)
    proc = _start(study)
    assert proc.stdout is not None
    seen = [proc.stdout.readline().decode() for _ in range(2)]  # the run's line and the first stage's
    assert seen[1].startswith("[square] map stage"), seen
    before = sum(1 for marks in markers(study).values() if any(m[0] == "end" for m in marks))
    proc.stdout.close()
    code, err = _finish(proc)
    assert code == 0, err
    assert before < 2 * SUBJECTS  # closed while work was left
    log = _check_finished(study, err)
    assert "[square] finished: 8 done" in log


@pytest.mark.timeout(120)
def test_stdout_and_stderr_on_one_closed_pipe(tmp_path: Path) -> None:
    """`habitrun run recipe.yaml 2>&1 | head -1`: both streams closed; still exit 0 and a finished run."""
    study = _study(tmp_path, sleep=0.1)
    proc = _start(study, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    code, err = _finish(proc)
    assert code == 0
    _check_finished(study, err)


@pytest.mark.timeout(120)
def test_closed_stderr_keeps_the_exit_code_of_an_error(tmp_path: Path) -> None:
    """A bad recipe with stderr closed: its message cannot be shown, its exit code still says 2."""
    study = _study(tmp_path)
    (study / "recipe.yaml").write_text("habitrun: 1\nname: broken\nstages: 3\n")
    proc = subprocess.Popen(habitrun_cmd("run", "recipe.yaml"), cwd=study, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdout is not None
    proc.stderr.close()
    try:
        assert proc.wait(timeout=60) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in proc.stdout.read()
    proc.stdout.close()


def test_closed_console_at_start_goes_to_console_log(tmp_path: Path) -> None:
    """stdout closed before the start (``>&-``): the run's whole output is in console.log."""
    study = _study(tmp_path)
    code = subprocess.run([*habitrun_cmd("run", "recipe.yaml")], cwd=study, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=90,
                          preexec_fn=lambda: os.close(1)).returncode  # noqa: PLW1509 - the shell's >&-
    assert code == 0
    (run,) = (study / ".habitrun" / "runs").iterdir()
    log = (run / "console.log").read_text()
    assert log.startswith(f"habitrun run {run.name}:"), log
    assert f"run folder: {run}" in log


def test_console_stream_switches_to_the_log_on_a_closed_pipe(tmp_path: Path) -> None:
    """The writer itself, on a real pipe: text goes through while it is read; once the reader is
    gone, the unflushed text and all that follows are held, then written to console.log."""
    from habitrun.cli.consoleout import ConsoleLog, ConsoleStream

    read_fd, write_fd = os.pipe()
    real = open(write_fd, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    log = ConsoleLog()
    stream = ConsoleStream(real, "stdout", log)
    try:
        stream.write("first\n")
        stream.flush()
        assert os.read(read_fd, 100) == b"first\n"
        assert stream.fileno() == write_fd
        os.close(read_fd)  # the reader goes
        stream.write("second\n")
        stream.flush()  # EPIPE here: switched, no error
        assert stream.broken
        stream.write("third\n")
        with pytest.raises(OSError):
            stream.fileno()  # a forked worker must not take it for fd 1
        folder = tmp_path / "run"
        folder.mkdir()
        log.attach(folder)
        stream.write("fourth\n")
        assert (folder / "console.log").read_text() == "second\nthird\nfourth\n"
        real.flush()  # the original stream's leftover goes to /dev/null now, not to an error
    finally:
        real.close()
