"""Pause Python's cycle collector around bulk loading.

Reading a 100,000-row manifest or planning 100,000 subjects builds hundreds
of thousands of small objects and no reference cycles. The collector still
walks every live object each time its thresholds trip, and with a large
heap that costs more than the work itself (100,000 CSV rows: 0.53 s paused,
0.7-1.0 s not). Nothing is leaked by pausing: reference counting frees
everything as usual, and the collector resumes afterwards.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cycle collector for the block (nested use is fine)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
