"""The state store: the run's identity, watermarks, queries, reconciliation.

The tables, positions and watermarks are described in :mod:`.schema`. :class:`StateStore` holds
every query (those of jobs in :mod:`.jobtables`, of chunks and tasks in :mod:`.chunks`); its
SQL is the common dialect of SQLite and PostgreSQL (``?`` placeholders, ``ON CONFLICT``,
``RETURNING``), and a backend supplies the connection and its transactions:
:class:`~.sqlite.StateDB` a SQLite file (WAL, the embedded default),
:class:`~.pgstore.PostgresStateDB` a schema of a PostgreSQL database. Everything that
touches the state or a sink runs in one thread at a time (the journal's state thread), so the
event loop never blocks on disk and every commit is one transaction that moves sink
checkpoints and state together. A state is locked while a run holds it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec

from ... import _exceptions as exc
from ..manifests import ManifestPrint, describe, same_manifests
from .chunks import ChunkTables
from .jobtables import JobRow
from .schema import COUNTERS, TABLES

__all__ = ["JobRow", "Reconciliation", "RunState", "StateStore"]

_prints_decoder = msgspec.json.Decoder(list[ManifestPrint])

#: The meta key of a state whose orphan chunks' ``n_ok`` is their rows counted as submitted so
#: far (NULL: none yet; :mod:`~..returned`). A build before it (2026-11-26) left NULL on an
#: orphan whose rows it had counted whole (a write answered 2xx with no body), and counted
#: none of the others: on a resume its orphans are taken as counted, so that no row is
#: counted twice (a run of such a build undercounts as that build did, never over).
ORPHANS_COUNTED = "orphans_counted"


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


class KeyedColumns(Sequence[tuple[str, int]]):
    """A batch's (id, position) rows as the two columns a validator's block built its items
    from (a plain block's ids and its range of positions): read as pairs through ``zip`` (the
    dedupe's ``dict`` in one C pass), no tuple a row made for them in the event loop (a list
    of them cost ~460 instructions a row)."""

    __slots__ = ("ids", "positions")

    def __init__(self, ids: Sequence[str], positions: Sequence[int]) -> None:
        self.ids = ids
        self.positions = positions

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(index, slice):
            return list(zip(self.ids[index], self.positions[index], strict=True))
        return self.ids[index], self.positions[index]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return zip(self.ids, self.positions, strict=True)


def first_rows(keyed: Sequence[tuple[str, int]]) -> tuple[dict[str, int], bool]:
    """(each id's position in a batch of (id, position) rows, the first row's when an id
    repeats; whether one does)."""
    first = dict(keyed)  # in C; right as long as no id repeats within the batch
    repeated = len(first) < len(keyed)
    if repeated:  # the first row of each id wins (dict() kept the last)
        first = {}
        setdefault = first.setdefault
        for key, pos in keyed:
            setdefault(key, pos)
    return first, repeated


def stored_positions(db: Any, ids: Sequence[str]) -> dict[str, int]:
    """The positions the ``ids`` table holds for ``ids`` (900 bound parameters a query)."""
    found: dict[str, int] = {}
    for start in range(0, len(ids), 900):
        part = ids[start : start + 900]
        marks = ",".join("?" * len(part))
        found.update(db.execute(f"SELECT id, pos FROM ids WHERE id IN ({marks})", part))
    return found


class StateStore(ChunkTables):
    """The queries of the state, whatever holds it. Not thread-safe: used from one thread at a
    time (the journal). A backend sets :attr:`db` (``execute``/``executemany`` as in
    :mod:`sqlite3`, ``?`` placeholders) and :attr:`where` (the state's name in messages), and
    says how a write transaction begins (:meth:`begin`)."""

    db: Any
    #: The state's name in messages ("state file PATH", "PostgreSQL state URL#NAME").
    where: str = "state"
    #: Where the state is, as a summary shows it (a path, or the URL without its password).
    location: str = ""

    #: The journal of the one engine that uses this store (:meth:`claim`), None when free.
    owner: object | None = None

    #: The statements that mark the state as holding the reject of an id too long to key,
    #: which builds before that limit misread (they refuse the mark: see
    #: :data:`~.schema.STATE_FILE_VERSION`), and that take the mark off (a run completed, or
    #: emptied): a backend sets them.
    LONG_IDS_MARK = ""
    LONG_IDS_CLEAR = ""

    def long_ids_mark(self) -> tuple[str, tuple[()]]:
        """The change marking the state (see :attr:`LONG_IDS_MARK`), committed with such a
        reject."""
        return (self.LONG_IDS_MARK, ())

    def claim(self, owner: object | None) -> None:
        """Hold the store for one engine's journal (``None``: free it again). A second engine
        on a store in use would share its one connection from a second state thread (each
        transaction begun inside the other's): refused, saying what to do."""
        if owner is not None and owner is not self.owner:
            self.check_free()
        self.owner = owner

    @property
    def closed(self) -> bool:
        """Closed (an engine closes its store when it ends): a backend says."""
        return False

    def check_free(self) -> None:
        """:class:`StateConflictError` while an engine uses the store (see :meth:`claim`), a
        :class:`StateError` once it is closed."""
        if self.closed:
            raise exc.StateError(
                f"{self.where} is closed (an engine closes its state store when it ends):"
                " open it again (StateDB, open_state) for the next engine"
            )
        if self.owner is not None:
            raise exc.StateConflictError(
                f"{self.where} is in use by another Engine of this process: one Engine per"
                " state store (an engine's journal owns it, and closes it when the engine"
                " ends); submit every job to that engine (made with namespaced=True), or give"
                " this one a state of its own"
            )

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

    def recorded_order(self, prints: Sequence[ManifestPrint]) -> list[int] | None:
        """The indexes of ``prints`` in the order the state's run read the same manifests, when
        ``prints`` are those files given in another order (a shell glob sorted under another
        locale: ``B.csv a.csv`` under cron's LANG=C, ``a.csv B.csv`` in an en_US shell); None
        otherwise. Read in the run's order, they are the same run: its row positions (and
        which of two equal ids came first) hold as recorded. Stdin (``-``) among them takes
        stdin's place (a run that read stdin is resumed only with --resume, whatever the
        order: :meth:`open_run`)."""
        text = self.meta("prints") if self.meta("run_token") is not None else None
        if not text:
            return None
        stored = _prints_decoder.decode(text)
        if len(stored) != len(prints) or same_manifests(stored, list(prints)):
            return None
        left = list(range(len(prints)))
        order: list[int] = []
        for old in stored:
            # The same name first (two files of equal content keep their names), else content.
            found = [
                i for i in left if (prints[i].size, prints[i].sha256) == (old.size, old.sha256)
            ]
            if not found:
                return None
            pick = next((i for i in found if prints[i].name == old.name), found[0])
            left.remove(pick)
            order.append(pick)
        return order

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
                self._orphans_counted()
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
            self.set_meta(ORPHANS_COUNTED, 1)
            for key in COUNTERS:
                self.set_meta(f"n_{key}", 0)
        return self._run_state(token, opened=opened, note=note)

    def _orphans_counted(self) -> None:
        """A state of a build before :data:`ORPHANS_COUNTED`: its orphans counted whole."""
        if self.meta(ORPHANS_COUNTED) is not None:
            return
        with self.transaction():
            self.db.execute("UPDATE chunks SET n_ok = n WHERE state='orphan' AND n_ok IS NULL")
            self.set_meta(ORPHANS_COUNTED, 1)

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
            self.db.execute(self.LONG_IDS_CLEAR)

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
        self.check_free()  # (another engine's: its state thread uses the connection)
        token = self.meta("run_token")
        if token is None:
            token = secrets.token_hex(8)
            with self.transaction():
                self.set_meta("run_token", token)
                self.set_meta("task_seq", 0)
                self.set_meta("next_source", 0)
                self.set_meta(ORPHANS_COUNTED, 1)
                for key in COUNTERS:
                    self.set_meta(f"n_{key}", 0)
            return self._run_state(token, opened="new")
        self._orphans_counted()
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
            # (A completed run is never resumed: no build misreads its rejects.)
            self.db.execute(self.LONG_IDS_CLEAR)

    def dedupe(self, keyed: Sequence[tuple[str, int]]) -> list[int] | None:
        """For each (id, pos): the position of the id's first row. New ids are inserted (the
        caller commits), so a returned position equal to ``pos`` means "first seen here";
        None means that of every row (the common case: no id of the batch was seen before,
        none is repeated in it).

        One insert of the batch's distinct ids, skipping those already there, does the work;
        when it inserted every one of them no id was seen before and nothing is read back.
        Otherwise the stored positions are read back."""
        first, repeated = first_rows(keyed)
        if self._insert_new_ids(first) == len(first):
            return [first[key] for key, _ in keyed] if repeated else None
        first.update(self.first_positions(list(first)))
        return [first[key] for key, _ in keyed]

    def ids_taken(self) -> int:
        """How many ids the run took in."""
        (n,) = self.db.execute("SELECT count(*) FROM ids").fetchone()
        return int(n)

    def first_positions(self, ids: Sequence[str]) -> dict[str, int]:
        """The position of the first row of each of ``ids`` the run took in (others left out)."""
        return stored_positions(self.db, ids)

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` ids the run took in that start with ``prefix`` (a range of the
        primary key: ids are in byte order in both stores)."""
        return [
            key
            for (key,) in self.db.execute(
                "SELECT id FROM ids WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                (prefix, prefix + "\U0010ffff", limit),
            )
        ]

    def _insert_new_ids(self, first: dict[str, int]) -> int:
        """Insert the (id, position) pairs whose id is not there yet; returns how many."""
        raise NotImplementedError
