"""The result store of ``--reuse``: successful tagging results kept under their request's
fingerprint (:mod:`.fingerprint`), on disk, so an unchanged image is never paid for twice.

One SQLite file (WAL), its own schema, versioned (``PRAGMA user_version``) and marked as ours
(``PRAGMA application_id``)::

    results(fp BLOB UNIQUE, task_id, stored_at, result)
                 fp: 16-byte fingerprint (its unique index is what a lookup searches; rows
                 are appended in rowid order, so storing a page's results writes the table
                 sequentially and only the small index entries land at random places);
                 task_id: the task that produced the result; stored_at: epoch seconds;
                 result: the raw taggingResult JSON bytes
    runs(run_id, started_at, finished_at, looked_up, reused, stored)
                 one row per engine run that used the store (``reuse stats``: hit rate)

Memory stays flat in the catalogue size: lookups and inserts are batched (one ``IN (...)``
query per ``LOOKUP_BATCH`` fingerprints), nothing is cached in Python, and SQLite's page cache
is bounded (``CACHE_KIB``).

Opening (:meth:`ResultStore.open`):

* a missing file (or an empty one) is created, and :attr:`ResultStore.created` says so (the
  CLI prints it: the first night tags everything);
* a file that is not a result store (another SQLite file, a damaged one, garbage, a newer
  schema) raises :class:`~fashiontag_pipeline.ResultStoreError` naming the file. It is never
  replaced silently: a store that cannot be read would otherwise turn into a full, billed
  re-tag of the catalogue. Corruption found later (a damaged page read mid-run) raises the
  same error and the run stops with its state saved.

Two connections: one for lookups (the engine's intake, in a worker thread) and one for writes
(stored results, run records, prune), so a lookup never waits on a commit (WAL readers do not
block the writer). Each connection is used from one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, Self

import msgspec

from ... import _exceptions as exc
from ..._postgres import is_postgres_url
from ..fileids import RESULT_STORE_ID, wal_begun
from ..outfiles import drop_sidecars, identities, sqlite_files
from .durations import DAY
from .failures import store_error

__all__ = ["APPLICATION_ID", "DEFAULT_MAX_AGE", "SCHEMA_VERSION", "LastRun", "ResultStore"]
__all__ += ["ResultStoreAPI", "StoreStats", "StoredResult", "open_store"]

#: ``PRAGMA application_id`` of a result store (see :mod:`..fileids`).
APPLICATION_ID = RESULT_STORE_ID
SCHEMA_VERSION = 1
DEFAULT_MAX_AGE = 30 * DAY
#: Fingerprints per lookup query (well under SQLite's bound-parameter limit).
LOOKUP_BATCH = 500
#: SQLite page cache per connection, in KiB: memory flat however large the store is.
CACHE_KIB = 4096
_BUSY_MS = 30_000

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS results (fp BLOB NOT NULL UNIQUE, task_id TEXT NOT NULL,"
    " stored_at REAL NOT NULL, result BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS results_stored_at ON results (stored_at)",
    "CREATE TABLE IF NOT EXISTS runs (run_id INTEGER PRIMARY KEY, started_at REAL NOT NULL,"
    " finished_at REAL NOT NULL, looked_up INTEGER NOT NULL, reused INTEGER NOT NULL,"
    " stored INTEGER NOT NULL)",
)


class StoredResult(NamedTuple):
    """A stored result: the task that produced it and its raw taggingResult JSON."""

    task_id: str
    result: bytes


class LastRun(msgspec.Struct, frozen=True, kw_only=True):
    """What the last run that used the store did with it."""

    started_at: float
    finished_at: float
    looked_up: int
    reused: int
    stored: int

    @property
    def hit_rate(self) -> float | None:
        """Reused rows / rows looked up (None when it looked nothing up)."""
        return self.reused / self.looked_up if self.looked_up else None


class StoreStats(msgspec.Struct, frozen=True, kw_only=True):
    """``fashiontag reuse stats``: rows, size on disk, oldest/newest result, the last run."""

    path: str
    rows: int
    size_bytes: int
    oldest: float | None
    newest: float | None
    last_run: LastRun | None


Clock = Callable[[], float]


def last_run_of(row: Sequence[Any] | None) -> LastRun | None:
    """The last run from a ``SELECT started_at, finished_at, looked_up, reused, stored`` row."""
    if row is None:
        return None
    started, finished, looked_up, reused, stored = row
    return LastRun(
        started_at=started,
        finished_at=finished,
        looked_up=looked_up,
        reused=reused,
        stored=stored,
    )


class _Closable(Protocol):
    def close(self) -> None: ...


class StoreConnections:
    """What both result stores share: a reader and a writer connection, closed together
    (lookups never wait on a commit)."""

    _reader: _Closable
    _writer: _Closable
    _closed: bool

    def close(self) -> None:
        """Close both connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._reader.close()
        finally:
            self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ResultStoreAPI(Protocol):
    """What a result store offers, in a file (:class:`ResultStore`) or in PostgreSQL
    (:class:`~.pgstore.PostgresResultStore`)."""

    @property
    def path(self) -> object:
        """Where it is, as messages show it."""

    @property
    def created(self) -> bool:
        """Whether it held nothing before this run."""

    def lookup(self, fps: Sequence[bytes], *, newer_than: float) -> dict[bytes, StoredResult]: ...

    def put(self, rows: Iterable[tuple[bytes, str, bytes]], *, stored_at: float) -> int: ...

    def record_run(
        self, *, started_at: float, finished_at: float, looked_up: int, reused: int, stored: int
    ) -> None: ...

    def stats(self) -> StoreStats: ...

    def prune(self, older_than: float) -> int: ...

    def close(self) -> None: ...


def open_store(location: str | Path, *, create: bool = True) -> ResultStoreAPI:
    """The result store at ``location``: a ``postgresql://`` URL, or a file."""
    if is_postgres_url(str(location)):
        from .pgstore import PostgresResultStore

        return PostgresResultStore.open(str(location), create=create)
    return ResultStore.open(location, create=create)


class ResultStore(StoreConnections):
    """A result store file; see the module docstring. Use :meth:`open`."""

    was_empty: bool = False  # the file was there, empty
    _reader: sqlite3.Connection
    _writer: sqlite3.Connection

    def __init__(
        self, path: Path, reader: sqlite3.Connection, writer: sqlite3.Connection, *, created: bool
    ) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        #: True when :meth:`open` created the file (it did not exist, or was empty).
        self.created = created
        self._closed = False
        self._real = Path(os.path.realpath(path))
        self._held = identities(*sqlite_files(self._real))

    def close(self) -> None:
        """As :meth:`StoreConnections.close`; a store file moved under it (a backup restored
        by ``mv``) is then opened as it was put (:func:`~..outfiles.drop_sidecars`)."""
        closed = self._closed
        super().close()
        if not closed:
            drop_sidecars(self._held, self._real)

    # -------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | Path, *, create: bool = True) -> ResultStore:
        """Open the store at ``path``; create it when missing (unless ``create`` is False).

        Raises :class:`~fashiontag_pipeline.ResultStoreError` (naming the file) for a file
        that is not a readable result store of this version."""
        path = Path(path)
        try:
            size = path.stat().st_size if path.exists() else -1
        except OSError as err:
            raise cls._error(path, err) from None
        created = size <= 0
        if created and not create:
            what = "does not exist" if size < 0 else "is an empty file, not a result store"
            raise exc.ResultStoreError(f"result store {path} {what}")
        writer: sqlite3.Connection | None = None
        try:
            if created:
                path.parent.mkdir(parents=True, exist_ok=True)
            writer = cls._connect(path)
            created = cls._prepare(path, writer, created)
            if create:  # (a run's, a daemon's: never an empty -wal under them, see wal_begun)
                wal_begun(writer)  # (not `reuse stats`: a look wrote the store, its time now)
            reader = cls._connect(path)
        except (sqlite3.Error, OSError) as err:
            if writer is not None:
                writer.close()
            raise cls._error(path, err) from None
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        store = cls(path, reader, writer, created=created)
        store.was_empty = created and size == 0  # (see setup.said_created)
        return store

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        # WAL with synchronous=NORMAL: no fsync per commit (one per checkpoint). A power loss
        # may drop the last commits (their rows are tagged again next time), never corrupt the
        # store.
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    @staticmethod
    def _prepare(path: Path, db: sqlite3.Connection, created: bool) -> bool:
        """Check (or create) the store's schema; returns whether this opener created it.

        A file without our application id is looked at again under the write lock: another
        run may be creating the same store at this very moment (two cron jobs, the first
        night), and reading its header between that run's steps found an id of 0 and a version
        of 1, or tables without an id, and refused the store it had just made."""
        (app,) = db.execute("PRAGMA application_id").fetchone()
        if app == 0:
            db.execute("BEGIN IMMEDIATE")  # waits (busy timeout) for a creator to commit
            try:
                (app,) = db.execute("PRAGMA application_id").fetchone()
                (version,) = db.execute("PRAGMA user_version").fetchone()
                if app == 0:
                    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                    if tables or version:
                        raise exc.ResultStoreError(
                            f"{path} is an SQLite file but not a fashiontag result store: give "
                            "--reuse another path (it is left untouched)"
                        )
                    for statement in _SCHEMA:
                        db.execute(statement)
                    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    db.execute("COMMIT")
                    db.execute("PRAGMA journal_mode=WAL")
                    return True
                db.execute("ROLLBACK")  # created meanwhile by another run: check it below
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            created = False
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if app != APPLICATION_ID:
            raise exc.ResultStoreError(
                f"{path} is not a fashiontag result store (SQLite application id {app:#x}): "
                "give --reuse another path (it is left untouched)"
            )
        if version > SCHEMA_VERSION:
            raise exc.ResultStoreError(
                f"result store {path} has schema version {version}, newer than this version of "
                f"fashiontag reads ({SCHEMA_VERSION}): upgrade fashiontag"
            )
        db.execute("PRAGMA journal_mode=WAL")
        # Reads the schema and the first pages: a damaged header fails here, not mid-run.
        db.execute("SELECT count(*) FROM runs").fetchone()
        db.execute("SELECT fp FROM results ORDER BY stored_at DESC LIMIT 1").fetchone()
        return created

    @staticmethod
    def _error(path: Path, err: BaseException) -> exc.ResultStoreError:
        return store_error(path, err)

    # -------------------------------------------------------------- the engine's calls

    def lookup(self, fps: Sequence[bytes], *, newer_than: float) -> dict[bytes, StoredResult]:
        """The stored results of ``fps`` stored at or after ``newer_than`` (epoch seconds):
        one query per :data:`LOOKUP_BATCH` fingerprints. Reader connection."""
        found: dict[bytes, StoredResult] = {}
        unique = list(dict.fromkeys(fps))
        db = self._reader
        try:
            for start in range(0, len(unique), LOOKUP_BATCH):
                part = unique[start : start + LOOKUP_BATCH]
                marks = ",".join("?" * len(part))
                for fp, task_id, result in db.execute(
                    f"SELECT fp, task_id, result FROM results WHERE fp IN ({marks})"
                    " AND stored_at >= ?",
                    (*part, newer_than),
                ):
                    found[fp] = StoredResult(task_id, result)
        except sqlite3.Error as err:
            raise self._error(self.path, err) from None
        return found

    def put(self, rows: Iterable[tuple[bytes, str, bytes]], *, stored_at: float) -> int:
        """Store ``(fp, task_id, raw result)`` rows, replacing older results of the same
        fingerprints; one transaction. Returns the rows written. Writer connection."""
        values = [(fp, task_id, stored_at, bytes(result)) for fp, task_id, result in rows]
        if not values:
            return 0
        db = self._writer
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO results (fp, task_id, stored_at, result)"
                    " VALUES (?, ?, ?, ?)",
                    values,
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # (SQLite rolls back itself on a full disk)
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            raise self._error(self.path, err) from None
        return len(values)

    def record_run(
        self, *, started_at: float, finished_at: float, looked_up: int, reused: int, stored: int
    ) -> None:
        """Record what a run did with the store (``reuse stats`` shows the last one)."""
        try:
            self._writer.execute(
                "INSERT INTO runs (started_at, finished_at, looked_up, reused, stored)"
                " VALUES (?, ?, ?, ?, ?)",
                (started_at, finished_at, looked_up, reused, stored),
            )
        except sqlite3.Error as err:
            raise self._error(self.path, err) from None

    # -------------------------------------------------------------- operators' calls

    def stats(self) -> StoreStats:
        """Rows, size on disk (the file and its WAL), oldest/newest result, the last run."""
        db = self._writer
        try:
            (rows,) = db.execute("SELECT count(*) FROM results").fetchone()
            oldest, newest = db.execute(
                "SELECT min(stored_at), max(stored_at) FROM results"
            ).fetchone()
            last = db.execute(
                "SELECT started_at, finished_at, looked_up, reused, stored FROM runs"
                " ORDER BY run_id DESC LIMIT 1"
            ).fetchone()
        except sqlite3.Error as err:
            raise self._error(self.path, err) from None
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(f"{self.path}{suffix}").st_size
        return StoreStats(
            path=str(self.path),
            rows=rows,
            size_bytes=size,
            oldest=oldest,
            newest=newest,
            last_run=last_run_of(last),
        )

    def prune(self, older_than: float, *, now: Clock = time.time) -> int:
        """Delete results stored more than ``older_than`` seconds ago; returns how many.
        Deletes in bounded transactions (a long prune never holds the write lock for long),
        then checkpoints the WAL so the space is reusable, and gives it a first frame: left
        empty, a ``find /data -empty -delete`` took it from under a daemon holding the store,
        every other opener failed ("disk I/O error") and a kill -9 lost its results since."""
        cutoff = now() - older_than
        db = self._writer
        deleted = 0
        try:
            while True:
                cur = db.execute(
                    "DELETE FROM results WHERE rowid IN (SELECT rowid FROM results"
                    " WHERE stored_at < ? ORDER BY stored_at LIMIT 10000)",
                    (cutoff,),
                )
                deleted += cur.rowcount
                if cur.rowcount < 10000:
                    break
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            wal_begun(db)  # (0 bytes now: a cleanup of empty files took it under its holders)
        except sqlite3.Error as err:
            raise self._error(self.path, err) from None
        return deleted
