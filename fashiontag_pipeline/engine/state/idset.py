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

So a batch's ids go one of two ways (:meth:`DeferredIds.dedupe`):

* **to the tree**, when the tree holds no id between the batch's lowest and highest (one
  look-up; none when they all sort after its last id): a sorted catalogue, the first batch, a
  daemon's jobs taking turns (``JOB/ID``: each job's sorted ids fill a range of their own).
  The tree takes them where that range is, a few pages a batch;
* **to the pending ids** otherwise: the ones the tree does not hold (looked up, read-only)
  are written as one row of ``ids_log`` (a JSON object, appended: a few pages a batch) and
  kept in memory. Once they are :data:`FLUSH_IDS` (or :data:`FLUSH_CHARS` characters) they go
  into the tree in key order in one transaction, which writes each page of the tree it touches
  once for all of them, and ``ids_log`` is emptied.

Lookups read both (the pending ids first: a dict; an id's start, as a service that cuts ids
sends it back, in the pending ids sorted once, not in each of them). The memory is bounded by
the flush thresholds, whatever the manifest's size. ``ids_log`` rows left by a run that
stopped (kill -9 included) are read back when the state is opened again (nothing written then:
a run refused at its start leaves the state as it was); the close of a process that took ids
in puts the pending ids into the tree.

The pending ids and the tree's last id are state of this process that must follow the
database's transactions: each change registers how to undo it, run in reverse when the
transaction rolls back (or its COMMIT fails) and dropped when it commits.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .store import first_rows, stored_positions

__all__ = ["FLUSH_CHARS", "FLUSH_IDS", "IDS_LOG_DDL", "DeferredIds"]

#: Pending ids (or characters of them) past which they go into the tree (~13 MB of memory
#: for 100,000 ids of 40 characters). A flush writes each tree page it touches once: with
#: 100,000 random ids and a tree of 1M, about a page per 12 ids instead of a page per id.
FLUSH_IDS = 100_000
FLUSH_CHARS = 4 << 20

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
    _tree_max: str | None
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
        (self._tree_max,) = self.db.execute("SELECT max(id) FROM ids").fetchone()
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

    def _ids_committed(self) -> None:
        self._undo.clear()

    def _ids_rolled_back(self) -> None:
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()

    def ids_taken(self) -> int:
        """How many ids the run took in (the tree's and the pending ones)."""
        (n,) = self.db.execute("SELECT count(*) FROM ids").fetchone()
        return int(n) + len(self._pending)

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
            low, high = _bounds(new, self._tree_max)
            if high is not None or self._range_free(low, max(new)):
                known.update(self._to_tree(new, high))
            else:
                found = self._tree_positions(list(new))
                if found:
                    known.update(found)
                    new = {key: pos for key, pos in new.items() if key not in found}
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
            found.update(self._tree_positions(rest))
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
        self.db.execute("DELETE FROM ids WHERE id >= ? AND id < ?", (f"{job}/", f"{job}0"))
        self._set_tree_max(self.db.execute("SELECT max(id) FROM ids").fetchone()[0])

    def _ids_reset(self) -> None:
        """Every id deleted (a wipe, a completed run's reclaim), in the open transaction."""
        self.db.execute("DELETE FROM ids")
        self.db.execute("DELETE FROM ids_log")
        self._replace_pending({}, 0)
        self._set_tree_max(None)

    # ------------------------------------------------------------------ the two levels

    def _range_free(self, low: str, high: str) -> bool:
        """Whether the tree holds no id from ``low`` to ``high`` (one look-up)."""
        found = self.db.execute("SELECT 1 FROM ids WHERE id >= ? AND id <= ? LIMIT 1", (low, high))
        return found.fetchone() is None

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
        if self._tree_max is None or high > self._tree_max:
            self._set_tree_max(high)
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
            if self._tree_max is None or last > self._tree_max:
                self._set_tree_max(last)
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

    def _set_tree_max(self, value: str | None) -> None:
        old = self._tree_max

        def undo() -> None:
            self._tree_max = old

        self._undo.append(undo)
        self._tree_max = value


def _bounds(new: dict[str, int], tree_max: str | None) -> tuple[str, str | None]:
    """(the lowest of ``new``, the highest when they all sort after ``tree_max``, else None).

    ``min`` and ``max`` compare every id in Python's generic way, ~260 instructions an id each
    under valgrind; ``sorted`` compares str with its own C routine and finds ids in order (a
    sorted catalogue) with one comparison each: ~130 for both ends. Ids in no order would cost
    ~850 sorted, so they are sorted only when the first of them sorts after the tree (its
    last id, which a shuffled batch's first is once the tree holds a few batches, seldom
    beats); the others take ``min`` (and the caller ``max`` if it needs it)."""
    keys = list(new)
    if tree_max is None or keys[0] > tree_max:
        ordered = sorted(keys)
        low = ordered[0]
        return low, (ordered[-1] if tree_max is None or low > tree_max else None)
    return min(keys), None
