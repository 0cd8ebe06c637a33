"""The run's state: one SQLite file (WAL) owned by this package, written through the journal.

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

from .journal import JobReject, Journal
from .schema import BODY_SQL, COUNTERS, JOB_COUNTERS, POS_SHIFT, position, split_position
from .store import JobRow, Reconciliation, RunState, StateDB

__all__ = [
    "BODY_SQL",
    "COUNTERS",
    "JOB_COUNTERS",
    "POS_SHIFT",
    "JobReject",
    "JobRow",
    "Journal",
    "Reconciliation",
    "RunState",
    "StateDB",
    "position",
    "split_position",
]
