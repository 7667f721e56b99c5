"""A nanny's restart cancelled by the cluster's close logs an ERROR with a traceback (seen on a loaded
machine after a subject killed its worker): habitrun's filter drops that one record and no other."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed")

from habitrun.engine.dask_backend import cluster  # noqa: E402


def record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord("distributed.nanny", logging.ERROR, __file__, 1, "", (), info)


@pytest.mark.timeout(30)
def test_the_nanny_logger_drops_cancelled_restarts_only():
    nanny = logging.getLogger("distributed.nanny")
    assert any(isinstance(f, logging.Filter) and not f.filter(record(asyncio.CancelledError()))
               for f in nanny.filters), "the filter is installed on distributed.nanny"
    seen: list[logging.LogRecord] = []
    catcher = logging.Handler(logging.ERROR)
    catcher.emit = seen.append  # type: ignore[method-assign]
    nanny.addHandler(catcher)
    try:
        for exc in (asyncio.CancelledError(), RuntimeError("a real fault")):
            try:
                raise exc
            except BaseException:
                nanny.exception("restart")
    finally:
        nanny.removeHandler(catcher)
    assert [r.exc_info[0] for r in seen if r.exc_info] == [RuntimeError]
    assert cluster.DaskClusterError  # the module that installs it is the backend's cluster module
