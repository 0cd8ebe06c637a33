"""The run's state: one SQLite file (WAL), or a schema of a PostgreSQL database
(:mod:`.pgstore`), owned by this package and written through the journal.

* :mod:`.schema`: the tables, positions and watermarks;
* :mod:`.store`: the run's identity (manifest fingerprints: resume, nothing to do,
  new run or refuse), watermarks, dedupe, the queries a resume needs, and the end-of-run
  reconciliation;
* :mod:`.changes`: every state change a stage makes, as a named value;
* :mod:`.journal`: the one thread that applies changes and writes the sinks, one transaction
  per commit.

Nothing outside this package sees the SQLite connection or writes SQL.
"""

from __future__ import annotations

from pathlib import Path

from ..._postgres import is_postgres_url
from .journal import JobReject, Journal
from .schema import (
    BODY_SQL,
    COUNTERS,
    JOB_COUNTERS,
    POS_SHIFT,
    STATE_FILE_BASE,
    STATE_FILE_VERSION,
    position,
    split_position,
)
from .sqlite import StateDB
from .store import JobRow, KeyedColumns, Reconciliation, RunState, StateStore


def open_state(location: str | Path) -> StateStore:
    """The state at ``location``: a ``postgresql://`` URL (``#name`` names the state in the
    database), or a SQLite file."""
    if isinstance(location, str) and is_postgres_url(location):
        from .pgstore import PostgresStateDB

        return PostgresStateDB(location)
    return StateDB(Path(location))


__all__ = [
    "BODY_SQL",
    "COUNTERS",
    "JOB_COUNTERS",
    "POS_SHIFT",
    "STATE_FILE_BASE",
    "STATE_FILE_VERSION",
    "JobReject",
    "JobRow",
    "Journal",
    "KeyedColumns",
    "Reconciliation",
    "RunState",
    "StateDB",
    "StateStore",
    "open_state",
    "position",
    "split_position",
]
