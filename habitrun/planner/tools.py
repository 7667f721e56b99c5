"""A command stage's tool and image in its key: found, identified, or a recipe error naming what is missing.

The tool (the command's first item) is found on PATH; its identity is the output
of the stage's ``version:`` command (the version-like word in it, e.g.
``v1.0.20220720``, when there is one) or else the content digest of the
executable. With a ``container:`` the image is the tool's identity: an OCI
image's id (``podman image inspect``), or the content digest of a SIF file or
an unpacked root file system folder. What is missing (the tool, the engine, the
image) is a problem of the stage, reported before anything runs (exit 2).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from habitrun.planner.files import hash_file
from habitrun.spec.placeholders import tool_word

if TYPE_CHECKING:
    from habitrun.spec.recipe import ContainerSpec, StageSpec

VERSION_TIMEOUT_SEC = 30.0
_VERSION_WORD = re.compile(r"\bv?\d+(?:\.\d+)+[\w.+-]*")
_FOUND_ORDER = ("apptainer", "singularity", "podman", "docker")
MAX_SHOWN = 120


class ToolProblem(Exception):
    """What keeps a command stage from running (a message without its location)."""


def _path_text() -> str:
    return os.environ.get("PATH", os.defpath)


def find(name: str) -> str:
    """The executable ``name`` (a path, or a name on PATH); ToolProblem naming the PATH searched."""
    found = shutil.which(name)
    if found is None:
        raise ToolProblem(f"{name!r} not found (PATH searched: {_path_text()})")
    return found


def choose_engine(container: ContainerSpec, root: Path) -> tuple[str, str, str]:
    """(engine, its executable, the image as the engine takes it) for a stage's container."""
    image = container.image
    local = root / image if not os.path.isabs(image) else Path(image)
    folder, sif = local.is_dir(), local.is_file()
    engine = container.engine
    if engine is None:
        if folder:
            wanted: tuple[str, ...] = ("apptainer", "singularity", "bwrap")
        elif sif:
            wanted = ("apptainer", "singularity")
        else:
            wanted = ("podman", "docker")
        for name in wanted:
            if shutil.which(name):
                engine = name  # type: ignore[assignment]
                break
        else:
            raise ToolProblem(f"no container engine for image {image!r}: none of {', '.join(wanted)} "
                              f"found (PATH searched: {_path_text()})")
    assert engine is not None
    path = find(engine)
    if engine in ("bwrap", "apptainer", "singularity"):
        if engine == "bwrap" and not folder:
            raise ToolProblem(f"image {image!r}: bwrap runs an unpacked root file system folder, and "
                              f"{local} is not one")
        if not (folder or sif):
            raise ToolProblem(f"image {image!r}: {local} does not exist")
        return engine, path, str(local)
    return engine, path, image


def image_identity(container: ContainerSpec, root: Path) -> str:
    """The image's identity: an OCI image id, or the content digest of its file or folder."""
    engine, path, image = choose_engine(container, root)
    if engine in ("podman", "docker"):
        argv = [path, *container.engine_options, "image", "inspect", "--format", "{{.Id}}", image]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_SEC, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolProblem(f"{engine} could not inspect image {image!r}: {exc}") from exc
        if done.returncode != 0 or not done.stdout.strip():
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolProblem(f"image {image!r} not found by {engine} ({said})")
        found = done.stdout.strip().splitlines()[0]
        return found if ":" in found else "sha256:" + found  # podman prints the bare hex
    if os.path.isdir(image):
        return "blake2b:" + folder_digest(image)
    return "blake2b:" + hash_file(image)


def folder_digest(folder: str) -> str:
    """Digest of a folder's tree: every entry's relative path, kind, mode and content (or link target)."""
    h = hashlib.blake2b(digest_size=16)
    for top, dirs, files in os.walk(folder):
        dirs.sort()
        rel_top = os.path.relpath(top, folder)
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = os.path.join(top, name)
            st = os.lstat(full)
            if os.path.islink(full):
                what = "l" + os.readlink(full)
            elif os.path.isfile(full):
                what = f"f{st.st_mode & 0o7777:o}:" + hash_file(full)
            else:
                what = "o"
            h.update(f"{rel_top}/{name}\x00{what}\x00".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def version_of(argv: tuple[str, ...]) -> str:
    """What the version command prints: its version-like word, else its output (cut)."""
    argv = (find(argv[0]), *argv[1:])
    try:
        done = subprocess.run(argv, capture_output=True, timeout=VERSION_TIMEOUT_SEC, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolProblem(f"version command {' '.join(argv)!r} failed: {exc}") from exc
    text = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
    if not text:  # many tools exit non-zero after printing their version (dcm2niix -v: 3)
        raise ToolProblem(f"version command {' '.join(argv)!r} printed nothing (exit {done.returncode})")
    words = _VERSION_WORD.findall(text)
    shown = words[-1] if words else " ".join(text.split())
    return shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN]


def stage_tools(stage: StageSpec, root: Path, *, identify: bool = True) -> dict[str, str]:
    """A command stage's tool components: ``{"dcm2niix": "v1.0.20220720"}``, or with a
    container ``{"image localhost/tools:1": "sha256:..."}``. Without ``identify`` (validate)
    only what is missing is found: nothing is run or hashed but an OCI image lookup."""
    tool = tool_word(stage)
    if stage.container is not None:
        if not identify:
            engine, _, image = choose_engine(stage.container, root)
            if engine in ("podman", "docker"):
                image_identity(stage.container, root)
            return {}
        return {f"image {stage.container.image}": image_identity(stage.container, root)}
    resolved = find(tool)
    if not identify:
        if stage.version is not None:
            find(stage.version[0])
        return {}
    if stage.version is not None:
        return {os.path.basename(tool): version_of(stage.version)}
    return {os.path.basename(tool): "blake2b:" + hash_file(resolved)}
