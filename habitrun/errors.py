"""habitrun's own error classes.

Every error a user can cause carries a message they can act on and the exit
code the CLI returns for it, so the CLI never shows a traceback for bad input.
This module sits below every layer: each layer may import it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED_SUBJECTS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class HabitrunError(Exception):
    """Base of every error habitrun raises on purpose."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class RecipeError(HabitrunError):
    """A recipe, manifest, override or operator path is wrong (exit 2).

    ``problems`` holds every problem found, each already formatted as
    ``file:line:col: field.path: message``, so they are reported together.
    """

    def __init__(self, problems: list[str] | str) -> None:
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class StoreError(HabitrunError):
    """The checkpoint store or run folder cannot be used as it is (exit 2)."""


class StoreWriteError(StoreError):
    """The store or run folder refused a write mid-run (a full disk): the run stopped (exit 2).

    The message ends with "continue with:"; :meth:`with_resume` completes it with the
    command as the user would type it, which only the CLI knows.
    """

    def __init__(self, message: str, *, folder: object = None) -> None:
        super().__init__(message)
        self.folder = folder

    def with_resume(self, command: str) -> StoreWriteError:
        return StoreWriteError(f"{self.message} {command}", folder=self.folder)


class PublishError(HabitrunError):
    """A stage's published folder could not be written; the stored results are untouched (a warning)."""


class LostRecordsError(StoreError):
    """Records a run committed are gone from the store and its journal cannot restore them (exit 2).

    The message ends with the way on ("... with --accept-loss:"); :meth:`with_command`
    completes it with the command as the user would type it, which only the CLI knows.
    """

    def with_command(self, command: str) -> LostRecordsError:
        return LostRecordsError(f"{self.message} {command}")


class LockHeldError(StoreError):
    """Another live run holds the store's lock (exit 2)."""


class WorkerStartError(HabitrunError):
    """No worker process could be started at all (exit 2): a run-level problem, no subject's failure."""


class OperatorBindError(HabitrunError):
    """A stage's operator could not be made ready in a worker (a class whose constructor raised, exit 2).

    The stage's error, not its subjects': every subject would fail the same way, so the
    run stops at the first one, its subjects are not run and none is recorded as failed
    (a missing dependency or a bad parameter is fixed, then the run resumed).
    """

    @classmethod
    def for_stage(cls, stage: str, operator: str, error: str) -> OperatorBindError:
        return cls(f"stage {stage!r}: cannot construct its operator {operator}: {error}; "
                   "the run stopped, its subjects were not run and none was recorded as failed")


class ToolError(HabitrunError):
    """A command-line tool a subject ran failed: it exited non-zero or was killed, or left out an
    output it declared. The subject's failure (its message names the exit code or signal and the
    last lines of the tool's stderr), not the run's."""

    exit_code = EXIT_FAILED_SUBJECTS


class LaunchError(HabitrunError):
    """A rank group could not be started or failed past its restarts."""

    exit_code = EXIT_FAILED_SUBJECTS


class UsageError(HabitrunError):
    """A command was asked for something that is not there (an unknown stage or run; exit 2)."""


class MissingExtra(HabitrunError):
    """An optional dependency is not installed; the message names the extra to install (exit 2)."""

    def __init__(self, what: str, package: str, extra: str) -> None:
        super().__init__(f"{what} needs {package}, which is not installed: "
                         f"pip install 'habitrun[{extra}]' (or pip install {package})")


class UnsupportedSystemError(HabitrunError):
    """The system lacks what habitrun needs to stay safe (pidfds: Linux 5.3+); exit 2, before starting."""


class SlurmError(HabitrunError):
    """SLURM refused or failed a request (sbatch, squeue, scancel, scontrol), or is not there (exit 2)."""


class BatchError(SlurmError):
    """A batch folder of SLURM array tasks (its spec, a chunk) is missing or unreadable (exit 2)."""
