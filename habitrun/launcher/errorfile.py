"""torchrun's error files: a rank writes its exception here, the launcher reads the root cause.

The format is torch.distributed.elastic's, so a script decorated with torch's own
``@record`` and one decorated with ours produce files either launcher can read::

    {"message": {"message": "ValueError: bad", "extraInfo":
                 {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ErrorInfo:
    """What a rank wrote about its failure."""

    message: str
    traceback: str | None
    timestamp: int | None


_OWN_FILES = (__file__.removesuffix("c"), __file__.replace("errorfile.py", "_child.py"))


def format_user_traceback(exc: BaseException) -> str:
    """The traceback without the launcher's own wrapper frames at its top."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def write_error_file(exc: BaseException, path: str | None = None) -> str | None:
    """Write ``exc`` (with the traceback being handled) to ``path`` or $TORCHELASTIC_ERROR_FILE.

    Returns the path written, or None when no error file is configured (the
    traceback then only reaches stderr, as under torchrun).
    """
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path:
        return None
    callstack = format_user_traceback(exc)
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
    return path


def read_error_file(path: str | os.PathLike[str] | None) -> ErrorInfo | None:
    """The rank's recorded error, or None when it wrote none (or an unreadable one)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):  # torch's flat format: the timestamp sits at the top level
        return ErrorInfo(message, None, _timestamp(data.get("timestamp")))
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo") or {}
    return ErrorInfo(str(message.get("message", "")), extra.get("py_callstack"), _timestamp(extra.get("timestamp")))


def _timestamp(stamp: Any) -> int | None:
    """Seconds since the epoch from an int or a numeric string (torch writes both); else None."""
    if isinstance(stamp, bool):
        return None
    try:
        return int(stamp) if isinstance(stamp, (int, str)) else None
    except ValueError:
        return None


def record(fn: F) -> F:
    """Decorate a rank's main function so an exception lands in its error file, then propagates.

    Like torch's ``record``: faulthandler is enabled (a segfault prints the
    Python stacks to stderr) and ``SystemExit(0)`` returns None. Unlike it, a
    ``SystemExit("message")`` is recorded too, so a script that exits with an
    explanation shows that explanation as the group's root cause.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not faulthandler.is_enabled():
            faulthandler.enable(file=sys.__stderr__ or sys.stderr, all_threads=True)
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            if isinstance(exc.code, str):
                write_error_file(exc)
            raise
        except Exception as exc:
            write_error_file(exc)
            raise

    return wrapper  # type: ignore[return-value]
