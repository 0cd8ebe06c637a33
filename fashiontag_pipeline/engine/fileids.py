"""The ``PRAGMA application_id`` of fashiontag's own SQLite files, where each kind can see it.

A file of one kind given where another is expected (a ``--reuse`` result store as ``--state``,
or as ``--sink sqlite --out``) is told by its id before anything is written to it. The id lives
here, apart from the result store's code, so that the state package and the sinks read it
without importing the store (an import-linter contract keeps the state from the store).
"""

from __future__ import annotations

__all__ = ["RESULT_STORE_ID"]

#: A ``--reuse`` result store ("FTRS").
RESULT_STORE_ID = 0x46545253
