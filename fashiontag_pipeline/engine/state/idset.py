"""The run-wide dedupe of a SQLite state: every id taken in, its first row's position, kept
so that a catalogue whose ids come in any order costs about what a sorted one does.

The ids live in the ``ids`` B-tree (``id`` its key), and each intake batch's new ids must be
durable in the batch's transaction (a resume must know every id taken in). Inserted into the
tree batch by batch, ids in file order that are not sorted (hashes, UUIDs, a dump sorted by
anything but its ids: most real catalogues) land on a different leaf page each once the tree is
larger than a batch, and each commit writes every page it touched to the WAL (then the
checkpoint copies it again): a page per id. Measured with 2,000-id batches, random ids against
sorted ones: 200k ids 4.0 vs 0.53 us CPU an id (491 vs 7 MB of WAL), 1M ids 9.7 vs 0.54 us an
id (6.4 GB vs 60 MB of WAL); it grows with the tree.

So a batch's ids go one of three ways (:meth:`DeferredIds.dedupe`):

* **to a run**, when they come in order and all sort after every id held (no look-up): a
  sorted catalogue, a daemon's job whose ids sort last. The batch is one row of ``id_runs``
  (its ids and their positions: :mod:`.idruns`), not a B-tree row an id (after every id held
  but in no order, a shuffled catalogue's first batch, it goes to the tree at once: as a run,
  the next batch would dissolve it);
* **to the tree**, when neither the tree nor a run holds an id between the batch's lowest and
  highest (two look-ups): a daemon's jobs taking turns (``JOB/ID``: each job's sorted ids fill
  a range of their own). The tree takes them where that range is, a few pages a batch;
* **to the pending ids** otherwise: the ones the tree does not hold (looked up, read-only)
  are written as one row of ``ids_log`` (a JSON object, appended: a few pages a batch) and
  kept in memory. Once they are :data:`FLUSH_IDS` (or :data:`FLUSH_CHARS` characters) they go
  into the tree in key order in one transaction, which writes each page of the tree it touches
  once for all of them, and ``ids_log`` is emptied. Runs that the batch's range meets are
  dissolved into the tree first (:func:`.idruns.dissolve`), so such a batch is looked up in
  the tree alone.

Lookups read all three (the pending ids first: a dict; an id's start, as a service that cuts ids
sends it back, in the pending ids sorted once, not in each of them). The memory is bounded by
the flush thresholds, whatever the manifest's size. ``ids_log`` rows left by a run that
stopped (kill -9 included) are read back when the state is opened again (nothing written then:
a run refused at its start leaves the state as it was); the close of a process that took ids
in puts the pending ids into the tree.

The pending ids, the last id held, the number of runs and the file's version are state of
this process that must follow the database's transactions: each change registers how to undo
it, run in reverse when the transaction rolls back (or its COMMIT fails) and dropped when it
commits.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from . import idruns
from .idruns import any_overlapping, batch_bounds, run_ids_starting, run_positions, store_run
from .schema import LONG_IDS_VERSION, STATE_FILE_BASE, STATE_FILE_VERSION
from .store import first_rows, stored_positions

__all__ = ["FLUSH_CHARS", "FLUSH_IDS", "IDS_LOG_DDL", "DeferredIds"]

#: Pending ids (or characters of them) past which they go into the tree (~13 MB of memory
#: for 100,000 ids of 40 characters). A flush writes each tree page it touches once: with
#: 100,000 random ids and a tree of 1M, about a page per 12 ids instead of a page per id.
FLUSH_IDS = 100_000
FLUSH_CHARS = 4 << 20
#: A batch whose range meets ids held makes a run of its ids after them when the others are
#: at most one in this many (:meth:`DeferredIds._held_of`).
_FEW = 8

IDS_LOG_DDL = "CREATE TABLE IF NOT EXISTS ids_log (seq INTEGER PRIMARY KEY, batch BLOB NOT NULL);"

_encoder = msgspec.json.Encoder()
_log_decoder = msgspec.json.Decoder(dict[str, int])
#: json_each ends a key or value at an escaped NUL (``"a\u0000b"`` would be read as ``"a"``):
#: a payload holding one is bound id by id instead. (A backslash before ``u0000`` in an id
#: lands here too, harmlessly.)
_ESCAPED_NUL = b"\\u0000"


class DeferredIds:
    """The dedupe methods of :class:`~.sqlite.StateDB` (see the module docstring). The class
    that mixes it in calls :meth:`_ids_open` once its tables exist, :meth:`_ids_committed` /
    :meth:`_ids_rolled_back` after each COMMIT / ROLLBACK, and :meth:`_ids_close` before it
    closes the connection."""

    db: Any
    transaction: Callable[[], Any]
    #: Thresholds of a flush (class attributes: a test lowers them).
    flush_ids: int = FLUSH_IDS
    flush_chars: int = FLUSH_CHARS

    _pending: dict[str, int]
    _pending_chars: int
    #: The last id of the tree and the runs (not of the pending ids).
    _held_max: str | None
    #: How many rows ``id_runs`` holds, and the file's ``user_version`` as this process
    #: wrote it (or read it when it opened the file).
    _runs: int
    _version: int
    #: A reject of a long id was marked (:meth:`long_ids_mark`): its statement sets the
    #: version below the runs' own, so each commit while runs are held checks it.
    _long_ids_marked: bool = False
    _undo: list[Callable[[], None]]
    #: The pending ids in order (built by the first :meth:`ids_starting` that needs them;
    #: None once the pending ids changed otherwise than by ``_sorted_added``, ids taken in
    #: since it was built, merged in by the next one).
    _sorted: list[str] | None
    _sorted_added: list[str]
    #: Whether this process took ids in (only then does :meth:`_ids_close` write).
    _ids_added: bool

    # ------------------------------------------------------------------ life

    def _ids_open(self) -> None:
        """Read the tree's last id and the ids a stopped run left in ``ids_log`` (nothing is
        written: a run refused at its start leaves the state as it found it)."""
        self._pending, self._pending_chars, self._undo = {}, 0, []
        self._sorted, self._sorted_added = None, []
        self._ids_added = False
        self._held_max = idruns.last_held(self.db)
        self._runs = idruns.count_runs(self.db)
        (self._version,) = self.db.execute("PRAGMA user_version").fetchone()
        pending: dict[str, int] = {}
        for seq, blob in self.db.execute("SELECT seq, batch FROM ids_log ORDER BY seq"):
            try:
                batch = _log_decoder.decode(blob)
            except (msgspec.DecodeError, TypeError) as err:  # (damaged from outside)
                raise sqlite3.DatabaseError(
                    f"ids_log row {seq} is no batch of ids: {err}"
                ) from None
            for key, pos in batch.items():
                pending.setdefault(key, pos)
        self._pending, self._pending_chars = pending, sum(map(len, pending))

    def _ids_close(self) -> None:
        """Put the pending ids into the tree when this process took any in (a failure leaves
        them in ``ids_log``, where the next open finds them)."""
        if self._pending and self._ids_added:
            with self.transaction():
                self._flush()

    def _ids_before_commit(self) -> None:
        """Raise the version a long id's mark lowered while runs are held (in the
        transaction, before its COMMIT)."""
        if self._runs and self._long_ids_marked:
            (version,) = self.db.execute("PRAGMA user_version").fetchone()
            if version < STATE_FILE_VERSION:
                self._set_version(STATE_FILE_VERSION)

    def long_ids_mark(self) -> tuple[str, tuple[()]]:
        self._long_ids_marked = True  # (before the statement runs: the commit checks it)
        return (f"PRAGMA user_version={LONG_IDS_VERSION}", ())

    def _complete_version(self) -> None:
        """The version of a completed run's file: its long ids' mark off, its runs' kept
        (``reclaim`` deletes them later, only once no job is open)."""
        self._set_version(STATE_FILE_VERSION if self._runs else STATE_FILE_BASE)

    def _ids_committed(self) -> None:
        self._undo.clear()

    def _ids_rolled_back(self) -> None:
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()

    def ids_taken(self) -> int:
        """How many ids the run took in (the tree's, the runs' and the pending ones)."""
        (n,) = self.db.execute("SELECT count(*) FROM ids").fetchone()
        in_runs = idruns.ids_in_runs(self.db) if self._runs else 0
        return int(n) + in_runs + len(self._pending)

    # ------------------------------------------------------------------ dedupe

    def dedupe(self, keyed: Sequence[tuple[str, int]]) -> list[int] | None:
        """For each (id, pos): the position of the id's first row. New ids are taken in (the
        caller commits), so a returned position equal to ``pos`` means "first seen here";
        None means that of every row (the common case: no id of the batch was seen before,
        none is repeated in it)."""
        first, repeated = first_rows(keyed)
        known: dict[str, int] = {}
        pending = self._pending
        new = first
        if pending and not pending.keys().isdisjoint(first):
            known = {key: pending[key] for key in first if key in pending}
            new = {key: pos for key, pos in first.items() if key not in known}
        if new:
            low, ordered = batch_bounds(new, self._held_max)
            if ordered is not None:  # (after every id held: nothing to look up)
                if ordered == list(new):
                    self._to_run(new, ordered)
                else:  # (a shuffled catalogue's first batch: a run would be dissolved)
                    known.update(self._to_tree(new, ordered[-1]))
            elif self._range_free(low, high := max(new)):
                known.update(self._to_tree(new, high))
            else:
                found, new = self._held_of(new, low, high)
                known.update(found)
                if new:
                    self._to_pending(new)
        if not known:
            return [first[key] for key, _ in keyed] if repeated else None
        first.update(known)
        return [first[key] for key, _ in keyed]

    def first_positions(self, ids: Sequence[str]) -> dict[str, int]:
        """The position of the first row of each of ``ids`` the run took in (others left out)."""
        pending = self._pending
        found = {key: pending[key] for key in ids if key in pending}
        rest = [key for key in ids if key not in found] if found else list(ids)
        if rest:
            found.update(self._held_positions(rest))
        return found

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` ids the run took in that start with ``prefix``, in order."""
        stored = [
            key
            for (key,) in self.db.execute(
                "SELECT id FROM ids WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                (prefix, prefix + "\U0010ffff", limit),
            )
        ]
        if self._runs:
            in_runs = run_ids_starting(self.db, prefix, limit)
            if in_runs:
                stored = sorted(stored + in_runs)[:limit]
        if not self._pending:
            return stored
        keys = self._sorted_pending()
        waiting: list[str] = []
        at = bisect_left(keys, prefix)  # (the ids starting with it come from there on)
        while at < len(keys) and len(waiting) < limit and keys[at].startswith(prefix):
            waiting.append(keys[at])
            at += 1
        return sorted(stored + waiting)[:limit] if waiting else stored

    def _sorted_pending(self) -> list[str]:
        """The pending ids in order: sorted once, then the ids taken in since merged in (one
        pass: two sorted runs), so that a look-up by an id's start reads a few of them."""
        keys = self._sorted
        if keys is None:
            keys = self._sorted = sorted(self._pending)
            self._sorted_added = []
        elif self._sorted_added:
            keys += sorted(self._sorted_added)
            keys.sort()
            self._sorted_added = []
        return keys

    def _forget_ids(self, job: int) -> None:
        """Delete the ids of ``job`` (``JOB/ID``: a long-lived engine's complete job)."""
        if self._pending:
            self._flush()
        if self._runs:
            idruns.forget_range(self.db, f"{job}/", f"{job}0")
            self._runs_left(idruns.count_runs(self.db))
        self.db.execute("DELETE FROM ids WHERE id >= ? AND id < ?", (f"{job}/", f"{job}0"))
        self._set("_held_max", idruns.last_held(self.db))

    def _ids_reset(self) -> None:
        """Every id deleted (a wipe, a completed run's reclaim), in the open transaction."""
        self.db.execute("DELETE FROM ids")
        self.db.execute("DELETE FROM ids_log")
        self.db.execute("DELETE FROM id_runs")
        self._replace_pending({}, 0)
        self._set("_held_max", None)
        if self._runs:
            self._set("_runs", 0)
            if self._version == STATE_FILE_VERSION:  # (a new run, or a completed one's)
                self._set_version(STATE_FILE_BASE)

    # ------------------------------------------------------------------ the three levels

    def _range_free(self, low: str, high: str) -> bool:
        """Whether neither the tree nor a run holds an id from ``low`` to ``high`` (a look-up
        each)."""
        found = self.db.execute("SELECT 1 FROM ids WHERE id >= ? AND id <= ? LIMIT 1", (low, high))
        if found.fetchone() is not None:
            return False
        return not (self._runs and any_overlapping(self.db, low, high))

    def _held_of(
        self, new: dict[str, int], low: str, high: str
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(the positions held for ids of ``new``, a batch whose range meets ids held; the
        others). When all but a few of its ids sort after every id held, in order (a sorted
        catalogue's batch with a repeat of an earlier row), those make a run and the few are
        looked up in the tree and the runs; otherwise the runs the batch meets are dissolved,
        and it is looked up in the tree alone (a shuffled batch: no look-up of each id in the
        runs)."""
        last = self._held_max
        keys = list(new)
        # (A shuffled batch's middle and last ids seldom both sort after them: it is not read
        # through for the few.)
        if last is not None and keys[-1] > last and keys[len(keys) // 2] > last:
            below = [key for key in keys if key <= last]
            if len(below) * _FEW <= len(new):
                above = {key: pos for key, pos in new.items() if key > last}
                if (ordered := sorted(above)) == list(above):
                    self._to_run(above, ordered)
                    found = self._held_positions(below)
                    return found, {key: new[key] for key in below if key not in found}
        if self._runs:
            self._dissolve(low, high)
        found = self._tree_positions(keys)
        if found:
            new = {key: pos for key, pos in new.items() if key not in found}
        return found, new

    def _held_positions(self, ids: list[str]) -> dict[str, int]:
        """The positions the tree and the runs hold for ``ids`` (read-only)."""
        found = self._tree_positions(ids)
        if self._runs and len(found) < len(ids):
            found.update(run_positions(self.db, [key for key in ids if key not in found]))
        return found

    def _to_run(self, new: dict[str, int], ordered: list[str]) -> None:
        """Store ``new`` (ids in order that all sort after every id held; ``ordered``: them)
        as one run; a file holding runs gets their version in the same transaction."""
        store_run(self.db, ordered, new.values())
        self._set("_runs", self._runs + 1)
        self._set("_held_max", ordered[-1])
        if self._version < STATE_FILE_VERSION:
            self._set_version(STATE_FILE_VERSION)

    def _dissolve(self, low: str, high: str) -> None:
        """The runs that meet ``low`` to ``high`` into the tree (a batch in no order is
        looked up in the tree alone)."""
        highs = [run_high for run_high, _ in idruns.overlapping(self.db, low, high)]
        if highs:
            self._runs_left(self._runs - idruns.dissolve(self.db, highs))

    def _runs_left(self, runs: int) -> None:
        """``runs`` remain: a file that holds none any more takes the version below theirs
        (not :data:`STATE_FILE_BASE`: it may hold a long id's reject)."""
        self._set("_runs", runs)
        if not runs and self._version == STATE_FILE_VERSION:
            self._set_version(LONG_IDS_VERSION)

    def _to_tree(self, new: dict[str, int], high: str | None = None) -> dict[str, int]:
        """Insert ``new`` (ids in a range of the tree that holds none; ``high``: the largest,
        when the caller has it) into the tree; the positions of any that was there after all
        (an order this process and SQLite disagree on)."""
        db = self.db
        before = db.total_changes
        payload = _encoder.encode(new)
        if _ESCAPED_NUL in payload:
            db.executemany("INSERT OR IGNORE INTO ids VALUES (?, ?)", new.items())
        else:
            db.execute("INSERT OR IGNORE INTO ids SELECT key, value FROM json_each(?)", (payload,))
        inserted = db.total_changes - before
        if high is None:
            high = max(new)
        if self._held_max is None or high > self._held_max:
            self._set("_held_max", high)
        if inserted == len(new):
            return {}
        stored = self._tree_positions(list(new))
        return {key: pos for key, pos in stored.items() if pos != new[key]}

    def _to_pending(self, new: dict[str, int]) -> None:
        """Keep ``new`` (ids the tree does not hold) in ``ids_log`` and in memory."""
        self.db.execute("INSERT INTO ids_log (batch) VALUES (?)", (_encoder.encode(new),))
        self._ids_added = True
        pending = self._pending
        pending.update(new)
        chars = sum(map(len, new))
        self._pending_chars += chars
        if self._sorted is not None:
            self._sorted_added.extend(new)

        def undo() -> None:
            for key in new:
                self._pending.pop(key, None)
            self._pending_chars -= chars
            self._sorted = None

        self._undo.append(undo)
        if len(pending) >= self.flush_ids or self._pending_chars >= self.flush_chars:
            self._flush()

    def _flush(self) -> None:
        """The pending ids into the tree, in key order; ``ids_log`` emptied."""
        pending = self._pending
        ordered = {key: pending[key] for key in sorted(pending)}
        payload = _encoder.encode(ordered)
        if _ESCAPED_NUL in payload:
            self.db.executemany("INSERT OR IGNORE INTO ids VALUES (?, ?)", ordered.items())
        else:
            self.db.execute(
                "INSERT OR IGNORE INTO ids SELECT key, value FROM json_each(?)", (payload,)
            )
        self.db.execute("DELETE FROM ids_log")
        if ordered:
            last = next(reversed(ordered))
            if self._held_max is None or last > self._held_max:
                self._set("_held_max", last)
        self._replace_pending({}, 0)

    def _tree_positions(self, ids: list[str]) -> dict[str, int]:
        """The positions the tree holds for ``ids`` (read-only)."""
        db = self.db
        payload = _encoder.encode(ids)
        if _ESCAPED_NUL not in payload:
            return dict(
                db.execute(
                    "SELECT ids.id, ids.pos FROM json_each(?) AS j JOIN ids ON ids.id = j.value",
                    (payload,),
                )
            )
        return stored_positions(db, ids)

    # ------------------------------------------------------------------ undoable changes

    def _replace_pending(self, pending: dict[str, int], chars: int) -> None:
        old = (self._pending, self._pending_chars)

        def undo() -> None:
            self._pending, self._pending_chars = old
            self._sorted = None

        self._undo.append(undo)
        self._pending, self._pending_chars = pending, chars
        self._sorted = None

    def _set(self, name: str, value: object) -> None:
        """Set the attribute ``name`` (``_held_max``, ``_runs``), undone by a rollback."""
        old = getattr(self, name)
        self._undo.append(lambda: setattr(self, name, old))
        setattr(self, name, value)

    def _set_version(self, version: int) -> None:
        """``PRAGMA user_version`` (in the open transaction: a rollback undoes it)."""
        self.db.execute(f"PRAGMA user_version={version}")
        self._set("_version", version)
