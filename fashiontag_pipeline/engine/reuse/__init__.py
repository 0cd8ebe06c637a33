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

import importlib

#: typing.TYPE_CHECKING: the names below load on first use (PEP 562), so that a run without
#: ``--reuse`` (which imports :mod:`.durations` for its flags, and :mod:`.setup` to check the
#: state) loads neither the store nor the hook.
TYPE_CHECKING = False
if TYPE_CHECKING:
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

#: Each public name's module.
_HOMES = {
    "DEFAULT_MAX_AGE": "store",
    "Fingerprinter": "fingerprint",
    "IntakePlan": "hook",
    "LastRun": "store",
    "ResultStore": "store",
    "ResultStoreAPI": "store",
    "ReuseHook": "hook",
    "StoreStats": "store",
    "StoredResult": "store",
    "format_duration": "durations",
    "open_reuse": "setup",
    "open_store": "store",
    "parse_duration": "durations",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


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
