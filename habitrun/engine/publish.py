"""A stage's current results, published into the study under stable names.

Stored results live in hidden, key-named work folders (``.habitrun/work/<stage>/<subject>/<key>/``)
that any change renames. A stage with ``publish:`` gets, after it runs, a plain folder in the study
(default ``results/<stage>/``) holding exactly its current result files: ``<subject>/<file name>``
for a map stage, ``<file name>`` for a collect or train stage (a table returned as a DataFrame is
written as ``<stage>.csv``). Beside them ``index.json`` says which subject, run and key produced
each file, with its size and SHA-256.

Each file is written to a temporary name and renamed over its place, so a reader sees the old file or
the new one, never half; ``index.json`` is replaced last. A file whose subject and key are unchanged
is not touched (its content and mtime stay), so rerunning one subject changes one file. Files the
index lists that are no longer current (a subject removed, failed, or its result no longer naming
the file) are removed; a file the index does not list is never touched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habitrun.errors import PublishError
from habitrun.planner.plan import StagePlan, SubjectStatus
from habitrun.planner.stageplan import GROUP_SUBJECT
from habitrun.spec.recipe import PublishSpec
from habitrun.store.resultfiles import files_named

INDEX_NAME = "index.json"
INDEX_FORMAT = 1
ReadResults = Callable[[list[str]], Mapping[str, Any]]

@dataclass(frozen=True)
class Current:
    """One file that should be in the published folder now."""

    name: str  # path inside the published folder, with "/" separators
    subject: str
    key: str
    source: Path | None  # the stored file; None: ``table`` is written instead
    table: Any = None  # a DataFrame-like object (``to_csv``) of a collect stage


@dataclass
class PublishReport:
    """What one publishing did, for the run's summary line."""

    folder: Path
    files: int = 0
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def publish_folder(spec: PublishSpec, stage: str, study_root: Path) -> Path:
    """The published folder of ``stage``: ``spec.to`` with ``{stage}`` filled, against the study."""
    folder = Path(spec.to.format(stage=stage)).expanduser()
    return folder if folder.is_absolute() else Path(study_root) / folder


def current_files(stage: str, results: Mapping[str, tuple[str, Any]], safe_names: Mapping[str, str],
                  work_root: Path) -> list[Current]:
    """The files a stage's results name: ``results`` is subject id → (key, stored result).

    A file counts when a result names it (a Path, or a string holding an absolute path) and it is
    inside the run's work folders (``work_root``): an input file a result passes on is not the
    stage's output. A map subject's files go under its safe id; a collect or train stage's files
    (subject ``*``) at the top. Two files of one subject with the same name are numbered."""
    wanted: list[Current] = []
    for sid, (key, result) in results.items():
        prefix = "" if sid == GROUP_SUBJECT else f"{safe_names.get(sid, sid)}/"
        taken: set[str] = set()
        if sid == GROUP_SUBJECT and hasattr(result, "to_csv") and callable(result.to_csv):
            wanted.append(Current(name=f"{stage}.csv", subject=sid, key=key, source=None, table=result))
            continue
        seen: set[str] = set()
        for path in files_named(result, work_root):
            if str(path) in seen:
                continue  # one file named twice by the result
            seen.add(str(path))
            name = _free_name(path.name, taken)
            wanted.append(Current(name=prefix + name, subject=sid, key=key, source=path))
    return wanted


def _free_name(name: str, taken: set[str]) -> str:
    stem, dot, ext = name.partition(".")
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{stem}-{n}{dot}{ext}"
    taken.add(candidate)
    return candidate


def publish(folder: Path, wanted: list[Current], *, stage: str, run_id: str, mode: str,
            prune: bool) -> PublishReport:
    """Make ``folder`` hold ``wanted``; remove what the old index lists and is not wanted (when
    ``prune``: a stopped stage keeps what it did not get to). Raises PublishError on an OS error."""
    report = PublishReport(folder=folder, files=len(wanted))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        old = _read_index(folder)
        entries: dict[str, dict[str, Any]] = {}
        for item in wanted:
            before = old.get(item.name)
            target = folder / item.name
            if before is not None and before.get("key") == item.key and before.get("subject") == item.subject \
                    and _same_file(target, before):
                entries[item.name] = before
                continue
            entries[item.name] = _write(folder, item, mode, run_id)
            report.written.append(item.name)
        gone = [name for name in old if name not in entries]
        if not prune:
            entries.update({name: old[name] for name in gone})
        else:
            for name in gone:
                _remove(folder, name)
                report.removed.append(name)
        _write_index(folder, stage, entries)
    except OSError as exc:
        raise PublishError(f"stage {stage!r}: could not publish into {folder}: {exc.strerror or exc} "
                           "(the stored results are untouched; the next run publishes again)") from None
    return report


def _same_file(target: Path, entry: Mapping[str, Any]) -> bool:
    try:
        st = target.stat()
    except OSError:
        return False
    return st.st_size == entry.get("size") and st.st_mtime_ns == entry.get("mtime_ns")


def _write(folder: Path, item: Current, mode: str, run_id: str) -> dict[str, Any]:
    """One file to a temporary name beside its place, then renamed over it; its index entry."""
    target = folder / item.name
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".publishing-", dir=target.parent)
    os.close(fd)
    try:
        if item.source is None:
            item.table.to_csv(tmp, index=False)
        elif mode == "link" and _linked(item.source, tmp):
            pass
        else:
            shutil.copyfile(item.source, tmp)
            shutil.copystat(item.source, tmp)
        digest = _sha256(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    st = target.stat()
    return {"subject": item.subject, "key": item.key, "run": run_id, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "sha256": digest,
            "source": str(item.source) if item.source is not None else None}


def _linked(source: Path, tmp: str) -> bool:
    """A hard link to ``source`` at ``tmp``; False where links cannot be made (another file system)."""
    os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            Path(tmp).touch()
            return False
        raise
    return True


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _remove(folder: Path, name: str) -> None:
    """A published file no longer current, and its subject's folder once empty."""
    target = folder / name
    target.unlink(missing_ok=True)
    parent = target.parent
    while parent != folder and parent.is_relative_to(folder):
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def _read_index(folder: Path) -> dict[str, dict[str, Any]]:
    """The files published before (an unreadable index: none, so every file is written again)."""
    try:
        data = json.loads((folder / INDEX_NAME).read_text(encoding="utf-8"))
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {name: entry for name, entry in files.items()
            if isinstance(entry, dict) and _inside(folder, name)} if isinstance(files, dict) else {}


def _inside(folder: Path, name: str) -> bool:
    """An index entry names a file inside the folder (never ``..`` or an absolute path)."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts and name != INDEX_NAME


def _write_index(folder: Path, stage: str, entries: Mapping[str, Mapping[str, Any]]) -> None:
    data = {"format": INDEX_FORMAT, "stage": stage, "files": dict(sorted(entries.items()))}
    fd, tmp = tempfile.mkstemp(prefix=".publishing-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, folder / INDEX_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_stage(spec: PublishSpec, *, stage: str, plan: StagePlan, read: ReadResults,
                  safe_names: Mapping[str, str], study_root: Path, work_root: Path, run_id: str,
                  prune: bool) -> PublishReport:
    """Publish the results of a stage's done subjects (``read``: keys → {key: stored result},
    committed and checked) into its folder."""
    done = {sid: key for sid, key in plan.keys.items() if plan.status.get(sid) is SubjectStatus.DONE}
    stored = read(sorted(set(done.values()))) if done else {}
    results = {sid: (key, stored[key]) for sid, key in done.items() if key in stored}
    wanted = current_files(stage, results, safe_names, work_root)
    return publish(publish_folder(spec, stage, study_root), wanted, stage=stage, run_id=run_id,
                   mode=spec.mode, prune=prune)
