"""Code fingerprints of a train command, and the fingerprint keys had before issue 10.

Nothing is imported: a train command counts by its argv plus the bytes of any
argument that names a file under the recipe's root (the training script). The
fingerprint before issue 10 took an operator's (or entrypoint's) module bytes
instead of its syntax tree (:mod:`habitrun.planner.code`): results stored under
keys made with it are still found (see ``StageInputs.legacy_fingerprint``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from habitrun.spec.operators import operator_fingerprint
from habitrun.spec.recipe import StageSpec


def command_fingerprint(command: tuple[str, ...] | list[str], root: Path) -> str:
    """sha256 of the argv and of every argument that is an existing file relative to ``root``."""
    digest = hashlib.sha256()
    for arg in command:
        digest.update(arg.encode("utf-8", "surrogatepass") + b"\x00")
        if "${" in arg or "\x00" in arg or not arg:
            continue  # a runtime placeholder, or not a path at all
        try:
            candidate = Path(arg) if Path(arg).is_absolute() else root / arg
            if candidate.is_file():
                digest.update(b"file\x00" + candidate.read_bytes() + b"\x00")
        except (OSError, ValueError):
            continue
    return digest.hexdigest()


def legacy_fingerprint(stage: StageSpec, search_path: tuple[str, ...], root: Path) -> str:
    """The code fingerprint habitrun gave a stage before issue 10 (module bytes, command argv and files)."""
    if stage.operator is not None:
        return operator_fingerprint(stage.operator, search_path)
    if stage.entrypoint is not None:
        return operator_fingerprint(stage.entrypoint, search_path)
    return command_fingerprint(stage.command or (), root)

