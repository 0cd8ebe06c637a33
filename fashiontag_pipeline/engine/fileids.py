"""The ``PRAGMA application_id`` of fashiontag's own SQLite files, where each kind can see it.

A file of one kind given where another is expected (a ``--reuse`` result store as ``--state``,
or as ``--sink sqlite --out``) is told by its id before anything is written to it. The id lives
here, apart from the result store's code, so that the state package and the sinks read it
without importing the store (an import-linter contract keeps the state from the store).
:func:`wal_begun` is theirs too: a WAL never left empty under a process that holds the file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

__all__ = ["RESULT_STORE_ID", "wal_begun"]

#: A ``--reuse`` result store ("FTRS").
RESULT_STORE_ID = 0x46545253


def wal_begun(db: sqlite3.Connection) -> None:
    """Give the ``-wal`` of ``db`` (WAL mode, just opened, no transaction open) a first frame
    when it is empty, as SQLite leaves it from the open to the first commit (and after a
    ``wal_checkpoint(TRUNCATE)``). A daemon restarted idle commits nothing for days: a nightly
    ``find /data -empty -delete`` took its state's empty ``-wal``, its commits went on into the
    removed file, and a kill -9 lost them all (the manifests done meanwhile tagged, and billed,
    again). The frame is ``user_version`` written as it is, in one transaction (a few KiB);
    best effort: a file that cannot be written now (full, read-only) opens as before."""
    (_, _, name) = db.execute("PRAGMA database_list").fetchone()
    try:
        if not name or os.stat(f"{name}-wal").st_size > 0:
            return
    except FileNotFoundError:
        pass  # (made by the commit)
    try:
        db.execute("BEGIN IMMEDIATE")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        db.execute(f"PRAGMA user_version={int(version)}")
        db.execute("COMMIT")
    except sqlite3.Error:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
