"""engine/train.py: a train stage's recipe options -> a rank group -> a TrainOutcome."""

from __future__ import annotations

import csv
import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from habitrun.engine.control import StopFlag
from habitrun.engine.train import run_train_stage
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec
from tests.launcher.conftest import is_alive, needs_torch

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"

TRAINER = '''
import json, os, signal, subprocess, sys, time
from pathlib import Path


def main():
    inputs = json.loads(Path(os.environ["HABITRUN_INPUTS"]).read_text())
    rank = int(os.environ["RANK"])
    Path(os.environ["HABITRUN_WORKDIR"], f"rank{rank}.txt").write_text(os.getcwd())
    print(f"training on {inputs['table']['n']} rows")
    return {"rank": rank, "n": inputs["table"]["n"], "world": int(os.environ["WORLD_SIZE"])}


def broken():
    raise RuntimeError("loss is nan")


def forever():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(os.environ["HABITRUN_WORKDIR"], f"pids{os.environ['RANK']}").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(120)


def stubborn():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # sits out the whole grace
    forever()


def polite():
    got = []

    def note(signum, frame):
        got.append(signum)
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, note)
    try:
        forever()
    except KeyboardInterrupt:  # a training script's clean-up: runs on the signal habitrun received
        Path(os.environ["HABITRUN_WORKDIR"], f"caught{os.environ['RANK']}").write_text(
            signal.Signals(got[0] if got else signal.SIGINT).name)
'''

CMD_TRAINER = '''
import json, os, sys
workdir, inputs, stage_dir, run_id = sys.argv[1:5]
assert workdir == os.environ["HABITRUN_WORKDIR"] and inputs == os.environ["HABITRUN_INPUTS"]
if os.environ["RANK"] == "0" and "--write" in sys.argv:
    with open(os.path.join(workdir, "result.json"), "w") as f:
        json.dump({"run_id": run_id, "stage_dir": stage_dir, "cwd": os.getcwd()}, f)
'''


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "study"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "__init__.py").write_text("")
    (root / "ops" / "trainer.py").write_text(TRAINER)
    (root / "cmd_train.py").write_text(CMD_TRAINER)
    return root


def _run(stage: StageSpec, root: Path, tmp_path: Path, *, stop=None, policy=None, inputs=None, console=None):
    return run_train_stage(
        stage, policy or RunPolicy(graceful_shutdown_sec=5), stage_dir=tmp_path / "run" / stage.name,
        workdir=tmp_path / "work", inputs=inputs if inputs is not None else {"table": {"n": 7}},
        search_path=(str(root),), run_id="run-1", stop=stop or StopFlag(), console=console,
    )


def _stage(**kw) -> StageSpec:
    return StageSpec(name="train", kind="train", needs=("table",), **kw)


def test_entrypoint_stage_returns_rank_zeros_value(study, tmp_path, console):
    out = _run(_stage(entrypoint="ops.trainer:main", launch={"nproc_per_node": 2}), study, tmp_path,
               console=console)
    assert out.ok, (out.error, out.traceback)
    assert out.result == {"rank": 0, "n": 7, "world": 2}
    assert out.attempts == 1 and out.log_dir == str(tmp_path / "run" / "train")
    assert json.loads((tmp_path / "run" / "train" / "inputs.json").read_text()) == {"table": {"n": 7}}
    assert (tmp_path / "run" / "train" / "attempt_0" / "1" / "stdout.log").read_text() == "training on 7 rows\n"
    assert "[train/0] training on 7 rows" in console.lines
    assert (tmp_path / "work" / "rank1.txt").read_text() == str(study)  # cwd: the recipe's folder


def test_command_stage_substitutes_and_reads_result_json(study, tmp_path, console):
    argv = [sys.executable, "cmd_train.py", "${workdir}", "${inputs}", "${stage_dir}", "${run_id}", "--write"]
    out = _run(_stage(command=argv, launch={"nproc_per_node": 2}), study, tmp_path, console=console)
    assert out.ok, (out.error, out.traceback)
    assert out.result == {"run_id": "run-1", "stage_dir": str(tmp_path / "run" / "train"), "cwd": str(study)}
    # without a result.json (a stale one is removed first) the result names the workdir
    out = _run(_stage(command=argv[:-1]), study, tmp_path, console=console)
    assert out.ok and out.result == {"workdir": str(tmp_path / "work")}


def test_command_placeholders_fill_in_one_pass_and_double_dollar_is_literal():
    from habitrun.engine.train import substitute

    values = {"workdir": "/w/${run_id}", "run_id": "r1"}
    argv = ["--out", "${workdir}/m.pt", "$${workdir}", "${run_id}$${x}", "${unknown}", "$$", "${HOME}"]
    assert substitute(argv, values) == ["--out", "/w/${run_id}/m.pt", "${workdir}", "r1${x}", "${unknown}", "$$",
                                        "${HOME}"]


def test_failing_entrypoint_reports_the_root_cause_after_restarts(study, tmp_path, console):
    out = _run(_stage(entrypoint="ops.trainer:broken", launch={"nproc_per_node": 2, "max_restarts": 1}),
               study, tmp_path, console=console)
    assert not out.ok and out.attempts == 2
    assert "RuntimeError: loss is nan" in out.error
    assert "in broken" in out.traceback
    # whichever rank failed first (the other may be stopped before it raises) left its error file
    assert list((tmp_path / "run" / "train" / "attempt_1").glob("*/error.json"))


def test_missing_entrypoint_module_is_named(study, tmp_path, console):
    out = _run(_stage(entrypoint="ops.nowhere:main"), study, tmp_path, console=console)
    assert not out.ok
    assert "no module named 'ops.nowhere'" in out.error


def test_missing_command_fails_the_stage_with_its_name(study, tmp_path, console):
    out = _run(_stage(command=["no-such-trainer-xyz", "--epochs", "1"]), study, tmp_path, console=console)
    assert not out.ok and out.attempts == 0
    assert "'no-such-trainer-xyz' not found" in out.error


def test_stage_timeout_stops_a_hung_group(study, tmp_path, console):
    out = _run(_stage(entrypoint="ops.trainer:forever", launch={"nproc_per_node": 2, "timeout_sec": 2}),
               study, tmp_path, console=console)
    assert not out.ok and out.error.startswith("timeout")
    # ranks that got far enough to start their child (on a busy machine maybe none) are gone with it
    files = [tmp_path / "work" / f"pids{r}" for r in (0, 1)]
    pids = [int(p) for f in files if f.exists() for p in f.read_text().split()]
    assert not [p for p in pids if is_alive(p)]


def test_a_stop_flag_interrupts_the_stage(study, tmp_path, console):
    stop = StopFlag()

    def stop_soon():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all((tmp_path / "work" / f"pids{r}").exists() for r in (0, 1)):
                break
            time.sleep(0.02)
        stop.set("signal SIGINT", signum=signal.SIGINT)

    thread = threading.Thread(target=stop_soon)
    thread.start()
    try:
        out = _run(_stage(entrypoint="ops.trainer:forever", launch={"nproc_per_node": 2}), study, tmp_path,
                   stop=stop, console=console)
    finally:
        thread.join()
        stop.close()
    assert not out.ok and out.error == "interrupted"
    _assert_ranks_and_children_gone(tmp_path)


HABITRUN_LIKE = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from habitrun.engine.control import StopFlag
from habitrun.engine.signals import stop_on_signals
from habitrun.engine.train import run_train_stage
from habitrun.spec.policy import RunPolicy
from habitrun.spec.recipe import StageSpec
if __name__ == "__main__":
    stage = StageSpec(name="train", kind="train", needs=("t",), entrypoint="ops.trainer:{entry}",
                      launch={{"nproc_per_node": 2}})
    tmp = Path({tmp!r})
    with stop_on_signals(StopFlag()) as stop:
        out = run_train_stage(stage, RunPolicy(graceful_shutdown_sec={grace}), stage_dir=tmp / "run",
                              workdir=tmp / "work", inputs={{}}, search_path=({root!r},),
                              run_id="r", stop=stop)
    print("OUTCOME", out.ok, out.error, flush=True)
"""


def _signalled_run(study: Path, tmp_path: Path, *, grace: float, entry: str, signals: Callable[[subprocess.Popen], None]) -> str:
    """Run a habitrun-like train stage in a child process; once both ranks run, ``signals(proc)``."""
    script = tmp_path / "habitrun_like.py"
    script.write_text(HABITRUN_LIKE.format(repo=str(REPO), tmp=str(tmp_path), root=str(study), grace=grace,
                                           entry=entry))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / "work" / f"pids{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "ranks never started"
            time.sleep(0.02)
        signals(proc)
        return proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _assert_ranks_and_children_gone(tmp_path: Path) -> None:
    pids = [int(p) for r in (0, 1) for p in (tmp_path / "work" / f"pids{r}").read_text().split()]
    deadline = time.monotonic() + 10
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if is_alive(p)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_habitrun_stops_every_rank_and_child(study, tmp_path, sig):
    out = _signalled_run(study, tmp_path, grace=5, entry="forever", signals=lambda proc: proc.send_signal(sig))
    assert "OUTCOME False interrupted" in out
    _assert_ranks_and_children_gone(tmp_path)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_ranks_receive_the_signal_habitrun_received(study, tmp_path, sig):
    out = _signalled_run(study, tmp_path, grace=10, entry="polite", signals=lambda proc: proc.send_signal(sig))
    assert "OUTCOME False interrupted" in out
    for rank in (0, 1):  # torchrun forwards the signal: a KeyboardInterrupt handler runs on Ctrl-C
        assert (tmp_path / "work" / f"caught{rank}").read_text() == sig.name
    _assert_ranks_and_children_gone(tmp_path)


@pytest.mark.timeout(90)
def test_a_second_sigint_ends_the_ranks_grace_at_once(study, tmp_path):
    # Ranks that ignore SIGTERM would hold the first Ctrl-C for the whole 600 s grace.
    def twice(proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # the first one waits for the ranks, which ignore SIGTERM
        proc.send_signal(signal.SIGINT)

    out = _signalled_run(study, tmp_path, grace=600, entry="stubborn", signals=twice)
    assert "OUTCOME False interrupted" in out
    _assert_ranks_and_children_gone(tmp_path)


# -- the demo's training entrypoint -----------------------------------------------------------


def _feature_table(path: Path, n: int = 24) -> Path:
    rnd = random.Random(7)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject_id", "label", "energy", "mean", "voxels"])
        for i in range(n):
            label = i % 2
            writer.writerow([f"S{i:03d}", label, rnd.gauss(2.0 * label, 0.7), rnd.gauss(0, 1), rnd.randint(50, 90)])
    return path


@pytest.mark.torch
@needs_torch
@pytest.mark.timeout(240)
def test_demo_train_stage_trains_with_ddp_over_two_ranks(tmp_path, console):
    table = _feature_table(tmp_path / "features.csv")
    stage = _stage(entrypoint="study_ops.train:main", launch={"nproc_per_node": 2, "max_restarts": 1})
    out = _run(stage, DEMO, tmp_path, inputs={"table": {"table": str(table), "n_subjects": 24}}, console=console)
    assert out.ok, (out.error, out.traceback)
    metrics = json.loads((tmp_path / "work" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["n_subjects"] == 24
    assert metrics["accuracy"] >= 0.75  # the label is a clear shift of one feature
    assert out.result["accuracy"] == metrics["accuracy"] and out.result["model"] == str(tmp_path / "work" / "model.pt")
    import torch

    saved = torch.load(tmp_path / "work" / "model.pt", weights_only=False)
    assert saved["columns"] == ["energy", "mean", "voxels"]
    assert any(line.startswith("[train/0] accuracy ") for line in console.lines)


def test_demo_train_stage_says_what_to_install_without_torch(tmp_path, console):
    table = _feature_table(tmp_path / "features.csv")
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # as if PyTorch were not installed
        from study_ops.train import main
        main()
    """)
    out = _run(_stage(command=[sys.executable, "-c", code]), DEMO, tmp_path,
               inputs={"table": {"table": str(table), "n_subjects": 24}}, console=console)
    assert not out.ok
    assert "the demo's train stage needs PyTorch: pip install 'habitrun[train]'" in out.error
    assert "torch==2.13.0" in out.error
