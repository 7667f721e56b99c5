"""Run folders: what one run read, did and printed, under ``<run_root>/runs/<run_id>/``.

A run folder holds the resolved recipe (what `resume` replays), where it
came from (``source.json``), the provenance record, the event log, and one
log file per subject per stage. Work folders live outside runs
(``<run_root>/work/<stage>/<subject>/<key folder>``, see :func:`work_dir`) so a
resumed run finds a subject's files where the killed run left them.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from habitrun.errors import StoreError
from habitrun.store.events import EventLog
from habitrun.store.folders import folder_error

RUNS = "runs"
RECIPE_FILE = "recipe.yaml"
SOURCE_FILE = "source.json"
PROVENANCE_FILE = "provenance.json"
EVENTS_FILE = "events.jsonl"
RUNNING_FILE = "running.json"  # the subjects running now, rewritten each second by the runner (engine/running_file.py)
INCOMPLETE_PREFIX = ".incomplete-"  # a run folder being made; renamed to its run id when complete
RESERVE_FILE = ".space-reserve"  # in the run root: room set aside to record a run's end on a disk that filled
RESERVE_BYTES = 64 * 1024
DISK_FULL = "disk_full"  # outcomes of a run stopped because a folder refused a write: no space left,
UNWRITABLE = "unwritable"  # or another reason (its summary's ``write_failure`` says where and why)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str, ensure_ascii=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()  # a half-written copy would hold space a full disk needs back
        except OSError:
            pass
        raise


def keep_reserve(run_root: Path, size: int) -> None:
    """Make sure ``run_root`` holds a file of ``size`` allocated bytes, set aside for a full disk.

    One per study, kept from run to run: a ``stat`` when it is there (freeing allocated blocks
    costs 0.3-3 ms on ext4, too much for the end of every run). Best effort: a file system
    that cannot allocate ahead gets none, and a disk already too full for it, a smaller one.
    """
    path = Path(run_root) / RESERVE_FILE
    try:
        if path.stat().st_size >= size:
            return
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path} cannot be read ({exc}); the run folder is damaged") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} does not hold a JSON object; the run folder is damaged")
    return data


class RunFolder:
    """One run's folder (see the module docstring)."""

    def __init__(self, path: Path, source: dict[str, Any]) -> None:
        self.path = Path(path)
        self.run_id = self.path.name
        self.source = source
        self.recipe_file = self.path / RECIPE_FILE
        self.events = EventLog(self.path / EVENTS_FILE)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @classmethod
    def create(
        cls,
        run_root: Path,
        *,
        resolved_yaml: str,
        recipe_path: Path,
        argv: list[str],
        root: Path | None = None,
        provenance: dict[str, Any] | None = None,
        reserve: int = RESERVE_BYTES,
    ) -> RunFolder:
        """Make a new run folder, complete or not at all.

        The recipe, its source and the provenance (``run_id`` added) are written into a
        hidden folder that is renamed into place last: a runner killed while creating it
        leaves no half-made run for `resume` or `status` to pick up. ``reserve`` bytes are
        kept set aside beside it (:func:`keep_reserve`, :meth:`free_reserve`), so that a run
        stopped by a full disk can still record how it ended.
        """
        runs = Path(run_root) / RUNS
        now = time.time()
        stamp = datetime.fromtimestamp(now).strftime("%Y%m%d-%H%M%S")
        try:
            runs.mkdir(parents=True, exist_ok=True)
            if reserve:
                keep_reserve(run_root, reserve)
            while True:
                run_id = f"{stamp}-{secrets.token_hex(3)}"
                path = runs / run_id
                draft = runs / f"{INCOMPLETE_PREFIX}{run_id}"
                if path.exists() or path.is_symlink():
                    continue
                try:
                    draft.mkdir()
                    break
                except FileExistsError:
                    continue
            (draft / "logs").mkdir()
            recipe_path = Path(recipe_path).resolve()
            source = {
                "recipe_path": str(recipe_path),
                "root": str(Path(root).resolve() if root else recipe_path.parent),
                "argv": list(argv),
                "created_ts": now,
            }
            tmp = draft / f".{RECIPE_FILE}.tmp"
            tmp.write_text(resolved_yaml, encoding="utf-8")
            os.replace(tmp, draft / RECIPE_FILE)
            _write_json_atomic(draft / SOURCE_FILE, source)
            _write_json_atomic(draft / PROVENANCE_FILE, {**(provenance or {}), "run_id": run_id})
            os.rename(draft, path)
            _fsync_folder(runs)
        except OSError as exc:
            raise folder_error(runs, exc, doing="create a run folder in") from None
        return cls(path, source)

    @classmethod
    def open(cls, path: Path) -> RunFolder:
        """Open an existing run folder; StoreError if ``path`` is not one."""
        path = Path(path)
        if not path.is_dir():
            raise StoreError(f"{path} is not a run folder (no such folder)")
        if not (path / SOURCE_FILE).is_file() or not (path / RECIPE_FILE).is_file():
            raise StoreError(
                f"{path} is not a run folder: it lacks {SOURCE_FILE} or {RECIPE_FILE} "
                f"(run folders live in <recipe folder>/.habitrun/{RUNS}/)"
            )
        return cls(path, _read_json(path / SOURCE_FILE))

    @staticmethod
    def looks_like_run(path: Path) -> bool:
        return (Path(path) / SOURCE_FILE).is_file() and (Path(path) / RECIPE_FILE).is_file()

    @staticmethod
    def is_complete(path: Path) -> bool:
        """A run folder whose creation finished: it has its provenance (older habitrun versions
        made the folder first and wrote the provenance after; a kill in between left none)."""
        return RunFolder.looks_like_run(path) and (Path(path) / PROVENANCE_FILE).is_file()

    @property
    def created_ts(self) -> float:
        ts = self.source.get("created_ts")
        if isinstance(ts, (int, float)):
            return float(ts)
        try:
            return (self.path / SOURCE_FILE).stat().st_mtime
        except OSError:
            return 0.0

    def stage_log_dir(self, stage: str) -> Path:
        """The folder of a stage's subject logs (created): ``<folder>/<safe id>.log`` each."""
        folder = self.path / "logs" / stage
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def subject_log(self, stage: str, safe: str) -> Path:
        """Log file of one subject in one stage (the folder is created)."""
        return self.stage_log_dir(stage) / f"{safe}.log"

    def stage_dir(self, stage: str) -> Path:
        """A stage's own folder in this run (a train stage's attempts go here)."""
        folder = self.path / "stages" / stage
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def write_provenance(self, info: dict[str, Any]) -> None:
        _write_json_atomic(self.path / PROVENANCE_FILE, info)

    def read_provenance(self) -> dict[str, Any]:
        return _read_json(self.path / PROVENANCE_FILE)

    def finish(self, outcome: str, summary: dict[str, Any]) -> None:
        """Record the end: ``ended_at``, ``outcome`` and ``summary`` join the provenance."""
        info = self.read_provenance()
        info["ended_at"] = datetime.now().astimezone().isoformat(timespec="seconds")
        info["outcome"] = outcome
        info["summary"] = summary
        self.write_provenance(info)

    def free_reserve(self) -> bool:
        """Give back the space set aside for a full disk (True if there was some); the next run
        sets it aside again."""
        try:
            (self.path.parent.parent / RESERVE_FILE).unlink()
        except OSError:  # none (already freed, or never made)
            return False
        return True


def list_runs(run_root: Path) -> list[RunFolder]:
    """Every complete run folder under ``run_root``, oldest first (half-made ones are skipped)."""
    runs = Path(run_root) / RUNS
    if not runs.is_dir():
        return []
    found = []
    for entry in runs.iterdir():
        if not entry.name.startswith(".") and entry.is_dir() and RunFolder.is_complete(entry):
            try:
                found.append(RunFolder.open(entry))
            except StoreError:
                continue
    found.sort(key=lambda r: (r.created_ts, r.run_id))
    return found


def latest_run(run_root: Path) -> RunFolder | None:
    """The newest run under ``run_root``, or None."""
    runs = list_runs(run_root)
    return runs[-1] if runs else None


WORK = "work"
KEY_FOLDER_CHARS = 12  # hex characters of a cache key's digest naming its work folder


def key_folder(key: str) -> str:
    """The name of a cache key's own work folder: a short digest of the key."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=KEY_FOLDER_CHARS // 2).hexdigest()


def is_key_folder(name: str) -> bool:
    return len(name) == KEY_FOLDER_CHARS and all(c in "0123456789abcdef" for c in name)


def work_dir(run_root: Path, stage: str, safe: str, key: str | None = None) -> Path:
    """A subject's work folder for a stage (not created here).

    With ``key`` (as the engine uses it): ``work/<stage>/<subject>/<key folder>``, one per
    cache key, the same in every run of that key: a resumed run finds the files the killed
    one left, and a result never names the files of another version of itself (change a
    param and back: the old version's folder is still there, untouched). Without ``key``:
    the subject's folder holding them.
    """
    folder = Path(run_root) / WORK / stage / safe
    return folder if key is None else folder / key_folder(key)
