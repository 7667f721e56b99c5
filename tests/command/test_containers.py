"""Command stages in containers, for real: podman (Debian, runc) on an imported image, bwrap on an
unpacked root file system; Apptainer's argv only (not packaged for Debian 12).

The image is a static busybox (Debian ``busybox-static``) in ``bin/``: no registry is needed.
A test whose engine is not installed is skipped, saying which package gives it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import psutil
import pytest

from habitrun.engine.command.containers import Mounts, apptainer_argv, container_argv
from tests.command.study import cli, output, results, write_study

BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "cat", "echo", "sleep", "ls", "wc")


def needs(tool: str, package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(tool) is None or BUSYBOX is None,
                              reason=f"{tool} or busybox is not installed (apt-get install -y {package} "
                                     "busybox-static; .ci/run installs them)")


def rootfs(folder: Path, marker: str) -> Path:
    """A root file system: a static busybox and its applets in bin/, and /etc/marker."""
    (folder / "bin").mkdir(parents=True)
    (folder / "etc").mkdir()
    assert BUSYBOX is not None
    shutil.copy(BUSYBOX, folder / "bin" / "busybox")
    for applet in APPLETS:
        (folder / "bin" / applet).symlink_to("busybox")
    (folder / "etc" / "marker").write_text(marker + "\n")
    return folder


def study_in_container(root: Path, container: dict, timeout_sec: float | None = None) -> Path:
    """A study whose stage reads the image's marker and a data file, read-only: a's in the study
    folder, b's in a folder outside it (given by its absolute path)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.txt").write_text("data a\n")
    elsewhere = root.parent / f"{root.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.txt").write_text("data b\n")
    rows = [{"subject_id": "a", "src": "data/a.txt"}, {"subject_id": "b", "src": str(elsewhere / "b.txt")}]
    stage = {"name": "inside", "shell": True, "container": container,
             "command": ['cat /etc/marker {src} > out.txt; if touch {src} 2>/dev/null; then echo rw >> out.txt; fi;'
                         ' if [ {subject} = b ] && [ -n "$HANG" ]; then sleep 301; fi'],
             "outputs": {"out": "out.txt"}}
    if timeout_sec is not None:
        stage["policy"] = {"subject_timeout_sec": timeout_sec}
    return write_study(root, [stage], rows, files=["src"])


def _sleepers() -> list[int]:
    """The hanging tool's processes (``sleep 301``), wherever they are."""
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if (p.info["cmdline"] or [])[-2:] == ["sleep", "301"] and p.info["status"] != psutil.STATUS_ZOMBIE]


@needs("podman", "podman runc")
@pytest.mark.timeout(120)
def test_podman_runs_the_stage_in_an_imported_image_and_a_new_image_reruns_it(tmp_path: Path) -> None:
    store = Path(tempfile.mkdtemp(prefix="hr-podman-", dir="/tmp"))  # podman: a run root under 50 characters
    try:
        _podman_study(tmp_path, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _podman_study(tmp_path: Path, store: Path) -> None:
    options = ["--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs",
               "--runtime", "runc", "--cgroup-manager", "cgroupfs"]

    def image(marker: str) -> None:
        tar = tmp_path / f"{marker}.tar"
        with tarfile.open(tar, "w") as out:
            out.add(rootfs(tmp_path / marker, marker), arcname=".")
        subprocess.run(["podman", *options, "import", "-q", str(tar), "localhost/habitrun-test:1"], check=True,
                       capture_output=True, timeout=60)

    image("first-image")
    container = {"image": "localhost/habitrun-test:1", "engine": "podman", "engine_options": options,
                 "run_options": ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "-e", "HANG"]}
    recipe = study_in_container(tmp_path / "s", container, timeout_sec=6)
    os.environ["HANG"] = "1"
    try:
        done = cli("run", str(recipe))
    finally:
        del os.environ["HANG"]
    assert done.returncode == 1, done.stdout + done.stderr
    got = results(recipe, "inside")
    assert output(recipe, got["a"]["out"]).read_text() == "first-image\ndata a\n"  # the study is read-only
    assert got["b"]["kind"] == "timeout", got["b"]
    assert not _sleepers()  # the timeout reached the process inside the container
    image("second-image")
    plan = cli("plan", str(recipe), "--reason")
    assert "image localhost/habitrun-test:1: sha256:" in plan.stdout, plan.stdout
    again = cli("run", str(recipe))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[inside] finished: 2 done, 0 cached" in again.stdout, again.stdout
    assert output(recipe, results(recipe, "inside")["b"]["out"]).read_text() == "second-image\ndata b\n"


@needs("bwrap", "bubblewrap")
@pytest.mark.timeout(60)
def test_bwrap_runs_the_stage_in_a_root_folder_and_a_changed_folder_reruns_it(tmp_path: Path) -> None:
    rootfs(tmp_path / "s" / "image", "bwrap-image")
    recipe = study_in_container(tmp_path / "s", {"image": "image", "engine": "bwrap"})
    done = cli("run", str(recipe))
    assert done.returncode == 0, done.stdout + done.stderr
    got = results(recipe, "inside")
    assert output(recipe, got["a"]["out"]).read_text() == "bwrap-image\ndata a\n"
    (tmp_path / "s" / "image" / "etc" / "marker").write_text("bwrap-image-2\n")
    plan = cli("plan", str(recipe), "--reason")
    assert "image image: blake2b:" in plan.stdout, plan.stdout
    again = cli("run", str(recipe))
    assert "[inside] finished: 2 done, 0 cached" in again.stdout, again.stdout
    assert output(recipe, results(recipe, "inside")["b"]["out"]).read_text() == "bwrap-image-2\ndata b\n"


def test_a_missing_engine_or_image_is_exit_2_at_validate(tmp_path: Path) -> None:
    recipe = study_in_container(tmp_path / "a", {"image": "no-such-folder", "engine": "bwrap"})
    done = cli("validate", str(recipe))
    assert done.returncode == 2 and "stage 'inside'" in done.stderr and "no-such-folder" in done.stderr, done.stderr
    recipe = study_in_container(tmp_path / "b", {"image": "x.sif", "engine": "apptainer"})
    done = cli("validate", str(recipe), path_first=tmp_path / "nothing")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'apptainer' not found (PATH searched:" in done.stderr and "Traceback" not in done.stderr


def test_apptainer_argv_binds_the_study_read_only_and_the_work_folder_writable() -> None:
    mounts = Mounts(read_only=("/study", "/study/.habitrun", "/data"), workdir="/study/.habitrun/work/s/a/k",
                    env={"OMP_NUM_THREADS": "2"})
    argv = apptainer_argv("/usr/bin/apptainer", "/study/images/tool.sif", ["dcm2niix", "-o", "."], mounts)
    assert argv == ["/usr/bin/apptainer", "exec", "--containall", "--no-home", "--pwd", "/study/.habitrun/work/s/a/k",
                    "--net", "--network", "none",
                    "--bind", "/study:/study:ro", "--bind", "/data:/data:ro",
                    "--bind", "/study/.habitrun:/study/.habitrun:ro",
                    "--bind", "/study/.habitrun/work/s/a/k:/study/.habitrun/work/s/a/k:rw",
                    "--env", "OMP_NUM_THREADS=2", "/study/images/tool.sif", "dcm2niix", "-o", "."]
    networked = container_argv("singularity", "singularity", "img.sif", ["x"],
                               Mounts(read_only=(), workdir="/w", network=True))
    assert "--network" not in networked and networked[:2] == ["singularity", "exec"]
