"""The objects a study's operators receive: a Subject, or for a collect stage a Collection."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Subject:
    """One subject in one map stage.

    ``fields`` is its manifest row, ``inputs`` maps each stage it needs to
    that stage's result for this subject, and ``workdir`` is a folder of its
    own for files it writes.
    """

    id: str
    fields: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    workdir: Path = field(default_factory=Path)

    def input(self, stage: str | None = None) -> Any:
        """The result of ``stage``; with one upstream stage, its name may be left out."""
        if stage is None:
            if len(self.inputs) != 1:
                raise KeyError(f"subject {self.id} has inputs {sorted(self.inputs)}; name one")
            return next(iter(self.inputs.values()))
        return self.inputs[stage]


class Collection(Mapping[str, Any]):
    """Every successful subject's result for a collect stage, by subject id.

    With one needed stage a value is that stage's result; with several it is
    a dict ``{stage: result}``. ``workdir`` is the stage's folder for files.
    """

    def __init__(self, results: dict[str, Any], workdir: Path, fields: dict[str, dict[str, Any]] | None = None) -> None:
        self.results = results
        self.workdir = Path(workdir)
        self.fields = fields or {}

    def __getitem__(self, subject_id: str) -> Any:
        return self.results[subject_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __repr__(self) -> str:
        return f"Collection({len(self.results)} subjects, workdir={str(self.workdir)!r})"
