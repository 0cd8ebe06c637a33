"""Results in SQLite (``--sink sqlite``): one row per image, checkpointed by rowid."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._exceptions import StateError
from .fileids import RESULT_STORE_ID
from .outfiles import lock_output, removed_from
from .pages import PageRow
from .sqlite_columns import columns

if TYPE_CHECKING:
    from .sinks import ReusedLine

__all__ = ["SqliteResultSink"]

#: The page size of a new results file (SQLite's default is 4 KiB).
_PAGE_SIZE = 16384


class SqliteResultSink:
    """Results in SQLite: one row per image (id, task, status, category, item, error, JSON,
    reused: 1 for a row answered from the result store).

    Rows are keyed by image id, so a page written twice (after a crash) is written once. The
    checkpoint is the largest ``rowid``: rows are only ever added at the end (SQLite gives a
    new row the largest rowid plus one), so cutting back to a checkpoint deletes exactly the
    rows written since, and a checkpoint of 0 (a new run) empties the table.

    A results file written before these checkpoints (``PRAGMA user_version`` 0 with rows in
    it) recorded counts of rows instead, which rowids do not match after a resume: resuming
    one keeps its rows as they are (as that version did); a new run empties it and marks it."""

    #: ``PRAGMA user_version`` of a results file whose checkpoints are rowids.
    ROWID_CHECKPOINTS = 1

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            # A new file's pages are 16 KiB, not 4: a result (~1.6 KB of JSON) and its id's
            # index entry cost a quarter of the page writes and system calls (WAL frames,
            # checkpoint copies). Only a file with no page yet takes it (an existing file
            # keeps its own size: a no-op); any SQLite reader reads either.
            self._db.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as err:
            # Last night's JSONL results under --sink sqlite (a cron line that kept its
            # --out): the bare "file is not a database" named no file.
            self._db.close()
            raise StateError(
                f"{path} is not an SQLite results file ({err}): --sink sqlite writes a"
                " database; give it another --out (or move this file away)"
            ) from None
        foreign = self._foreign()
        if foreign is not None:
            # Before any write: a new run cuts its results file back to nothing, and the
            # result store's table is named results too (a store given as --out emptied).
            self._db.close()
            raise StateError(
                f"{path} is {foreign}, not an SQLite results file: --sink sqlite writes a"
                " database of its own; give it another --out (this file is left as it is)"
            )
        try:
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, task_id TEXT NOT NULL,"
                " status TEXT NOT NULL, category TEXT, item TEXT, item_confidence REAL,"
                " error_code INTEGER, result TEXT NOT NULL, reused INTEGER NOT NULL DEFAULT 0)"
            )
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(results)")}
            if "reused" not in columns:  # a results file written before --reuse
                self._db.execute("ALTER TABLE results ADD COLUMN reused INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error as err:  # (locked by another program's write: see truncate)
            self._db.close()
            raise self._failed(err) from None
        # An fd of its own on the file, to tell whether it is still at its path (removed()).
        self._probe = os.open(path, os.O_RDONLY)
        try:
            lock_output(self._probe, path)
        except BaseException:
            os.close(self._probe)
            self._db.close()
            raise
        self._last = self._last_rowid()
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        self._rowids = version >= self.ROWID_CHECKPOINTS
        if not self._rowids and self._last == 0:
            self._mark_rowids()

    def _foreign(self) -> str | None:
        """What the file is when it is another kind of SQLite database (None: a results file
        of ours, or a new one): the ``--reuse`` result store, or another program's."""
        (app,) = self._db.execute("PRAGMA application_id").fetchone()
        if app == RESULT_STORE_ID:
            return "a fashiontag result store (--reuse)"
        if app:
            return f"another program's SQLite database (application id {app:#x})"
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(results)")}
        if columns and not {"id", "task_id", "result"} <= columns:
            return "another program's SQLite database (its results table is not ours)"
        return None

    def _mark_rowids(self) -> None:
        self._db.execute(f"PRAGMA user_version = {self.ROWID_CHECKPOINTS}")
        self._rowids = True

    def write_page(self, task_id: str | None, rows: list[PageRow]) -> None:
        """Single-endpoint results (``task_id`` None) are stored with task_id ''."""
        self._insert([(row.id, task_id or "", row.tagging_result) for row in rows], reused=0)

    def write_reused(self, rows: list[ReusedLine]) -> None:
        """Rows answered from the result store: ``reused`` = 1, the original task id."""
        self._insert([(row.id, row.task_id, row.tagging_result) for row in rows], reused=1)

    def _insert(self, rows: list[tuple[str, str, msgspec.Raw]], *, reused: int) -> None:
        values = []
        for ident, task_id, raw in rows:
            # (A byte that is not UTF-8, from a server writing ISO-8859-1, becomes U+FFFD.)
            text = bytes(raw).decode("utf-8", "replace")
            values.append((ident, task_id, *columns(raw), text, reused))
        try:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO results (id, task_id, status, category, item,"
                " item_confidence, error_code, result, reused) VALUES (?,?,?,?,?,?,?,?,?)",
                values,
            )
            self._db.execute("COMMIT")
        except sqlite3.Error as err:  # a full disk: name the file, as the JSONL sinks do
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise self._failed(err) from err
        self._last = self._last_rowid()

    def _failed(self, err: sqlite3.Error) -> OSError:
        """``err`` as an error that names the file."""
        return OSError(errno.EIO, str(err), str(self.path))

    def _last_rowid(self) -> int:
        (last,) = self._db.execute("SELECT max(rowid) FROM results").fetchone()
        return int(last or 0)

    def ids_among(self, ids: set[str]) -> set[str]:
        """Which of ``ids`` have a row."""
        found: set[str] = set()
        wanted = list(ids)
        for start in range(0, len(wanted), 900):
            part = wanted[start : start + 900]
            marks = ",".join("?" * len(part))
            found.update(
                r[0]
                for r in self._db.execute(f"SELECT id FROM results WHERE id IN ({marks})", part)
            )
        return found

    def task_ids(self, task_id: str) -> set[str]:
        """Ids of the rows written for ``task_id``."""
        return {
            r[0] for r in self._db.execute("SELECT id FROM results WHERE task_id=?", (task_id,))
        }

    def checkpoint(self) -> int:
        return self._last

    def truncate(self, checkpoint: int, *, results_committed: bool = True) -> None:
        """Delete the rows written after ``checkpoint`` (what the state says was committed;
        0: every row, a new run). ``results_committed``: whether the job has committed a
        result row; an older file (see the class) is only emptied when it has not, since that
        version could record a checkpoint of 0 over rows it had committed."""
        if not self._rowids and (checkpoint > 0 or results_committed):
            return  # an older file resumed: its checkpoint is a count, not a rowid
        if self._last < checkpoint:
            raise StateError(
                f"{self.path} holds rows up to {self._last:,} but the state counts rows up to"
                f" {checkpoint:,} written: committed rows are missing from it (the file was"
                " removed, replaced or changed); start over with --restart (run) to write"
                " it again"
            )
        try:
            self._db.execute("DELETE FROM results WHERE rowid > ?", (checkpoint,))
            self._last = self._last_rowid()
            self._mark_rowids()
        except sqlite3.Error as err:
            # Another program's write transaction on the file (a table of its own) past the
            # 5 s wait: "OperationalError: database is locked" named no file, and the state
            # beside it is an SQLite database too.
            raise self._failed(err) from None

    def salvage(self) -> None:
        """Keep the rows the file holds now (rows are whole: nothing to cut)."""
        return None

    def removed(self) -> bool:
        """Whether the file was removed or replaced at its path since it was opened."""
        return removed_from(self.path, self._probe, 0)

    def made_again(self) -> None:
        return None  # (never empty: a cleanup of empty files leaves it)

    def flush(self, fsync: bool) -> None:
        return None

    def close(self) -> None:
        # Every row into the file itself: SQLite folds the WAL in at the last connection's
        # close only, so with a reader connected (a dashboard) the results stayed in r.db-wal
        # and a copy of r.db alone held no table. PASSIVE waits for no reader; it fsyncs.
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        self._db.close()
        if self._probe >= 0:
            os.close(self._probe)
            self._probe = -1


def committed_row_id(path: Path, checkpoint: int) -> tuple[bool, str | None, str | None, bool]:
    """(whether the results file at ``path`` can hold a run's rows, the id of its row at
    ``checkpoint``, or of its first row at 0: rows written, none counted, that row's task, and
    whether it was answered from the result store) for :func:`~.outcome.not_ours`, as
    :func:`~.sinks.committed_last_id` is for JSONL. No row there, a file of the older format
    (its checkpoint a count) or one that cannot be read: taken, id None. The task is None for
    a row of the single endpoint or of the result store. Blocking."""
    try:
        # (A URI of the path quoted: ``?``, ``#`` or ``%`` in a file name are its own.)
        uri = Path(path).absolute().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version < SqliteResultSink.ROWID_CHECKPOINTS:
                return True, None, None, False
            found = db.execute(
                "SELECT id, reused, task_id FROM results WHERE rowid = ?"
                if checkpoint > 0
                else "SELECT id, reused, task_id FROM results WHERE ? = 0 ORDER BY rowid LIMIT 1",
                (checkpoint,),
            ).fetchone()
    except sqlite3.Error:
        return True, None, None, False
    if found is None:
        return True, None, None, False
    reused = bool(found[1])
    task = None if reused or not found[2] else str(found[2])
    return True, str(found[0]), task, reused
