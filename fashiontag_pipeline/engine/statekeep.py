"""The state's lock file kept by a long-lived engine (``async with Engine(...)`` for weeks).

Touched only when the engine opened its state, a library user's ``STATE.lock`` aged with the
engine's uptime: a retention job (``find /data -mtime +7 -delete``) took it, or a cleanup
removed it by name, and a second run on the same state started beside the engine (rows sent,
and billed, twice). :func:`keep_state` keeps it every :data:`KEEP_INTERVAL` as the daemon's
health loop does (:meth:`~.state.sqlite.StateDB.keep_lock`: touched once an hour old, made
again and locked once removed); the daemon keeps it from that loop itself, so its engine does
not (``keep_state=False``: two keepers of one lock on two threads would race). Another run
holding the lock made again, or the state file removed under the engine, stops the engine
(the error raised from its block); a folder or mount that cannot be written is said once.
"""

from __future__ import annotations

import logging

import anyio

from .state import StateStore

__all__ = ["KEEP_INTERVAL", "keep_state"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: Seconds between two looks (the lock is touched once an hour old; a look costs two stats).
KEEP_INTERVAL = 60.0


async def keep_state(db: StateStore) -> None:
    """Keep ``db``'s lock file (a SQLite state's; nothing to keep for another store) until
    cancelled."""
    keep = getattr(db, "keep_lock", None)
    if keep is None:
        return
    said: str | None = None
    while True:
        await anyio.sleep(KEEP_INTERVAL)
        try:
            await anyio.to_thread.run_sync(keep)
        except OSError as err:  # (the folder removed, a read-only mount: looked at again)
            trouble = f"{getattr(db, 'where', 'the state')}: {err.strerror or err}"
            if trouble != said:
                logger.warning("cannot keep the state's lock file (tried again): %s", trouble)
            said = trouble
        else:
            said = None
