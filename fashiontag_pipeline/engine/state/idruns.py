"""Ids stored a batch to a row: the ``id_runs`` table of a SQLite state (:mod:`.idset`).

An intake batch whose ids all sort after every id the state holds (a sorted catalogue: every
batch of it) is stored as one row, ``(high PRIMARY KEY, low, n, ids, positions)``: its ids in
order (a JSON list), their first rows' positions (int64, little-endian) and its lowest and
highest id. One row a batch instead of one B-tree row an id: ~2.7k instructions an image less
(``benchmarks/README.md``). Runs never overlap (each is made above every id held), so the
run that may hold an id is the first whose ``high`` >= it: one seek and a bisect.

Every id is held in one place only: the tree (``ids``), the pending ids (``ids_log``) or a run.
A batch that does not sort after every id held never joins a run: when its range overlaps runs
they are *dissolved* first (their ids moved into the tree, the rows deleted), so that such a
batch, a shuffled catalogue's, only ever looks in the tree. A shuffled catalogue makes one run
(its first batch) and dissolves it at its second.

These functions take the connection; :class:`~.idset.DeferredIds` keeps the count of runs and
the file's version (``schema.STATE_FILE_VERSION``: a file holding runs is marked so that a
build before them refuses it instead of missing their ids)."""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import msgspec

__all__ = [
    "any_overlapping",
    "batch_bounds",
    "count_runs",
    "dissolve",
    "forget_range",
    "ids_in_runs",
    "last_held",
    "overlapping",
    "run_ids_starting",
    "run_positions",
    "store_run",
]

_encoder = msgspec.json.Encoder()
_ids_decoder = msgspec.json.Decoder(list[str])
_BIG = sys.byteorder == "big"


def _packed(positions: Collection[int]) -> bytes:
    """``positions`` as little-endian int64s, packed in one C call: ``array("q", ...)`` took
    ~530 instructions a position from an iterable (each one converted twice, through the
    generic argument parser), ``struct.pack`` ~170 (a third of the time; the same bytes)."""
    return struct.pack(f"<{len(positions)}q", *positions)


def _unpacked(blob: bytes) -> array[int]:
    positions = array("q")
    positions.frombytes(blob)
    if _BIG:
        positions.byteswap()
    return positions


def store_run(db: Any, keys: list[str], positions: Collection[int]) -> None:
    """One run of ``keys`` (in order, all after every id held) and their positions."""
    db.execute(
        "INSERT INTO id_runs VALUES (?, ?, ?, ?, ?)",
        (keys[-1], keys[0], len(keys), _encoder.encode(keys), _packed(positions)),
    )


def _load(db: Any, high: str) -> tuple[list[str], array[int]]:
    ids, positions = db.execute(
        "SELECT ids, positions FROM id_runs WHERE high = ?", (high,)
    ).fetchone()
    return _ids_decoder.decode(ids), _unpacked(positions)


def overlapping(db: Any, low: str, high: str) -> Iterator[tuple[str, str]]:
    """(high, low) of each run holding an id from ``low`` to ``high``'s range, in order."""
    for run_high, run_low in db.execute(
        "SELECT high, low FROM id_runs WHERE high >= ? ORDER BY high", (low,)
    ):
        if run_low > high:
            return
        yield run_high, run_low


def any_overlapping(db: Any, low: str, high: str) -> bool:
    """Whether a run's range meets ``low`` to ``high`` (one seek: runs do not overlap)."""
    row = db.execute(
        "SELECT low FROM id_runs WHERE high >= ? ORDER BY high LIMIT 1", (low,)
    ).fetchone()
    return row is not None and row[0] <= high


def dissolve(db: Any, highs: Sequence[str]) -> int:
    """Move the ids of the runs ``highs`` into the tree and delete the runs; how many."""
    for high in highs:
        keys, positions = _load(db, high)
        payload = _encoder.encode(dict(zip(keys, positions, strict=True)))
        if b"\\u0000" in payload:  # (json_each would end an id at it: see .idset)
            db.executemany(
                "INSERT OR IGNORE INTO ids VALUES (?, ?)", zip(keys, positions, strict=True)
            )
        else:
            db.execute("INSERT OR IGNORE INTO ids SELECT key, value FROM json_each(?)", (payload,))
        db.execute("DELETE FROM id_runs WHERE high = ?", (high,))
    return len(highs)


def run_positions(db: Any, ids: Iterable[str]) -> dict[str, int]:
    """The positions the runs hold for ``ids`` (read-only; each run read once)."""
    found: dict[str, int] = {}
    keys: list[str] = []
    positions: array[int] = array("q")
    low = high = ""
    for key in sorted(set(ids)):
        if not keys or key > high:
            row = db.execute(
                "SELECT high, low FROM id_runs WHERE high >= ? ORDER BY high LIMIT 1", (key,)
            ).fetchone()
            if row is None:
                break
            high, low = row
            keys, positions = _load(db, high)
        if key < low:
            continue
        at = bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            found[key] = positions[at]
    return found


def run_ids_starting(db: Any, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` ids of the runs that start with ``prefix``, in order."""
    out: list[str] = []
    for high, low in db.execute(
        "SELECT high, low FROM id_runs WHERE high >= ? ORDER BY high", (prefix,)
    ):
        if low > prefix and not low.startswith(prefix):
            break
        keys = _load(db, high)[0]
        at = bisect_left(keys, prefix)
        while at < len(keys) and len(out) < limit and keys[at].startswith(prefix):
            out.append(keys[at])
            at += 1
        if len(out) >= limit:
            break
    return out


def forget_range(db: Any, low: str, end: str) -> None:
    """Delete the runs' ids from ``low`` up to (not including) ``end``: runs inside it
    deleted, a run across one of its ends dissolved (the caller deletes the tree's range)."""
    across = []
    for high, run_low in list(overlapping(db, low, end)):
        if run_low >= low and high < end:
            db.execute("DELETE FROM id_runs WHERE high = ?", (high,))
        elif run_low < end:
            across.append(high)
    dissolve(db, across)


def count_runs(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM id_runs").fetchone()[0])


def ids_in_runs(db: Any) -> int:
    return int(db.execute("SELECT coalesce(sum(n), 0) FROM id_runs").fetchone()[0])


def last_held(db: Any) -> str | None:
    """The last id of the tree and the runs."""
    (tree,) = db.execute("SELECT max(id) FROM ids").fetchone()
    (runs,) = db.execute("SELECT max(high) FROM id_runs").fetchone()
    if tree is None or (runs is not None and runs > tree):
        return runs  # type: ignore[no-any-return]
    return tree  # type: ignore[no-any-return]


def batch_bounds(new: dict[str, int], tree_max: str | None) -> tuple[str, list[str] | None]:
    """(the lowest of ``new``, them sorted when they all sort after ``tree_max``, else None).

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
        return low, (ordered if tree_max is None or low > tree_max else None)
    return min(keys), None
