"""Incremental runs (``--reuse``): the result store and how a run uses it.

* :mod:`.fingerprint`: what makes two requests the same question (URL, detection after
  defaults, language, context fields other than ``id``).
* :mod:`.store`: the result store file (SQLite, WAL, versioned): batched lookups and inserts,
  ``stats`` and ``prune``; :mod:`.pgstore` the same store in PostgreSQL (``--reuse
  postgresql://...``), shared by daemons on several machines.
* :mod:`.hook`: the three calls the engine makes (plan a batch, settle it in the intake
  transaction, store a committed page's results).
* :mod:`.setup`: opening it for a run (a missing store is created, with a warning).
* :mod:`.durations`: ``30d``-style durations of ``--reuse-max-age`` and ``prune --older-than``.

The state file's side (rows sent and their fingerprints, where reuse began) is in
:mod:`fashiontag_pipeline.engine.state.reuse_rows`.
"""

from __future__ import annotations

from .durations import format_duration, parse_duration
from .fingerprint import Fingerprinter
from .hook import IntakePlan, ReuseHook
from .setup import open_reuse
from .store import (
    DEFAULT_MAX_AGE,
    LastRun,
    ResultStore,
    ResultStoreAPI,
    StoredResult,
    StoreStats,
    open_store,
)

__all__ = [
    "DEFAULT_MAX_AGE",
    "Fingerprinter",
    "IntakePlan",
    "LastRun",
    "ResultStore",
    "ResultStoreAPI",
    "ReuseHook",
    "StoreStats",
    "StoredResult",
    "format_duration",
    "open_reuse",
    "open_store",
    "parse_duration",
]
