"""Opening ``--reuse`` for a run: the store, the hook, and the state's side of it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ... import _exceptions as exc
from ..state import reuse_rows

if TYPE_CHECKING:
    from ..config import EngineConfig
    from .hook import ReuseHook
    from .store import ResultStoreAPI

__all__ = ["open_reuse"]

logger = logging.getLogger("fashiontag_pipeline.engine")


def open_reuse(
    engine: EngineConfig,
    *,
    language: str,
    db: Any,
    resumed: bool,
    state: str,
    one_run: bool = False,
) -> ReuseHook | None:
    """The run's :class:`ReuseHook` (None without ``engine.reuse``), its state side ready.

    A missing store is created (a warning says so: every row is tagged this time). An
    unfinished run (a job still open) that used a store is resumed only with a store: without
    one, the rows it answered from the store could not be told from rows to send
    (:class:`~fashiontag_pipeline.StateConflictError`, nothing touched). ``resumed``: the state
    holds earlier work (a long-lived engine's state always may); otherwise the state's pending
    rows of an earlier run are dropped. ``state`` names the state in messages. ``one_run``: the
    state holds one run (``run``), whose figures add up over its attempts."""
    if engine.reuse is None:
        if resumed and reuse_rows.reused_before(db):
            raise exc.StateConflictError(
                f"{state} holds unfinished work started with --reuse: resume "
                "it with --reuse (the same store), or start over (run: --restart)"
            )
        return None
    # Only a run with --reuse loads the store and the hook (a plain run's start-up spares them).
    from .fingerprint import Fingerprinter
    from .hook import ReuseHook
    from .store import open_store

    store = open_store(engine.reuse)
    try:
        said_created(store, logger)
        hook = ReuseHook(
            store,
            Fingerprinter(language=language, default_detection=engine.default_detection),
            max_age=engine.reuse_max_age_seconds,
        )
        hook.prepare(db, resumed=resumed, one_run=one_run)
    except BaseException:
        store.close()
        raise
    return hook


def said_created(store: ResultStoreAPI, log: logging.Logger) -> None:
    """Warn that the store was made by this run (every row tagged this time): a missing file,
    or an empty one (truncated, ``touch``ed, a copy that failed: said so, not "did not
    exist", which sends the user after a wrong path)."""
    if not store.created:
        return
    what = "was an empty file" if getattr(store, "was_empty", False) else "did not exist"
    log.warning(
        "result store %s %s: created it (every row is tagged this time, and its successful"
        " results are stored for the next run)",
        store.path,
        what,
    )
