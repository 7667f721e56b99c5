"""Before a run plans: what earlier runs' journals hold that the store does not, stored again or refused.

A killed run's journal (:mod:`habitrun.store.journal`) may hold outcomes it
received and never committed, and may say that records it committed are no
longer in the store (:mod:`habitrun.store.recovery`). The run about to start
holds the store's lock, so no other writer is adding to it: it stores the
first (their subjects then need not run again) and the lost records the
journal holds, before planning, and says what it did. Committed records the
journal cannot restore (their result was too large to journal) stop the run
with exit 2 and the count, unless the user accepted the loss
(``--accept-loss``): the store must not silently turn work that was reported
done into work that runs again.

The journals examined here are settled (deleted) once the run closes the
store cleanly; until then they are examined again by the next command.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from habitrun.errors import LostRecordsError, StoreError
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.recovery import Recovery, examine, unsettled

log = logging.getLogger(__name__)


def recover(store: CheckpointStore, run_root: Path, *, accept_loss: bool) -> tuple[Recovery, list[str]]:
    """Compare the store with every unsettled journal, store what they hold again; the warnings
    to show. Raises LostRecordsError when committed records are lost for good and not accepted."""
    recovery = examine(store, unsettled(run_root, store.directory), store.directory)
    bad = recovery.unrestorable
    if bad and not accept_loss:
        raise LostRecordsError(
            "; ".join(recovery.losses()) + ". Nothing was run. To go on, and run their subjects again, "
            "accept the loss with --accept-loss:")
    warnings = recovery.restored_notes()
    if bad:
        warnings.append(f"{len(bad)} committed record(s) lost for good were accepted (--accept-loss): "
                        "their subjects run again")
    records, trace = recovery.records(), recovery.trace()
    log.debug("recovery: %d unsettled journal(s); %d record(s) to store again, %d lost for good", len(recovery.journals),
              len(records), len(bad))
    if records:
        try:
            store.put(records, trace)
        except (OSError, sqlite3.Error, StoreError) as exc:
            raise StoreError(f"cannot store the {len(records)} record(s) kept in earlier runs' journals into "
                             f"{store.directory}: {exc}; nothing was run") from None
    return recovery, warnings
