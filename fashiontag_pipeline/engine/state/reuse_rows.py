"""The state's part of ``--reuse``: fingerprints of sent rows, and where reuse began (the SQL
SQLite and PostgreSQL share).

::

    reuse_pending(id, fp)      every row sent while --reuse is on, with its request's
                               fingerprint, from its intake until the results page holding it
                               is committed (then its result, if a success, is in the result
                               store and the row leaves this table). Rows that end as rejects
                               stay until the next run of the state starts (it is emptied), or,
                               in a long-lived engine (a daemon), until their job completes.
    meta 'reuse_figures'       ``run`` only: what the run did with the store so far (started
                               at, looked up, reused, stored), written in the transactions
                               that did it, so a resumed run records the figures of all its
                               attempts (``reuse stats``), not its last one's
    meta 'reuse_from.JOB'      per job, its validated watermark (V) when it first used
                               --reuse: every row of the job at a position above it was
                               looked up in the store

Why the state needs them. A row answered from the store is written (``"reused": true``) in the
intake transaction that moves V over it, and is never chunked, so the chunked watermark (W)
does not pass it. A resume replays a job's rows in (W, V]: those above its ``reuse_from`` that
are not in ``reuse_pending`` were answered from the store (their line is written), the others
were sent and go again. Keeping the fingerprint until the page is committed is what lets the
page's results be stored without re-reading the chunk bodies (one indexed ``IN`` query per
page); it costs one small insert per sent row, never one per reused row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .changes import Change

__all__ = [
    "clear_pending",
    "create",
    "disown_pending",
    "figures",
    "figures_now",
    "pending_done",
    "pending_fingerprints",
    "pending_rows",
    "question",
    "reuse_from",
    "reuse_started",
    "reused_before",
    "set_question",
]

_IN_BATCH = 400


def create(db: Any) -> None:
    """Create the table (a state file of an earlier version has none; a PostgreSQL state
    creates it with its tables) and the counter."""
    if isinstance(db, sqlite3.Connection):
        db.execute(
            "CREATE TABLE IF NOT EXISTS reuse_pending (id TEXT PRIMARY KEY, fp BLOB NOT NULL)"
            " WITHOUT ROWID"
        )
    db.execute("INSERT INTO meta VALUES ('n_reused', '0') ON CONFLICT DO NOTHING")


def clear_pending(db: Any) -> None:
    """A new run of the state: rows of an earlier run are not pending, nor its figures."""
    db.execute("DELETE FROM reuse_pending")
    db.execute("DELETE FROM meta WHERE key='reuse_figures'")


def figures(db: Any) -> tuple[float, int, int, int] | None:
    """(started at, looked up, reused, stored) of the run's earlier attempts, if recorded."""
    row = db.execute("SELECT value FROM meta WHERE key='reuse_figures'").fetchone()
    if not row:
        return None
    started, looked_up, reused, stored = str(row[0]).split()
    return float(started), int(looked_up), int(reused), int(stored)


def figures_now(started: float, looked_up: int, reused: int, stored: int) -> Change:
    """The run's figures so far (see ``reuse_figures``)."""
    return (
        "INSERT INTO meta VALUES ('reuse_figures', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (f"{started!r} {looked_up} {reused} {stored}",),
    )


def question(db: Any) -> str | None:
    """The question (language, default detection) the pending rows were fingerprinted
    under, None when no start recorded one."""
    row = db.execute("SELECT value FROM meta WHERE key='reuse_question'").fetchone()
    return str(row[0]) if row else None


def set_question(db: Any, text: str) -> None:
    db.execute(
        "INSERT INTO meta VALUES ('reuse_question', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (text,),
    )


def disown_pending(db: Any) -> int:
    """Pending rows keep their place (a resume must still tell them from rows answered from
    the store) but lose their fingerprint: their results are not stored. How many."""
    return int(db.execute("UPDATE reuse_pending SET fp = ? WHERE fp != ?", (b"", b"")).rowcount)


def reuse_from(db: Any, job: int) -> int | None:
    """The job's validated watermark when it first used ``--reuse`` (None: it never did)."""
    row = db.execute("SELECT value FROM meta WHERE key=?", (f"reuse_from.{job}",)).fetchone()
    return int(row[0]) if row else None


def reused_before(db: Any) -> bool:
    """Whether a job still open in the state used ``--reuse``."""
    row = db.execute(
        "SELECT 1 FROM meta m JOIN jobs j ON m.key = 'reuse_from.' || j.job"
        " WHERE j.state = 'open' LIMIT 1"
    )
    return row.fetchone() is not None


def reuse_started(job: int, watermark: int) -> Change:
    """The job uses ``--reuse`` for rows above ``watermark`` (kept if already recorded)."""
    return (
        "INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING",
        (f"reuse_from.{job}", str(watermark)),
    )


def pending_rows(rows: Sequence[tuple[str, bytes]]) -> list[Change]:
    """Rows about to be sent, with their fingerprints (a few multi-row inserts)."""
    out: list[Change] = []
    for start in range(0, len(rows), _IN_BATCH):
        part = rows[start : start + _IN_BATCH]
        marks = ",".join("(?, ?)" for _ in part)
        params = tuple(value for row in part for value in row)
        out.append(
            (
                f"INSERT INTO reuse_pending VALUES {marks}"
                " ON CONFLICT (id) DO UPDATE SET fp = excluded.fp",
                params,
            )
        )
    return out


def pending_fingerprints(db: Any, ids: Sequence[str]) -> dict[str, bytes]:
    """The fingerprints of those of ``ids`` that are pending."""
    found: dict[str, bytes] = {}
    for start in range(0, len(ids), _IN_BATCH):
        part = ids[start : start + _IN_BATCH]
        marks = ",".join("?" * len(part))
        found.update(
            db.execute(f"SELECT id, fp FROM reuse_pending WHERE id IN ({marks})", tuple(part))
        )
    return found


def pending_done(ids: Sequence[str]) -> list[Change]:
    """The rows' results are committed: they are no longer pending."""
    out: list[Change] = []
    for start in range(0, len(ids), _IN_BATCH):
        part = tuple(ids[start : start + _IN_BATCH])
        marks = ",".join("?" * len(part))
        out.append((f"DELETE FROM reuse_pending WHERE id IN ({marks})", part))
    return out
