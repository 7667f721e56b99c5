"""Code fingerprints per stage: edit an operator's module and its stage's keys change.

Nothing is imported: a map/collect operator or a train entrypoint is
fingerprinted from its module's source; a train command from its argv plus
the bytes of any argument that names a file under the recipe's root (the
training script).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from habitrun.spec.operators import operator_fingerprint
from habitrun.spec.recipe import StageSpec

if TYPE_CHECKING:
    from habitrun.spec.loader import LoadedRecipe


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


def stage_fingerprint(stage: StageSpec, search_path: tuple[str, ...], root: Path) -> str:
    """The code fingerprint of one stage."""
    if stage.operator is not None:
        return operator_fingerprint(stage.operator, search_path)
    if stage.entrypoint is not None:
        return operator_fingerprint(stage.entrypoint, search_path)
    return command_fingerprint(stage.command or (), root)


def fingerprints(loaded: LoadedRecipe) -> dict[str, str]:
    """stage name -> code fingerprint, for every stage of the recipe."""
    search_path = tuple(loaded.search_path)
    return {
        stage.name: stage_fingerprint(stage, search_path, Path(loaded.root))
        for stage in loaded.recipe.stages
    }
