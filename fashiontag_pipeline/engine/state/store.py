"""The state store: the run's identity, watermarks, queries, reconciliation.

The tables, positions and watermarks are described in :mod:`.schema`. :class:`StateStore` holds
every query; its SQL is the common dialect of SQLite and PostgreSQL (``?`` placeholders,
``ON CONFLICT``, ``RETURNING``), and a backend supplies the connection and its transactions:
:class:`~.sqlite.StateDB` a SQLite file (WAL, the embedded default),
:class:`~.pgstore.PostgresStateDB` a schema of a PostgreSQL database. Everything that
touches the state or a sink runs in one thread at a time (the journal's state thread), so the
event loop never blocks on disk and every commit is one transaction that moves sink
checkpoints and state together. A state is locked while a run holds it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import msgspec

from ... import _exceptions as exc
from ..manifests import ManifestPrint, describe, same_manifests
from .jobtables import JobRow, JobTables
from .schema import BODY_SQL, COUNTERS, TABLES

__all__ = ["JobRow", "Reconciliation", "RunState", "StateStore"]

_prints_decoder = msgspec.json.Decoder(list[ManifestPrint])


class RunState(msgspec.Struct, kw_only=True):
    """What the state file says about the run when it is opened.

    ``opened`` says what :meth:`StateDB.open_run` decided: ``new`` (an empty state),
    ``resumed`` (an unfinished run of the same manifests), ``replaced`` (the state held a
    completed run of other manifests, or ``--restart``: discarded, a new run starts; ``note``
    says why) or ``complete`` (the same manifests, already complete: nothing to do)."""

    token: str
    resumed: bool
    opened: str = "new"
    note: str = ""
    completed_at: str | None = None
    counters: dict[str, int]
    task_seq: int


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """The end-of-run check: rows taken into the run without an outcome, and what is still
    in flight. Complete when both are empty."""

    accepted: int
    settled: int
    in_flight: list[str]

    @property
    def unsettled(self) -> int:
        return self.accepted - self.settled

    @property
    def complete(self) -> bool:
        return self.unsettled == 0 and not self.in_flight


class StateStore(JobTables):
    """The queries of the state, whatever holds it. Not thread-safe: used from one thread at a
    time (the journal). A backend sets :attr:`db` (``execute``/``executemany`` as in
    :mod:`sqlite3`, ``?`` placeholders) and :attr:`where` (the state's name in messages), and
    says how a write transaction begins (:meth:`begin`)."""

    db: Any
    #: The state's name in messages ("state file PATH", "PostgreSQL state URL#NAME").
    where: str = "state"
    #: Where the state is, as a summary shows it (a path, or the URL without its password).
    location: str = ""
    #: Whether ``chunk_bodies`` keeps each chunk's ids apart (``ids``), so that the ids written
    #: to a task are read without its bodies (:meth:`sent_chunks`). The PostgreSQL state's
    #: tables are versioned and have no such column: its bodies are read instead.
    chunk_ids: bool = True

    def begin(self) -> None:
        """Start a write transaction."""
        self.db.execute("BEGIN")

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        # SQLite rolls a transaction back itself on some errors (an I/O error, a full disk):
        # a ROLLBACK then fails ("no transaction is active") and would hide that error.
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def close(self) -> None:
        raise NotImplementedError

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: object) -> None:
        self.db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, str(value)),
        )

    def open_run(
        self, prints: Sequence[ManifestPrint], *, restart: bool = False, resume_stdin: bool = False
    ) -> RunState:
        """Start a run, resume the unfinished run of the same manifests, or refuse.

        See :mod:`.manifests` for the rules; a refusal (:class:`StateConflictError`) writes
        nothing."""
        prints = list(prints)
        token = self.meta("run_token")
        opened, note = "new", ""
        if token is not None:
            stored_text = self.meta("prints")
            stored = _prints_decoder.decode(stored_text) if stored_text else None
            completed = self.meta("completed_at")
            same = stored is not None and same_manifests(stored, prints)
            stdin = any(p.stdin for p in prints)
            if restart:
                opened, note = "replaced", "--restart: the previous state is discarded"
            elif completed is not None and same and not stdin:
                return self._run_state(token, opened="complete", completed_at=completed)
            elif completed is not None:
                opened = "replaced"
                note = (
                    f"the state holds a run completed at {completed}"
                    + ("" if stdin and same else f" of {describe(stored or [])}")
                    + ": starting a new run"
                )
            elif same and (not stdin or resume_stdin):
                return self._run_state(token, opened="resumed")
            else:
                raise exc.StateConflictError(self._conflict(stored, prints, same))
            self._wipe()
        token = secrets.token_hex(8)
        with self.transaction():
            self.set_meta("run_token", token)
            self.set_meta("prints", msgspec.json.encode(prints).decode())
            self.set_meta("manifests", msgspec.json.encode([p.name for p in prints]).decode())
            self.set_meta("task_seq", 0)
            self.set_meta("next_source", 0)
            for key in COUNTERS:
                self.set_meta(f"n_{key}", 0)
        return self._run_state(token, opened=opened, note=note)

    def _conflict(
        self, stored: list[ManifestPrint] | None, prints: list[ManifestPrint], same: bool
    ) -> str:
        where = self.where
        restart = "pass --restart to discard it and start over (the outputs are rewritten)"
        if stored is None:
            return (
                f"{where} was written by an earlier version that did not record its manifests; "
                f"{restart}"
            )
        if same:
            return (
                f"{where} holds an unfinished run that read stdin, which cannot be checked to "
                "carry the same rows before it is read: pass --resume if stdin carries the same "
                f"rows again, or {restart}"
            )
        return (
            f"{where} holds an unfinished run of other manifests ({describe(stored)}; now "
            f"{describe(prints)}): run the same command on those manifests to finish it, or "
            f"{restart}"
        )

    def _wipe(self) -> None:
        with self.transaction():
            for table in TABLES:
                self.db.execute(f"DELETE FROM {table}")

    def _run_state(
        self, token: str, *, opened: str, note: str = "", completed_at: str | None = None
    ) -> RunState:
        return RunState(
            token=token,
            resumed=opened == "resumed",
            opened=opened,
            note=note,
            completed_at=completed_at,
            counters={k: int(self.meta(f"n_{k}", "0") or 0) for k in COUNTERS},
            task_seq=int(self.meta("task_seq", "0") or 0),
        )

    def open_engine(self) -> RunState:
        """The state of a long-lived engine (the daemon): one token for its whole life, jobs
        added as they come, never complete as a whole."""
        token = self.meta("run_token")
        if token is None:
            token = secrets.token_hex(8)
            with self.transaction():
                self.set_meta("run_token", token)
                self.set_meta("task_seq", 0)
                self.set_meta("next_source", 0)
                for key in COUNTERS:
                    self.set_meta(f"n_{key}", 0)
            return self._run_state(token, opened="new")
        return self._run_state(token, opened="resumed")

    def reconcile(self) -> Reconciliation:
        """Rows taken into the run without an outcome, and what is still in flight."""
        db = self.db
        in_flight: list[str] = []
        checks = (
            (
                "chunks written but not settled",
                "SELECT count(*) FROM chunks WHERE state IN ('pending', 'orphan')",
            ),
            (
                "tasks not read to the end",
                "SELECT count(*) FROM tasks WHERE state IN ('open', 'sealed', 'done')",
            ),
            (
                "chunks of forgotten tasks not sent again",
                "SELECT count(*) FROM chunks c"
                " JOIN tasks t ON t.task_id = c.task_id WHERE t.state = 'lost'"
                " AND c.state IN ('accepted', 'orphan', 'pending')",
            ),
            (
                "single-mode rows without an outcome",
                "SELECT count(*) FROM singles WHERE state = 'pending'",
            ),
        )
        for what, sql in checks:
            (n,) = db.execute(sql).fetchone()
            if n:
                in_flight.append(f"{n} {what}")
        accepted = int(self.meta("n_accepted", "0") or 0)
        settled = int(self.meta("n_settled", "0") or 0)
        if settled > accepted:
            in_flight.append(
                f"{settled - accepted} more outcomes recorded than rows taken in: the state is "
                "damaged (--restart starts over)"
            )
        return Reconciliation(accepted=accepted, settled=settled, in_flight=in_flight)

    def mark_complete(self, when: str) -> None:
        """Record that the run is reconciled: the same manifests again have nothing to do."""
        with self.transaction():  # a fenced backend checks its lease there
            self.set_meta("completed_at", when)

    def dedupe(self, keyed: Sequence[tuple[str, int]]) -> list[int] | None:
        """For each (id, pos): the position of the id's first row. New ids are inserted (the
        caller commits), so a returned position equal to ``pos`` means "first seen here";
        None means that of every row (the common case: no id of the batch was seen before,
        none is repeated in it).

        One insert of the batch's distinct ids, skipping those already there, does the work;
        when it inserted every one of them no id was seen before and nothing is read back.
        Otherwise the stored positions are read back."""
        first = dict(keyed)  # in C; right as long as no id repeats within the batch
        repeated = len(first) < len(keyed)
        if repeated:  # the first row of each id wins (dict() kept the last)
            first = {}
            setdefault = first.setdefault
            for key, pos in keyed:
                setdefault(key, pos)
        if self._insert_new_ids(first) == len(first):
            return [first[key] for key, _ in keyed] if repeated else None
        first.update(self.first_positions(list(first)))
        return [first[key] for key, _ in keyed]

    def first_positions(self, ids: Sequence[str]) -> dict[str, int]:
        """The position of the first row of each of ``ids`` the run took in (others left out)."""
        found: dict[str, int] = {}
        for start in range(0, len(ids), 900):
            part = ids[start : start + 900]
            marks = ",".join("?" * len(part))
            for key, pos in self.db.execute(f"SELECT id, pos FROM ids WHERE id IN ({marks})", part):
                found[key] = pos
        return found

    def _insert_new_ids(self, first: dict[str, int]) -> int:
        """Insert the (id, position) pairs whose id is not there yet; returns how many."""
        raise NotImplementedError

    # -------------------------------------------------------------- chunks and resume

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
                if self.chunk_ids:
                    db.execute(
                        "INSERT INTO chunk_bodies (chunk_id, body, ids) VALUES (?, ?, ?)",
                        (new_id, body, ids),
                    )
                else:
                    db.execute(
                        "INSERT INTO chunk_bodies (chunk_id, body) VALUES (?, ?)", (new_id, body)
                    )
                new.append(int(new_id))
            db.execute(
                "UPDATE chunks SET state='resolved', body=NULL WHERE chunk_id=?", (chunk_id,)
            )
            db.execute("DELETE FROM chunk_bodies WHERE chunk_id=?", (chunk_id,))
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
    ) -> int:
        """Write a chunk ahead of its request; returns its id. One transaction: the chunk
        (with the ``token`` of the task its request creates, or the ``task_id`` it is appended
        to; ``ids``, the JSON list of the ids it sends, is kept beside its body), and either
        the chunked watermarks (W) of the jobs whose new rows it carries (``marks``: (job,
        last position)), or, for rows sent again, the ``resent`` counter and the chunk
        ``replaces`` whose unsettled rows it carries (resolved, so they can never be sent
        twice)."""
        db = self.db
        with self.transaction():
            # The body goes to its own table: the chunk's row is updated several times (token,
            # task, state) and SQLite rewrites a whole row, overflow pages included, on update.
            (chunk_id,) = db.execute(
                "INSERT INTO chunks (state, n, last_pos, token, task_id)"
                " VALUES ('pending', ?, ?, ?, ?) RETURNING chunk_id",
                (n, last_pos, token, task_id),
            ).fetchone()
            if self.chunk_ids:
                db.execute(
                    "INSERT INTO chunk_bodies (chunk_id, body, ids) VALUES (?, ?, ?)",
                    (chunk_id, body, ids),
                )
            else:
                db.execute(
                    "INSERT INTO chunk_bodies (chunk_id, body) VALUES (?, ?)", (chunk_id, body)
                )
            if replaces is not None:
                db.execute(
                    "UPDATE chunks SET state='resolved', body=NULL WHERE chunk_id=?", (replaces,)
                )
                db.execute("DELETE FROM chunk_bodies WHERE chunk_id=?", (replaces,))
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

    def task_known(self, task_id: str) -> bool:
        """Whether the state records a task of this id (the service gave it to this run)."""
        return (
            self.db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
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

    def resume_chunks(self) -> list[tuple[Any, ...]]:
        """Chunks of unknown fate: (chunk_id, state, task_id, token, body)."""
        return list(
            self.db.execute(
                f"SELECT chunk_id, state, task_id, token, {BODY_SQL} FROM chunks"
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
        """Rows the service accepted into the task (None when a chunk predates the count)."""
        total, unknown = self.db.execute(
            "SELECT SUM(n_ok), COUNT(*) - COUNT(n_ok) FROM chunks"
            " WHERE task_id=? AND state='accepted'",
            (task_id,),
        ).fetchone()
        return None if unknown else int(total or 0)

    def pending_singles(self) -> list[tuple[int, bytes]]:
        """Rows routed to the single endpoint whose outcome was never committed."""
        # A state file of an older version has no single counter yet.
        with self.transaction():
            self.db.execute("INSERT INTO meta VALUES ('n_single', '0') ON CONFLICT DO NOTHING")
        return list(
            self.db.execute("SELECT pos, body FROM singles WHERE state='pending' ORDER BY pos")
        )
