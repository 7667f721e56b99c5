"""The argv that runs a tool inside a container: podman/docker, apptainer/singularity, or bwrap.

One function per engine family, each a pure function of what to bind and run,
so the argv of an engine this machine lacks (Apptainer) is still tested. In
every engine: the study folder, the run folder (upstream outputs) and the
declared binds are mounted read-only at their own paths, the subject's work
folder read-write (and the tool starts in it), the network is off unless the
recipe asks for it, and the engine runs in the foreground as a child of the
worker, so a timeout or Ctrl-C that ends the worker's processes ends the
container's too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_IN_BWRAP_ROOT_SKIP = frozenset({"proc", "dev", "tmp"})  # bwrap makes these itself
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Mounts:
    """What a container sees of the host: read-only folders, and the one writable work folder."""

    read_only: tuple[str, ...]
    workdir: str
    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False


def _distinct(paths: Sequence[str], workdir: str) -> list[str]:
    """Absolute, each once, without the work folder itself; parents before children."""
    seen: list[str] = []
    for p in paths:
        p = os.path.abspath(p)
        if p != workdir and p not in seen:
            seen.append(p)
    return sorted(seen, key=lambda p: p.count(os.sep))


def oci_argv(engine_path: str, image: str, argv: Sequence[str], mounts: Mounts, *,
             engine_options: Sequence[str] = (), run_options: Sequence[str] = ()) -> list[str]:
    """podman or docker: ``ENGINE [opts] run --rm --network none -v P:P:ro ... IMAGE argv``."""
    out = [engine_path, *engine_options, "run", "--rm"]
    if not mounts.network:
        out += ["--network", "none"]
    for path in _distinct(mounts.read_only, mounts.workdir):
        out += ["-v", f"{path}:{path}:ro"]
    out += ["-v", f"{mounts.workdir}:{mounts.workdir}:rw", "--workdir", mounts.workdir]
    for name, value in mounts.env.items():
        out += ["-e", f"{name}={value}"]
    return [*out, *run_options, image, *argv]


def apptainer_argv(engine_path: str, image: str, argv: Sequence[str], mounts: Mounts, *,
                   engine_options: Sequence[str] = (), run_options: Sequence[str] = ()) -> list[str]:
    """apptainer or singularity: ``ENGINE [opts] exec --containall --bind P:P:ro ... IMAGE argv``
    (a .sif file or a sandbox folder)."""
    out = [engine_path, *engine_options, "exec", "--containall", "--no-home", "--pwd", mounts.workdir]
    if not mounts.network:
        out += ["--net", "--network", "none"]
    for path in _distinct(mounts.read_only, mounts.workdir):
        out += ["--bind", f"{path}:{path}:ro"]
    out += ["--bind", f"{mounts.workdir}:{mounts.workdir}:rw"]
    for name, value in mounts.env.items():
        out += ["--env", f"{name}={value}"]
    return [*out, *run_options, image, *argv]


def bwrap_argv(engine_path: str, rootfs: str, argv: Sequence[str], mounts: Mounts, *,
               engine_options: Sequence[str] = (), run_options: Sequence[str] = ()) -> list[str]:
    """bwrap over an unpacked root file system, as Apptainer runs a sandbox folder.

    The root is a tmpfs with each of the rootfs's top-level entries bound read-only on it,
    so the host folders can be mounted at their own paths without the rootfs having (or
    anyone writing) their mount points.
    """
    out = [engine_path, *engine_options, "--tmpfs", "/"]
    for entry in sorted(os.scandir(rootfs), key=lambda e: e.name):
        if entry.name in _IN_BWRAP_ROOT_SKIP:
            continue
        if entry.is_symlink():
            out += ["--symlink", os.readlink(entry.path), "/" + entry.name]
        else:
            out += ["--ro-bind", entry.path, "/" + entry.name]
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in _distinct(mounts.read_only, mounts.workdir):
        out += ["--ro-bind", path, path]
    out += ["--bind", mounts.workdir, mounts.workdir, "--chdir", mounts.workdir,
            "--unshare-all", "--die-with-parent", "--clearenv", "--setenv", "PATH", DEFAULT_PATH,
            "--setenv", "HOME", "/tmp"]
    if mounts.network:
        out.append("--share-net")
    for name, value in mounts.env.items():
        out += ["--setenv", name, value]
    return [*out, *run_options, *argv]


def container_argv(engine: str, engine_path: str, image: str, argv: Sequence[str], mounts: Mounts, *,
                   engine_options: Sequence[str] = (), run_options: Sequence[str] = ()) -> list[str]:
    """The argv for ``engine`` (apptainer, singularity, podman, docker or bwrap)."""
    build = {"podman": oci_argv, "docker": oci_argv, "apptainer": apptainer_argv,
             "singularity": apptainer_argv, "bwrap": bwrap_argv}[engine]
    return build(engine_path, image, argv, mounts, engine_options=engine_options, run_options=run_options)
