"""The state in a SQLite file (``--state PATH``, the embedded default): WAL, locked while open.

:class:`StateDB` is the SQLite backend of :class:`~.store.StateStore`: it opens (or creates)
the file, takes an exclusive lock beside it for as long as the state is open (two runs on one
state would both resume it and write the same outputs), sets the pragmas that bound its memory
and write volume, and inserts a batch's new ids in one statement.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from ... import _exceptions as exc
from ..fileids import RESULT_STORE_ID, wal_begun
from ..outfiles import (
    drop_sidecars,
    identities,
    keep_held,
    keep_lock_file,
    lock_file,
    sqlite_files,
)
from .idset import DeferredIds
from .schema import LONG_IDS_VERSION, SCHEMA, STATE_FILE_BASE, STATE_FILE_VERSION, TABLES
from .store import StateStore

__all__ = ["RECLAIM_MIN_BYTES", "STATE_CACHE_KIB", "WAL_CHECKPOINT_PAGES", "StateDB"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: SQLite page cache of the state file. It is the one part of the engine's memory that grows
#: with the run until its cap (the ids table behind run-wide dedupe), so it is kept small:
#: 16 MiB made a 1M-row run peak 1.21x a 100k one, 4 MiB 1.07x, for ~4% more CPU. A larger
#: cache would not help at scale either: 10M random catalogue ids make a ~400 MB B-tree that no
#: cache holds (the OS page cache serves it), and sequential ids only touch its right edge.
STATE_CACHE_KIB = 4096
_COUNTER = "INTEGER NOT NULL DEFAULT 0"
_JOB_COLUMNS_ADDED = (
    ("reused", _COUNTER),
    ("pages", _COUNTER),
    ("tasks", _COUNTER),
    ("failure", "TEXT"),
    ("rows_read", _COUNTER),
)

#: WAL pages before SQLite copies them into the state file (its default is 1,000).
WAL_CHECKPOINT_PAGES = 4000

#: Free space in a completed run's state file past which it is rebuilt smaller
#: (:meth:`StateDB.reclaim`; what remains is small, so the rebuild takes milliseconds).
RECLAIM_MIN_BYTES = 256 << 10


def _lock_exclusively(path: Path, at: Path) -> int:
    """An exclusive lock on ``PATH.lock`` for as long as the state is open: two runs on one
    state file would both resume it and write the same outputs. Released by :meth:`close`, or
    by the kernel when the process dies (kill -9 leaves no stale lock); the lock file holds a
    line and is the one at its path (:func:`~..outfiles.lock_file`); ``at``: its
    :func:`lock_path`, kept while the state is open (:meth:`StateDB.keep_lock`)."""
    fd = lock_file(at, _locker(path))
    try:
        _older_build_free(path, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _locker(path: Path) -> Callable[[int], None]:
    """The lock of the state file ``path``'s lock file: refused when another run holds it."""

    def lock(fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path) from None

    return lock


def _older_build_free(path: Path, held: int) -> None:
    """StateInUseError when a run of an older build holds the state named through the
    symlink ``path``: those builds locked ``PATH.lock`` beside the name given, and one such
    run still at work when fashiontag was upgraded and a new build's run on the same link
    (outputs of its own) both worked on one state. Looked at, not held: builds started later
    take the lock beside the file (``held``: the same file when a folder above is the link)."""
    given = path.with_name(path.name + ".lock")
    if given == lock_path(path):
        return
    try:
        fd = os.open(given, os.O_RDONLY)
    except OSError:
        return  # (none there: no older build's run on this name)
    try:
        ours, there = os.fstat(held), os.fstat(fd)
        if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino):
            return
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise exc.StateInUseError(
            f"state file {path} is in use by another run (its lock {given}, beside the"
            " symlink, is held by a run of an earlier fashiontag); wait for that run to end,"
            " or give this one another --state (and outputs of its own)"
        ) from None
    except OSError:
        pass  # (a file system without locks)
    finally:
        os.close(fd)


def lock_path(path: Path) -> Path:
    """``PATH.lock`` beside the file ``path`` leads to: a state named through a symlink
    (``current.state`` -> the dated file, the link in one cron line and the file in another)
    had a lock beside each name, and two runs worked on one state at once."""
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + ".lock")


def _in_use(path: Path) -> exc.StateInUseError:
    return exc.StateInUseError(
        f"state file {path} is in use by another run (its lock {lock_path(path)} is held); "
        "wait for that run to end, or give this one another --state (and outputs of its own)"
    )


def state_free(path: Path) -> None:
    """StateConflictError when another process holds the lock of the state file ``path``;
    nothing made (a lock file not there, or unreadable, is no run at work)."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(path) from None
    except OSError:
        pass  # (a file system without locks)
    finally:
        os.close(fd)


class StateDB(DeferredIds, StateStore):
    """The SQLite state file (WAL), locked while open; its run-wide dedupe is
    :class:`~.idset.DeferredIds`'s."""

    LONG_IDS_MARK = f"PRAGMA user_version={LONG_IDS_VERSION}"
    LONG_IDS_CLEAR = f"PRAGMA user_version={STATE_FILE_BASE}"

    def __init__(self, path: Path, *, cache_kib: int = STATE_CACHE_KIB) -> None:
        self.path = path
        self.where = f"state file {path}"
        self.location = str(path.absolute())  # (summaries name it absolute, as the outputs)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_at = lock_path(path)
            self._lock = _lock_exclusively(path, self._lock_at)
        except OSError as err:
            raise exc.StateError(f"cannot use state file {path}: {err.strerror or err}") from None
        try:
            self.db = self._connect(path, cache_kib)
        except sqlite3.Error as err:
            os.close(self._lock)
            raise exc.StateError(f"cannot use state file {path}: {err}") from None
        except BaseException:
            os.close(self._lock)
            raise
        try:
            self._ids_open()
        except BaseException as err:
            self.db.close()
            os.close(self._lock)
            if isinstance(err, sqlite3.Error):
                raise exc.StateError(f"cannot use state file {path}: {err}") from None
            raise
        #: The state file, its -wal and -shm as opened (:meth:`keep_lock`); one removed.
        self._held = identities(*self._files())
        self._gone: Path | None = None

    @staticmethod
    def _connect(path: Path, cache_kib: int) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > STATE_FILE_VERSION:
            # Before anything is written to it, or read from it and acted on: a layout this
            # build does not know would be misread (outputs cut back to a wrong checkpoint).
            db.close()
            raise exc.SchemaTooNewError(
                f"state file {path} has layout version {version}, written by a newer"
                f" fashiontag; this one reads up to version {STATE_FILE_VERSION}: upgrade"
                " fashiontag to go on with it (it is left untouched; another --state starts"
                " a new run, and tags every row again)"
            )
        (app,) = db.execute("PRAGMA application_id").fetchone()
        if app == RESULT_STORE_ID:
            # --state and --reuse swapped: the state's tables went into the store, and the
            # state's path became a new, empty store (every row tagged, and billed, again).
            db.close()
            raise exc.StateError(
                f"state file {path} is a fashiontag result store (--reuse STORE): give --state"
                " another path (the store is left as it is)"
            )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # A bounded page cache keeps memory flat however many ids the run holds.
        db.execute(f"PRAGMA cache_size=-{cache_kib}")
        # Write volume (200k rows): SQLite builds with SECURE_DELETE (Debian's do) zero every
        # freed page and write it again, so each chunk body deleted after its task drained went
        # through the WAL twice; FAST zeroes only what costs no extra page write (WAL 76.9 ->
        # 52.2 MB). A 16 MB WAL (4,000 pages, not 1,000) lets a checkpoint copy a page that
        # several commits rewrote once: file writes 30.6 -> 19.6 MB, reads 51 -> 38 MB.
        db.execute("PRAGMA secure_delete=FAST")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        db.executescript(SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
        if "n_ok" not in columns:  # state files written before n_ok
            db.execute("ALTER TABLE chunks ADD COLUMN n_ok INTEGER")
        for column in ("written_at", "service_at"):  # (files written before: NULL, unknown)
            if column not in columns:
                db.execute(f"ALTER TABLE chunks ADD COLUMN {column} REAL")
        columns = {row[1] for row in db.execute("PRAGMA table_info(chunk_bodies)")}
        if "ids" not in columns:  # state files written before a chunk's ids were kept apart
            db.execute("ALTER TABLE chunk_bodies ADD COLUMN ids BLOB")
        columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        # Columns of jobs that older builds lacked: reused (before --reuse), pages and tasks
        # (the first builds with jobs, 2026-11-23 03:56-04:46), failure and rows_read (before
        # a job kept its failure). Each checked alone: each ALTER is its own commit.
        for column, kind in _JOB_COLUMNS_ADDED:
            if column not in columns:
                db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
        if version < STATE_FILE_BASE:  # new, or of a build before the version was kept
            db.execute(f"PRAGMA user_version={STATE_FILE_BASE}")
        wal_begun(db)  # (a cleanup of empty files leaves it while the state is open)
        return db

    def mark_complete(self, when: str) -> None:
        """As :meth:`StateStore.mark_complete`, the file's version that of what it holds
        then (a completed run's runs stay until :meth:`reclaim` deletes them)."""
        with self.transaction():
            self.set_meta("completed_at", when)
            self._complete_version()
        self.reclaim()

    def reclaim(self) -> None:
        """Give back the space of a completed run: its ids (the run-wide dedupe, ~25 bytes a
        row; a completed run is never resumed, the same manifests again have nothing to do,
        other manifests start a new run that empties the state) and any chunk body left are
        deleted, and the file is rebuilt from what remains (``VACUUM``: the tasks, chunks
        and jobs, small). Without it a state file kept its peak size for good: 81% free
        pages after a 2M-row run (265 MB). Not needed for the run's correctness: a failure
        is logged, not raised.

        Not ``auto_vacuum``: keeping the file compact during the run cost ~1,200
        instructions an image (~2% of the engine's CPU) for space only the end needs."""
        try:
            with self.transaction():
                # Only once no job is open: an engine that took several jobs (a library
                # caller, the daemon) may end "complete" with a job it could not finish left
                # open for the next start, which resumes it from its ids and chunk bodies.
                if self.db.execute("SELECT 1 FROM jobs WHERE state != 'complete'").fetchone():
                    return
                self._ids_reset()
                self.db.execute("DELETE FROM chunk_bodies")
            (free,) = self.db.execute("PRAGMA freelist_count").fetchone()
            (size,) = self.db.execute("PRAGMA page_size").fetchone()
            if free * size >= RECLAIM_MIN_BYTES:
                self.db.execute("VACUUM")
        except sqlite3.Error as err:
            logger.warning("%s: free space not given back: %s", self.where, err)

    @property
    def closed(self) -> bool:
        return self._lock < 0

    def keep_lock(self) -> None:
        """Keep the lock file of a state held for weeks (the daemon's, at each look of its
        health loop; not thread-safe with :meth:`close`): :func:`~..outfiles.keep_lock_file`,
        which raises StateInUseError when another run holds the one made again. The lock
        stays beside the file locked at the open, even if a symlink named as the state now
        leads elsewhere (a lock beside the new file would leave the old one unlocked). The
        state file, its ``-wal`` and ``-shm`` are kept from a cleanup by age too
        (:func:`~..outfiles.keep_fresh`: an idle daemon writes none of them for weeks)."""
        if self._lock < 0:
            return
        self._lock = keep_lock_file(self._lock, self._lock_at, _locker(self.path))
        gone = keep_held(self._held, self._files())
        if gone is not None:
            self._gone = gone
            raise exc.StateError(
                f"state file {self.path}: {gone} was removed (or replaced) while the state was"
                " open; stopping before more is committed into the removed file (what it"
                " holds is written back at the stop when nothing is at its path)"
            )

    def _files(self) -> tuple[Path, Path, Path]:
        """The state file (the one its lock is beside), its ``-wal`` and ``-shm``."""
        return sqlite_files(self._lock_at.with_suffix(""))

    def _copy_back(self) -> Path | None:
        """The state file removed under this process (:meth:`keep_lock`) copied, beside its
        path, from the connection that still holds it (committed, the removed ``-wal``'s
        commits too), put at its path once closed (:meth:`close`); None when another file was
        put there, or its ``-wal`` alone was removed (the close's checkpoint copies it into
        the file: nothing lost)."""
        path = self._files()[0]
        if self._gone != path or os.path.lexists(path):
            return None
        copy_at = path.with_name(f".{path.name}.{os.getpid()}.back")
        try:
            with contextlib.closing(sqlite3.connect(copy_at)) as copy:
                self.db.backup(copy)
        except (OSError, sqlite3.Error) as err:
            logger.error("%s: removed while open, and not written back: %s", self.where, err)
            return None
        return copy_at

    def _put_back(self, copy_at: Path) -> None:
        """The copy of :meth:`_copy_back` at the state file's path (once the connection to the
        removed file is closed, and its ``-wal`` and ``-shm`` removed from beside the path:
        :func:`~..outfiles.drop_sidecars`), the lock still held: put there after its release,
        a second run started meanwhile found no file and began an empty state at the path,
        the copy left aside."""
        path = self._files()[0]
        try:
            os.link(copy_at, path)  # (never over a file put there meanwhile)
            os.unlink(copy_at)
        except OSError as err:
            logger.error("%s: removed while open; its copy is %s (%s)", self.where, copy_at, err)
        else:
            logger.warning("%s: removed while open; written back from the open state", self.where)

    def close(self) -> None:
        """Close the file and release its lock (idempotent). The ids waiting in ``ids_log``
        go into ``ids`` first (left there, for the next open, if that fails)."""
        if self._lock < 0:
            return
        try:
            self._ids_close()
        except sqlite3.Error as err:
            logger.warning("%s: ids left in ids_log for the next start: %s", self.where, err)
        copy_at = self._copy_back() if self._gone is not None else None
        lock, self._lock = self._lock, -1
        try:
            self.db.close()
            drop_sidecars(self._held, self._files()[0])  # (its state file moved under it)
            if copy_at is not None:  # (the lock still held: no second run begins there first)
                self._put_back(copy_at)
        finally:
            os.close(lock)

    def begin(self) -> None:
        # IMMEDIATE: the write lock at once, so a transaction never fails half way for a lock.
        self.db.execute("BEGIN IMMEDIATE")
        self._ids_committed()  # (changes made outside a transaction were committed as made)

    def commit(self) -> None:
        try:
            self._ids_before_commit()
            self.db.execute("COMMIT")
        except BaseException:
            self._ids_rolled_back()  # (the caller rolls the transaction back)
            raise
        self._ids_committed()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._ids_rolled_back()

    def _wipe(self) -> None:
        with self.transaction():
            for table in TABLES:
                if table != "ids":
                    self.db.execute(f"DELETE FROM {table}")
            self._ids_reset()
