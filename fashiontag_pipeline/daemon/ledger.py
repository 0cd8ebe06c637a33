"""The claim ledger: where the daemon records, durably, which manifests it claimed and settled.

:class:`ClaimLedger` is the protocol the state store implements (the claim is recorded before
the file is moved, so a crash between the two is recovered: see :mod:`.inbox`);
:class:`MemoryClaimLedger` serves tests and :class:`SQLiteClaimLedger` a single daemon.

The PostgreSQL ledger, with the manifest leases of several daemons, is in :mod:`.leases`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

if TYPE_CHECKING:
    from .leases import Lease

__all__ = [
    "ClaimLedger",
    "ClaimRecord",
    "ClaimStatus",
    "MemoryClaimLedger",
    "SQLiteClaimLedger",
    "SettledStatus",
    "SharedLedger",
]

#: ``claimed``: in flight. The others are final: ``done``/``failed``/``duplicate`` are the
#: summary statuses; ``abandoned`` is a recorded claim whose file vanished before it moved to
#: ``.work`` (an operator removed it).
ClaimStatus = Literal["claimed", "done", "failed", "duplicate", "abandoned"]
SettledStatus = Literal["done", "failed", "duplicate"]


class ClaimRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger keeps of one claim. ``claimed_at`` is Unix time (seconds);
    ``settled_as`` is the path, relative to the inbox, the file was moved to when it settled."""

    name: str
    sha256: str
    size: int
    claimed_at: float
    status: ClaimStatus = "claimed"
    settled_as: str = ""


class ClaimLedger(Protocol):
    """The part of the state store the inbox needs. Every write is durable when it returns
    (the inbox renames files right after), and may raise OSError/sqlite3.Error (SQLite) or
    StateError (PostgreSQL) when the store is unwritable (the daemon then exits non-zero and
    its supervisor restarts it)."""

    def record_claim(self, record: ClaimRecord) -> None:
        """Record a claim in flight. Idempotent by name: a claim of ``record.name`` already in
        flight is replaced (the same file claimed again after a crash, or a new file of that
        name whose earlier claim never reached ``.work``)."""
        ...

    def record_settled(self, name: str, status: SettledStatus, settled_as: str) -> None:
        """Mark the claim of ``name`` in flight as final, moved to ``settled_as``."""
        ...

    def record_abandoned(self, name: str) -> None:
        """Mark the claim of ``name`` in flight as abandoned (its file is gone)."""
        ...

    def lookup(self, name: str) -> ClaimRecord | None:
        """The latest claim of ``name`` (in flight or final), or None."""
        ...

    def in_flight(self) -> list[ClaimRecord]:
        """Every claim in flight, oldest first."""
        ...

    def find_completed(self, sha256: str) -> ClaimRecord | None:
        """The earliest claim of this content that completed (status ``done``), or None: a
        later manifest with the same content is a ``duplicate`` of it."""
        ...


class SharedLedger(ClaimLedger, Protocol):
    """A ledger several daemons share (:class:`~.leases.PostgresClaimLedger`): a claim is
    recorded only if its name is not in flight, and settled only under its lease."""

    def record_claim_if_absent(self, record: ClaimRecord) -> bool: ...

    def record_settled(
        self, name: str, status: SettledStatus, settled_as: str, *, lease: Lease | None = None
    ) -> None: ...


class MemoryClaimLedger:
    """A :class:`ClaimLedger` in memory (tests, dry runs): nothing survives the process."""

    def __init__(self) -> None:
        self._records: list[ClaimRecord] = []
        self._lock = threading.Lock()

    def _index_in_flight(self, name: str) -> int | None:
        for i in range(len(self._records) - 1, -1, -1):
            record = self._records[i]
            if record.name == name and record.status == "claimed":
                return i
        return None

    def record_claim(self, record: ClaimRecord) -> None:
        with self._lock:
            i = self._index_in_flight(record.name)
            fresh = msgspec.structs.replace(record, status="claimed", settled_as="")
            if i is None:
                self._records.append(fresh)
            else:
                self._records[i] = fresh

    def _finish(self, name: str, status: ClaimStatus, settled_as: str) -> None:
        with self._lock:
            i = self._index_in_flight(name)
            if i is None:
                raise KeyError(f"no claim in flight for {name!r}")
            self._records[i] = msgspec.structs.replace(
                self._records[i], status=status, settled_as=settled_as
            )

    def record_settled(self, name: str, status: SettledStatus, settled_as: str) -> None:
        self._finish(name, status, settled_as)

    def record_abandoned(self, name: str) -> None:
        self._finish(name, "abandoned", "")

    def lookup(self, name: str) -> ClaimRecord | None:
        with self._lock:
            for record in reversed(self._records):
                if record.name == name:
                    return record
        return None

    def in_flight(self) -> list[ClaimRecord]:
        with self._lock:
            return [r for r in self._records if r.status == "claimed"]

    def find_completed(self, sha256: str) -> ClaimRecord | None:
        with self._lock:
            for record in self._records:
                if record.sha256 == sha256 and record.status == "done":
                    return record
        return None


_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    claimed_at REAL NOT NULL,
    status TEXT NOT NULL,
    settled_as TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS claims_in_flight ON claims(name) WHERE status = 'claimed';
CREATE INDEX IF NOT EXISTS claims_sha256 ON claims(sha256, status);
"""


class SQLiteClaimLedger:
    """A :class:`ClaimLedger` in a SQLite file (WAL, synchronous=FULL: a recorded claim
    survives a power cut). The daemon's state store will carry the same table; this one stands
    alone for the parts built before it. Safe to call from worker threads (one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.where = f"state file {path}"
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock, self._named():
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_LEDGER_SCHEMA)

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """A SQLite error names the state file ("database or disk is full" alone said neither
        which database nor which disk), as the engine's state errors do."""
        try:
            yield
        except sqlite3.Error as err:
            if self.where in str(err):
                raise
            raise type(err)(f"{self.where}: {err}") from err

    def _row(self, row: tuple[str, str, int, float, str, str] | None) -> ClaimRecord | None:
        if row is None:
            return None
        name, sha256, size, claimed_at, status, settled_as = row
        return ClaimRecord(
            name=name,
            sha256=sha256,
            size=size,
            claimed_at=claimed_at,
            status=status,  # type: ignore[arg-type]
            settled_as=settled_as,
        )

    _COLUMNS = "name, sha256, size, claimed_at, status, settled_as"

    def record_claim(self, record: ClaimRecord) -> None:
        with self._lock, self._named(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "DELETE FROM claims WHERE name = ? AND status = 'claimed'", (record.name,)
            )
            self._db.execute(
                "INSERT INTO claims (name, sha256, size, claimed_at, status) "
                "VALUES (?, ?, ?, ?, 'claimed')",
                (record.name, record.sha256, record.size, record.claimed_at),
            )

    def _finish(self, name: str, status: ClaimStatus, settled_as: str) -> None:
        with self._lock, self._named():
            cursor = self._db.execute(
                "UPDATE claims SET status = ?, settled_as = ? "
                "WHERE name = ? AND status = 'claimed'",
                (status, settled_as, name),
            )
            if cursor.rowcount != 1:
                raise KeyError(f"no claim in flight for {name!r}")

    def record_settled(self, name: str, status: SettledStatus, settled_as: str) -> None:
        self._finish(name, status, settled_as)

    def record_abandoned(self, name: str) -> None:
        self._finish(name, "abandoned", "")

    def lookup(self, name: str) -> ClaimRecord | None:
        with self._lock, self._named():
            row = self._db.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE name = ? ORDER BY id DESC LIMIT 1",
                (name,),
            ).fetchone()
        return self._row(row)

    def in_flight(self) -> list[ClaimRecord]:
        with self._lock, self._named():
            rows = self._db.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE status = 'claimed' ORDER BY id"
            ).fetchall()
        return [r for r in map(self._row, rows) if r is not None]

    def find_completed(self, sha256: str) -> ClaimRecord | None:
        with self._lock, self._named():
            row = self._db.execute(
                f"SELECT {self._COLUMNS} FROM claims WHERE sha256 = ? AND status = 'done' "
                "ORDER BY id LIMIT 1",
                (sha256,),
            ).fetchone()
        return self._row(row)


# -- PostgreSQL: the claim ledger shared by several daemons, and manifest leases --------------
