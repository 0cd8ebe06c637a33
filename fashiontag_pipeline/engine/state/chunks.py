"""The chunks and tasks of the state: writing a chunk ahead of its request, and what a resume
reads back.

:class:`ChunkTables` is a part of :class:`~.store.StateStore` (same connection, same thread,
same SQL dialect): a chunk of rows is written ahead with its request's body before the
request is sent (so its fate is never unknown after a crash), split when the service refuses
it whole, and read back by the resume (the tasks with work left, the chunks of unknown fate,
the ids each task may hold).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..._clock import NO_DATE
from .changes import SINGLE_FAILS, SINGLE_TAGGED
from .jobtables import JobTables
from .schema import BODY_SQL

__all__ = ["ChunkTables"]


class ChunkTables(JobTables):
    """The chunk and task half of the state store (mixed into :class:`~.store.StateStore`)."""

    #: Whether ``chunk_bodies`` keeps each chunk's ids apart (``ids``), so that the ids written
    #: to a task are read without its bodies (:meth:`sent_chunks`). The PostgreSQL state's
    #: tables are versioned and have no such column: its bodies are read instead.
    chunk_ids: bool = True

    #: Whether :meth:`wall` is a clock every process of the state reads alike (the database's),
    #: not this machine's wall clock.
    shared_clock: bool = False

    def wall(self) -> float:
        """Now in the state's clock (Unix seconds), the one ``chunks.written_at`` is written and
        judged in: this machine's wall clock for a state file. A backend that other machines
        share gives a clock they share (hosts' clocks differ: a time one writes, another
        judging it by its own clock would read it off by as much). Thread-safe."""
        return time.time()

    def split_chunk(
        self, chunk_id: int, parts: Sequence[tuple[int, int, bytes, bytes]]
    ) -> list[int]:
        """Replace a chunk of pending rows by ``parts`` ((n, last position, body, ids) each),
        written ahead as new pending chunks in one transaction with the old one resolved, so
        that every row is in exactly one chunk at every commit. Returns the new chunks' ids.
        (A write refused whole, nothing applied, is split: not a send, not counted resent.)"""
        db = self.db
        new: list[int] = []
        with self.transaction():
            for n, last_pos, body, ids in parts:
                (new_id,) = db.execute(
                    "INSERT INTO chunks (state, n, last_pos) VALUES ('pending', ?, ?)"
                    " RETURNING chunk_id",
                    (n, last_pos),
                ).fetchone()
                self._insert_body(new_id, body, ids)
                new.append(int(new_id))
            self._resolve(chunk_id)
        return new

    def insert_chunk(
        self,
        n: int,
        last_pos: int,
        body: bytes,
        replaces: int | None,
        resent: int,
        marks: Sequence[tuple[int, int]] = (),
        *,
        token: str | None = None,
        task_id: str | None = None,
        ids: bytes | None = None,
        service: float | None = None,
    ) -> int:
        """Write a chunk ahead of its request; returns its id. One transaction: the chunk
        (with the ``token`` of the task its request creates, or the ``task_id`` it is appended
        to; ``ids``, the JSON list of the ids it sends, is kept beside its body; its time in
        the state's clock and in the service's: ``service`` is the service's clock less our
        monotonic clock, :meth:`~..._clock.ServerClock.ahead_of_monotonic`), and either
        the chunked watermarks (W) of the jobs whose new rows it carries (``marks``: (job,
        last position)), or, for rows sent again, the ``resent`` counter and the chunk
        ``replaces`` whose unsettled rows it carries (resolved, so they can never be sent
        twice)."""
        db = self.db
        with self.transaction():
            # The body goes to its own table: the chunk's row is updated several times (token,
            # task, state) and SQLite rewrites a whole row, overflow pages included, on update.
            # (written_at: a create may be on its way from now on, see resume_chunks.)
            at = NO_DATE if service is None else time.monotonic() + service
            (chunk_id,) = db.execute(
                "INSERT INTO chunks (state, n, last_pos, token, task_id, written_at, service_at)"
                " VALUES ('pending', ?, ?, ?, ?, ?, ?) RETURNING chunk_id",
                (n, last_pos, token, task_id, self.wall(), at),
            ).fetchone()
            self._insert_body(chunk_id, body, ids)
            if replaces is not None:
                self._resolve(replaces)
            if resent:
                db.execute(
                    "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + ? AS TEXT)"
                    " WHERE key = 'n_resent'",
                    (resent,),
                )
            else:
                db.executemany(
                    "UPDATE jobs SET chunked=? WHERE job=? AND chunked < ?",
                    [(pos, job, pos) for job, pos in marks],
                )
        return int(chunk_id)

    def _insert_body(self, chunk_id: int, body: bytes, ids: bytes | None) -> None:
        """A chunk's body (and its ids, where the tables keep them apart) beside its row."""
        if self.chunk_ids:
            self.db.execute(
                "INSERT INTO chunk_bodies (chunk_id, body, ids) VALUES (?, ?, ?)",
                (chunk_id, body, ids),
            )
        else:
            self.db.execute(
                "INSERT INTO chunk_bodies (chunk_id, body) VALUES (?, ?)", (chunk_id, body)
            )

    def _resolve(self, chunk_id: int) -> None:
        """A chunk whose rows went to other chunks: resolved, its body gone."""
        self.db.execute(
            "UPDATE chunks SET state='resolved', body=NULL WHERE chunk_id=?", (chunk_id,)
        )
        self.db.execute("DELETE FROM chunk_bodies WHERE chunk_id=?", (chunk_id,))

    def task_known(self, task_id: str) -> bool:
        """Whether the state records a task of this id (the service gave it to this run)."""
        return (
            self.db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            is not None
        )

    def task_purged(self, task_id: str, now: float) -> bool:
        """Whether the recorded task of this id is finished with (drained, or its results
        expired unread), no chunk is left on it, and its results expired by ``now`` (the
        service's clock, epoch seconds): the service may have purged it and given its id to
        a new task."""
        return (
            self.db.execute(
                "SELECT 1 FROM tasks t WHERE t.task_id = ? AND t.state IN ('drained', 'expired')"
                " AND t.results_expire_at IS NOT NULL AND t.results_expire_at <= ?"
                " AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.task_id = t.task_id)",
                (task_id, now),
            ).fetchone()
            is not None
        )

    def resume_tasks(self) -> list[tuple[Any, ...]]:
        """Tasks an interrupted run still has work on: (task_id, seq, token, state,
        expires_at, results_expire_at, total, next_offset); lost tasks whose chunks were not
        all settled are among them."""
        return list(
            self.db.execute(
                "SELECT task_id, seq, token, state, expires_at, results_expire_at, total,"
                " next_offset FROM tasks WHERE state NOT IN ('drained', 'expired', 'lost')"
                " OR (state = 'lost' AND EXISTS (SELECT 1 FROM chunks c"
                " WHERE c.task_id = tasks.task_id"
                " AND c.state IN ('accepted', 'orphan', 'pending')))"
            )
        )

    def task_row(self, task_id: str) -> tuple[Any, ...] | None:
        """One task as :meth:`resume_tasks` gives it (any state)."""
        row = self.db.execute(
            "SELECT task_id, seq, token, state, expires_at, results_expire_at, total,"
            " next_offset FROM tasks WHERE task_id=?",
            (task_id,),
        ).fetchone()
        return tuple(row) if row is not None else None

    def creates_sent_elsewhere(self) -> None:
        """The creates of unknown fate went to a service the run has left (it is gone): none
        can be listed by the one it goes on with, so a resume looks for them once
        (``written_at`` 0), not for the request deadline after they were sent."""
        with self.transaction():
            self.db.execute(
                "UPDATE chunks SET written_at = 0, service_at = 0"
                " WHERE state = 'pending' AND task_id IS NULL AND token IS NOT NULL"
            )

    def resume_chunks(self) -> list[tuple[Any, ...]]:
        """Chunks of unknown fate: (chunk_id, state, task_id, token, body, written_at,
        service_at). ``written_at``: when the chunk was written ahead, or its create last sent,
        in Unix seconds (None: unknown, a chunk of an earlier version): a create may have been
        on its way since, and applied as late as a request may go unanswered after it;
        ``service_at``: the same moment in the service's clock (None: a chunk of an earlier
        version; -1: no ``Date`` seen by then)."""
        return list(
            self.db.execute(
                f"SELECT chunk_id, state, task_id, token, {BODY_SQL}, written_at, service_at"
                " FROM chunks"
                " WHERE state IN ('pending', 'orphan') ORDER BY chunk_id"
            )
        )

    def chunk_bodies(self, task_id: str, states: Sequence[str]) -> list[tuple[int, bytes]]:
        """(chunk_id, body) of the task's chunks in ``states`` that still have a body."""
        marks = ",".join("?" * len(states))
        return list(
            self.db.execute(
                f"SELECT chunk_id, {BODY_SQL} FROM chunks"
                f" WHERE task_id=? AND state IN ({marks}) AND {BODY_SQL} IS NOT NULL"
                " ORDER BY chunk_id",
                (task_id, *states),
            )
        )

    def orphan_rows(self, chunk_ids: Sequence[int]) -> list[tuple[int, int | None, bytes]]:
        """(chunk_id, rows counted as submitted (``n_ok``), body) of the orphan chunks among
        ``chunk_ids`` that still have a body (:mod:`~..returned`)."""
        marks = ",".join("?" * len(chunk_ids))
        return [
            (int(cid), None if n_ok is None else int(n_ok), bytes(body))
            for cid, n_ok, body in self.db.execute(
                f"SELECT chunk_id, n_ok, {BODY_SQL} FROM chunks WHERE chunk_id IN ({marks})"
                f" AND state='orphan' AND {BODY_SQL} IS NOT NULL",
                tuple(chunk_ids),
            )
        ]

    def sent_chunks(self, task_id: str) -> list[tuple[bytes | None, bytes | None]] | None:
        """Every chunk written to the task whose rows may still come from it (the ids it can
        hold): (the JSON list of its ids, None) where they were kept apart, else (None, its
        body); None when such a chunk has neither left. A resolved chunk is left out: each of
        its rows has its outcome, or went to another chunk (a lost task's rows sent again), so
        a result for it here is no line (its body is gone too, ``changes.chunk_resolved``).

        The ids alone are ~16 bytes a row against ~120 for a body, and decode without
        skipping over every request (~0.2 us a row less when a task's draining starts)."""
        ids = "b.ids" if self.chunk_ids else "NULL"
        rows = self.db.execute(
            f"SELECT {ids}, CASE WHEN {ids} IS NULL THEN COALESCE(b.body, c.body) END"
            " FROM chunks c LEFT JOIN chunk_bodies b ON b.chunk_id = c.chunk_id"
            " WHERE c.task_id=? AND c.state != 'resolved'",
            (task_id,),
        ).fetchall()
        if any(i is None and body is None for i, body in rows):
            return None
        return [(bytes(i), None) if i is not None else (None, bytes(body)) for i, body in rows]

    def task_chunk_ids(self, task_id: str) -> list[int]:
        """The ids of every chunk written to the task, whatever its state."""
        rows = self.db.execute("SELECT chunk_id FROM chunks WHERE task_id=?", (task_id,))
        return [int(chunk_id) for (chunk_id,) in rows]

    def task_chunks(self, task_id: str) -> list[tuple[int, str]]:
        """(chunk id, state) of every chunk written to the task."""
        rows = self.db.execute("SELECT chunk_id, state FROM chunks WHERE task_id=?", (task_id,))
        return [(int(chunk_id), str(state)) for chunk_id, state in rows]

    def live_chunks(self, since: int) -> list[int]:
        """The ids of the chunks from ``since`` on that are not resolved (any task or none)."""
        rows = self.db.execute(
            "SELECT chunk_id FROM chunks WHERE chunk_id >= ? AND state != 'resolved'", (since,)
        )
        return [int(chunk_id) for (chunk_id,) in rows]

    def may_have_refused(self, task_id: str) -> bool:
        """Whether a write to the task may have had rows refused by the service (a chunk of it
        accepted with fewer rows than it sent, or resolved: refused whole, or its rows gone
        elsewhere). False for the usual task, whose every row was taken."""
        row = self.db.execute(
            "SELECT 1 FROM chunks WHERE task_id=? AND (state='resolved' OR n_ok < n) LIMIT 1",
            (task_id,),
        ).fetchone()
        return row is not None

    def accepted_rows(self, task_id: str) -> int | None:
        """Rows the service accepted into the task, the number its lines are compared with;
        None when that comparison would prove nothing: a chunk predates the count, or a chunk
        of the task is resolved (its rows refused, or sent again elsewhere: lines the task
        wrote for them before would stand in for missing rows of another chunk)."""
        total, unknown, resolved = self.db.execute(
            "SELECT SUM(CASE WHEN state='accepted' THEN n_ok END),"
            " SUM(CASE WHEN state='accepted' AND n_ok IS NULL THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN state='resolved' THEN 1 ELSE 0 END)"
            " FROM chunks WHERE task_id=? AND state IN ('accepted', 'resolved')",
            (task_id,),
        ).fetchone()
        return None if unknown or resolved else int(total or 0)

    def pending_singles(self) -> list[tuple[int, bytes]]:
        """Rows routed to the single endpoint whose outcome was never committed."""
        # A state file of an older version has no single counter yet.
        with self.transaction():
            self.db.execute("INSERT INTO meta VALUES ('n_single', '0') ON CONFLICT DO NOTHING")
        return list(
            self.db.execute("SELECT pos, body FROM singles WHERE state='pending' ORDER BY pos")
        )

    def single_failures(self) -> tuple[bool, dict[int, int]]:
        """Whether the single endpoint has tagged an image of the run, and the failures
        counted so far (earlier runs) of the routed rows still pending, by position."""
        tagged = False
        counts: dict[int, int] = {}
        for key, value in self.db.execute(
            "SELECT key, value FROM meta WHERE key = ? OR key LIKE ?",
            (SINGLE_TAGGED, SINGLE_FAILS + "%"),
        ):
            if key == SINGLE_TAGGED:
                tagged = True
            elif key.startswith(SINGLE_FAILS):
                counts[int(key[len(SINGLE_FAILS) :])] = int(value)
        return tagged, counts

    def routed_at(self, positions: Sequence[int]) -> set[int]:
        """Those of ``positions`` whose row was routed to the single endpoint (pending or
        done)."""
        found: set[int] = set()
        for start in range(0, len(positions), 400):
            part = tuple(positions[start : start + 400])
            marks = ",".join("?" * len(part))
            found.update(
                pos
                for (pos,) in self.db.execute(
                    f"SELECT pos FROM singles WHERE pos IN ({marks})", part
                )
            )
        return found
