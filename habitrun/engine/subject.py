"""The objects a study's operators receive: a Subject, or for a collect stage a Collection."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class Subject:
    """One subject in one map stage.

    ``fields`` is its manifest row, ``inputs`` maps each stage it needs to
    that stage's result for this subject, and ``workdir`` is a folder of its
    own for files it writes (created the first time it is asked for, so a
    subject that writes no file costs no folder).
    """

    __slots__ = ("id", "fields", "inputs", "_workdir", "_made")

    def __init__(self, id: str, fields: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None,
                 workdir: str | Path = ".") -> None:
        self.id = id
        self.fields = fields or {}
        self.inputs = inputs or {}
        self._workdir: str | Path = workdir  # a Path only when asked for: most subjects never ask
        self._made = False

    @property
    def workdir(self) -> Path:
        if not self._made:
            self._workdir = Path(self._workdir)
            os.makedirs(self._workdir, exist_ok=True)
            self._made = True
        return self._workdir  # type: ignore[return-value]

    def input(self, stage: str | None = None) -> Any:
        """The result of ``stage``; with one upstream stage, its name may be left out."""
        if stage is None:
            if len(self.inputs) != 1:
                raise KeyError(f"subject {self.id} has inputs {sorted(self.inputs)}; name one")
            return next(iter(self.inputs.values()))
        return self.inputs[stage]

    def __repr__(self) -> str:
        return f"Subject(id={self.id!r}, fields={self.fields!r}, inputs={sorted(self.inputs)}, workdir={str(self._workdir)!r})"


class Collection(Mapping[str, Any]):
    """Every successful subject's result for a collect stage, by subject id.

    With one needed stage a value is that stage's result; with several it is
    a dict ``{stage: result}``. ``fields`` holds each subject's manifest row;
    ``workdir`` is the stage's folder for files.
    """

    def __init__(self, results: dict[str, Any], workdir: str | Path, fields: dict[str, dict[str, Any]] | None = None) -> None:
        self.results = results
        self._workdir = Path(workdir)
        self.fields = fields or {}

    @property
    def workdir(self) -> Path:
        os.makedirs(self._workdir, exist_ok=True)
        return self._workdir

    def __getitem__(self, subject_id: str) -> Any:
        return self.results[subject_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __repr__(self) -> str:
        return f"Collection({len(self.results)} subjects, workdir={str(self._workdir)!r})"
