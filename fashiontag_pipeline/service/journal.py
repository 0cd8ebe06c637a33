"""Write-through SQLite journal of the task store (WAL): every change the store makes in memory
is mirrored here, and :class:`~.store.TaskStore` rebuilds itself from it on start."""

from __future__ import annotations

import sqlite3
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

from .analyzer import Analysis
from .records import OUTCOME_DONE, OUTCOME_PENDING, TaskRecord

__all__ = ["Journal", "StateFileError"]

#: The tables of a state file, and columns of its ``tasks`` no other program's ``tasks`` has
#: all of (``fashiontag run --state`` keeps a ``tasks`` table too).
_TABLES = frozenset({"tasks", "images"})
_TASK_COLUMNS = frozenset({"task_id", "seq", "owner", "album_name", "created", "expire_at"})


class StateFileError(Exception):
    """The ``--state`` file cannot be opened, or is not a state file of this service."""


_SIGN = 1 << 63
_WRAP = 1 << 64


def _to_signed(value: int) -> int:
    return value - _WRAP if value >= _SIGN else value


def _to_unsigned(value: int) -> int:
    return value + _WRAP if value < 0 else value


class Journal:
    """Write-through SQLite mirror of the store."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the state file; :class:`StateFileError` when it cannot be opened,
        is no SQLite database, or holds another program's tables (nothing is written then)."""
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            raise StateFileError(f"cannot open it: {err}") from None
        try:
            self._check_tables()
            self._open()
        except sqlite3.Error as err:
            self._db.close()
            raise StateFileError(f"cannot use it: {err}") from None
        except StateFileError:
            self._db.close()
            raise

    def _check_tables(self) -> None:
        tables = {
            row[0]
            for row in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        }
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(tasks)")}
        if tables - _TABLES or ("tasks" in tables and not columns >= _TASK_COLUMNS):
            raise StateFileError(
                f"it is not a state file of fashiontag serve (it holds the tables "
                f"{', '.join(sorted(tables))}: another program's, `fashiontag run --state`?)"
            )

    def _open(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS tasks (
                task_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, owner BLOB NOT NULL,
                album_name TEXT NOT NULL, description TEXT, created REAL NOT NULL,
                expire_at REAL NOT NULL, done_at REAL, result_expire_at REAL,
                default_detection INTEGER NOT NULL, fetch INTEGER NOT NULL DEFAULT 0,
                purged INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL DEFAULT 0,
                failures INTEGER NOT NULL DEFAULT 0
            );
            CREATE TABLE IF NOT EXISTS images (
                task_id TEXT NOT NULL, idx INTEGER NOT NULL, image_id TEXT NOT NULL,
                hash INTEGER NOT NULL, mask INTEGER NOT NULL, outcome INTEGER NOT NULL,
                measured BLOB, url TEXT, PRIMARY KEY (task_id, idx)
            ) WITHOUT ROWID;
            """
        )
        # A purged task's counts are kept here (its images are gone): state files written
        # before these columns get them, and their purged tasks keep showing 0.
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(tasks)")}
        for column in ("total", "failures"):
            if column not in columns:
                self._db.execute(
                    f"ALTER TABLE tasks ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
                )

    def close(self) -> None:
        self._db.close()

    def _update_task(self, task: TaskRecord) -> None:
        self._db.execute(
            "UPDATE tasks SET expire_at=?, done_at=?, result_expire_at=?, fetch=?, purged=?,"
            " total=?, failures=? WHERE task_id=?",
            (
                task.expire_at,
                task.done_at,
                task.result_expire_at,
                int(task.outcomes is not None),
                int(task.purged),
                task.total,
                task.failures,
                task.task_id,
            ),
        )

    def insert_task(self, task: TaskRecord) -> None:
        self._db.execute(
            "INSERT INTO tasks (task_id, seq, owner, album_name, description, created, expire_at,"
            " done_at, result_expire_at, default_detection) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                task.task_id,
                task.seq,
                task.owner,
                task.album_name,
                task.description,
                task.created,
                task.expire_at,
                task.done_at,
                task.result_expire_at,
                task.default_detection,
            ),
        )

    def insert_images(
        self,
        task: TaskRecord,
        start: int,
        ids: list[str],
        hashes: list[int],
        masks: list[int],
        urls: list[str] | None,
        processed: bool,
    ) -> None:
        outcome = OUTCOME_DONE if processed else OUTCOME_PENDING
        tid = task.task_id
        rows: Iterable[tuple[object, ...]]
        if urls is None:
            rows = (
                (tid, start + i, ids[i], _to_signed(hashes[i]), masks[i], outcome, None)
                for i in range(len(ids))
            )
        else:
            rows = (
                (tid, start + i, ids[i], _to_signed(hashes[i]), masks[i], outcome, urls[i])
                for i in range(len(ids))
            )
        self._db.execute("BEGIN")
        try:
            self._db.executemany(
                "INSERT INTO images (task_id, idx, image_id, hash, mask, outcome, url)"
                " VALUES (?,?,?,?,?,?,?)",
                rows,
            )
            self._update_task(task)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def complete_range(self, task: TaskRecord, start: int, end: int) -> None:
        self._db.execute("BEGIN")
        self._db.execute(
            "UPDATE images SET outcome=?, url=NULL WHERE task_id=? AND idx>=? AND idx<?",
            (OUTCOME_DONE, task.task_id, start, end),
        )
        self._update_task(task)
        self._db.execute("COMMIT")

    def record(self, task: TaskRecord, index: int, analysis: Analysis | None, error: int) -> None:
        self._db.execute("BEGIN")
        if analysis is not None:
            self._db.execute(
                "UPDATE images SET outcome=?, hash=?, measured=?, url=NULL"
                " WHERE task_id=? AND idx=?",
                (
                    OUTCOME_DONE,
                    _to_signed(analysis.content_hash),
                    analysis.measured,
                    task.task_id,
                    index,
                ),
            )
        else:
            self._db.execute(
                "UPDATE images SET outcome=?, url=NULL WHERE task_id=? AND idx=?",
                (error, task.task_id, index),
            )
        self._update_task(task)
        self._db.execute("COMMIT")

    def purge(self, task: TaskRecord) -> None:
        self._db.execute("BEGIN")
        self._db.execute("DELETE FROM images WHERE task_id=?", (task.task_id,))
        self._update_task(task)
        self._db.execute("COMMIT")

    def forget(self, task_ids: Iterable[str]) -> None:
        self._db.execute("BEGIN")
        for task_id in task_ids:
            self._db.execute("DELETE FROM images WHERE task_id=?", (task_id,))
            self._db.execute("DELETE FROM tasks WHERE task_id=?", (task_id,))
        self._db.execute("COMMIT")

    def load_tasks(self) -> Iterator[TaskRecord]:
        cursor = self._db.execute(
            "SELECT task_id, seq, owner, album_name, description, created, expire_at, done_at,"
            " result_expire_at, default_detection, fetch, purged, total, failures FROM tasks"
            " ORDER BY seq"
        )
        for row in cursor.fetchall():
            task = TaskRecord(
                task_id=row[0],
                owner=bytes(row[2]),
                album_name=row[3],
                description=row[4],
                created=row[5],
                expire_at=row[6],
                default_detection=row[9],
                seq=row[1],
            )
            task.done_at = row[7]
            task.result_expire_at = row[8]
            if row[10]:
                task.outcomes = array("H")
                task.measured = []
            task.purged = bool(row[11])
            if task.purged:
                # Its images are gone (only a done task's results expire): the counts stay.
                task.total = task.processed = row[12]
                task.failures = row[13]
            yield task

    def load_images(
        self, task_id: str
    ) -> Iterator[tuple[str, int, int, int, bytes | None, str | None]]:
        cursor = self._db.execute(
            "SELECT image_id, hash, mask, outcome, measured, url FROM images WHERE task_id=?"
            " ORDER BY idx",
            (task_id,),
        )
        for image_id, h, mask, outcome, measured, url in cursor:
            yield image_id, _to_unsigned(h), mask, outcome, measured, url
