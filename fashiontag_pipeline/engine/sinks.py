"""Sinks: where outcomes go. Results JSONL (default), results SQLite, rejects JSONL.

Sinks are synchronous and confined to the state thread (:class:`~.state.Journal` calls them
together with the state commit that checkpoints them), so no sink write ever blocks the event
loop and a sink's checkpoint is always committed in the same transaction as the state it
reflects. On resume each sink is cut back to its last checkpoint (JSONL: byte length; SQLite:
rows are keyed by id, so re-writing a page is idempotent).

Result pages are decoded (:mod:`.pages`) into :class:`~.pages.PageRow`, which keeps
``taggingResult`` as raw JSON: the JSONL sink writes those bytes as they came, with no
re-encode.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import msgspec

from .._exceptions import StateConflictError, StateError
from .._models import TaggingResponse
from .pages import PageRow

__all__ = [
    "JsonlResultSink",
    "Reject",
    "RejectSink",
    "ResultSink",
    "ReusedLine",
    "SqliteResultSink",
    "open_result_sink",
]


class _OutLine(msgspec.Struct, rename="camel", gc=False):
    id: str
    task_id: str | None  # None (JSON null): a result of the single endpoint
    tagging_result: msgspec.Raw


class ReusedLine(msgspec.Struct, rename="camel", gc=False):
    """A results line of a row answered from the result store (``--reuse``): the row's own
    id, the task that produced the stored result, and ``"reused": true``."""

    id: str
    task_id: str
    tagging_result: msgspec.Raw
    reused: bool = True


class Reject(msgspec.Struct, omit_defaults=False, gc=False):
    """One rejects line (DESIGN 4.2)."""

    id: str | None
    reason: str
    stage: str
    line: int
    source: str


class _IdTask(msgspec.Struct, rename="camel", gc=False):
    id: str
    task_id: str


_id_task_decoder = msgspec.json.Decoder(_IdTask)


class _Id(msgspec.Struct, gc=False):
    id: str | None = None


_id_decoder = msgspec.json.Decoder(_Id)
_reject_decoder = msgspec.json.Decoder(Reject)
_typed_decoder = msgspec.json.Decoder(TaggingResponse)
_encoder = msgspec.json.Encoder()


class _AppendFile:
    """An append-only file with a byte checkpoint.

    Unbuffered: every write is a whole page group or a batch of rejects (one per commit), so a
    buffer would only add a copy of every result (~1.5 KB per image) before the same system
    call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock_output(fd, path)
        except BaseException:
            os.close(fd)
            raise
        self._fh = os.fdopen(fd, "r+b", buffering=0)
        self._fh.seek(0, os.SEEK_END)

    def truncate(self, checkpoint: int, *, results_committed: bool = True) -> None:
        """Cut the file back to ``checkpoint`` bytes (what the state says was committed;
        ``results_committed`` is for the SQLite sink).

        A file shorter than that lost lines the state counts as written (a machine that died
        before they reached the disk, a file replaced by hand): a :class:`StateError`, never a
        silent gap in the outputs."""
        self._fh.flush()
        size = self._fh.seek(0, os.SEEK_END)
        if size < checkpoint:
            raise StateError(
                f"{self.path} holds {size:,} bytes but the state counts {checkpoint:,} written: "
                "committed lines are missing from it (lost by the machine, or the file was "
                "changed); start over with --restart (run) to write it again"
            )
        if size > checkpoint:
            self._fh.truncate(checkpoint)
        self._fh.seek(checkpoint)

    def salvage(self) -> None:
        """Keep the complete lines the file holds now and append after them (a job whose
        committed lines are gone: what is left is kept, never cut back to a checkpoint)."""
        self._fh.flush()
        end = self._fh.seek(0, os.SEEK_END)
        keep = 0
        while end > 0:
            start = max(0, end - (1 << 16))
            self._fh.seek(start)
            cut = self._fh.read(end - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        self._fh.truncate(keep)
        self._fh.seek(keep)

    def removed(self) -> bool:
        """Whether the file was removed or replaced at its path since it was opened (the
        lines written before are no longer there)."""
        return _removed(self.path, self._fh.fileno())

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a write may take part of the bytes (a signal, a nearly full disk)
            try:
                written = self._fh.write(view)
            except OSError as err:  # a full disk, a file size limit: name the file
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            if not written:
                raise OSError(f"cannot write to {self.path}")
            view = view[written:]

    def scan(self) -> Iterator[bytes]:
        """Every complete line written so far (the file is flushed first)."""
        self._fh.flush()
        end = self._fh.tell()
        with open(self.path, "rb") as fh:
            rest = b""
            while fh.tell() < end:
                block = fh.read(min(1 << 20, end - fh.tell()))
                if not block:
                    break
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                yield from lines

    def ids_among(self, ids: set[str]) -> set[str]:
        """Which of ``ids`` have a line here (a scan of the file; rare paths only)."""
        found: set[str] = set()
        for line in self.scan():
            if line:
                ident = _id_decoder.decode(line).id
                if ident in ids:
                    found.add(ident)
        return found

    def checkpoint(self) -> int:
        return self._fh.tell()

    def flush(self, fsync: bool) -> None:
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()


def _lock_output(fd: int, path: Path) -> None:
    """An exclusive lock on an output for as long as it is open: two runs writing one file
    (two cron jobs given the same --out and their own --state) would cut back and append
    over each other's lines. Released when the file is closed or the process dies. A file
    system without locks (some network ones) is written unlocked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateConflictError(
            f"{path} is being written by another run (it holds a lock on the file): wait for"
            " that run to end, or give this one other outputs"
        ) from None
    except OSError:
        pass


def _removed(path: Path, fd: int) -> bool:
    """Whether the file open as ``fd`` is no longer at ``path``: the path is gone (removed,
    renamed, its folder removed) or the file has no name left (another file was renamed over
    it). Inode numbers are not compared: some file systems do not keep them stable. A path
    that cannot be checked (permissions, a network file system's error) is not called
    removed."""
    try:
        if os.fstat(fd).st_nlink == 0:
            return True
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


class ResultSink(Protocol):
    """Where tagging results go. Called from the state thread only."""

    path: Path

    def write_page(self, task_id: str | None, rows: list[PageRow]) -> None: ...

    def write_reused(self, rows: list[ReusedLine]) -> None: ...

    def task_ids(self, task_id: str) -> set[str]: ...

    def ids_among(self, ids: set[str]) -> set[str]: ...

    def checkpoint(self) -> int: ...

    def truncate(self, checkpoint: int, *, results_committed: bool = True) -> None: ...

    def salvage(self) -> None: ...

    def removed(self) -> bool: ...

    def flush(self, fsync: bool) -> None: ...

    def close(self) -> None: ...


class JsonlResultSink(_AppendFile):
    """Results JSONL: ``{"id", "taskId", "taggingResult"}`` per line, one write per page."""

    def write_page(self, task_id: str | None, rows: list[PageRow]) -> None:
        self.write(_encoder.encode_lines([_OutLine(r.id, task_id, r.tagging_result) for r in rows]))

    def write_reused(self, rows: list[ReusedLine]) -> None:
        """Lines of rows answered from the result store, ``"reused": true``."""
        if rows:
            self.write(_encoder.encode_lines(rows))

    def task_ids(self, task_id: str) -> set[str]:
        """Ids of the lines written for ``task_id`` (a scan of the file: only used on the rare
        path where a task's results expired partway through reading)."""
        needle = b'"taskId":' + _encoder.encode(task_id)
        found: set[str] = set()
        for line in self.scan():
            if needle in line:
                found.add(_id_task_decoder.decode(line).id)
        return found


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
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY, task_id TEXT NOT NULL,"
            " status TEXT NOT NULL, category TEXT, item TEXT, item_confidence REAL,"
            " error_code INTEGER, result TEXT NOT NULL, reused INTEGER NOT NULL DEFAULT 0)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(results)")}
        if "reused" not in columns:  # a results file written before --reuse
            self._db.execute("ALTER TABLE results ADD COLUMN reused INTEGER NOT NULL DEFAULT 0")
        # An fd of its own on the file, to tell whether it is still at its path (removed()).
        self._probe = os.open(path, os.O_RDONLY)
        try:
            _lock_output(self._probe, path)
        except BaseException:
            os.close(self._probe)
            self._db.close()
            raise
        self._last = self._last_rowid()
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        self._rowids = version >= self.ROWID_CHECKPOINTS
        if not self._rowids and self._last == 0:
            self._mark_rowids()

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
            typed = _typed_decoder.decode(raw)
            category = item = None
            confidence = None
            if typed.data is not None:
                for obj in typed.data.objects:
                    if obj.tags:
                        tag = obj.tags[0]
                        category = tag.category.name if tag.category else None
                        if tag.item is not None:
                            item, confidence = tag.item.name, tag.item.confidence
                        break
            values.append(
                (
                    ident,
                    task_id,
                    typed.status,
                    category,
                    item,
                    confidence,
                    typed.error.code if typed.error else None,
                    bytes(raw).decode(),
                    reused,
                )
            )
        self._db.execute("BEGIN")
        self._db.executemany(
            "INSERT OR REPLACE INTO results (id, task_id, status, category, item,"
            " item_confidence, error_code, result, reused) VALUES (?,?,?,?,?,?,?,?,?)",
            values,
        )
        self._db.execute("COMMIT")
        self._last = self._last_rowid()

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
        self._db.execute("DELETE FROM results WHERE rowid > ?", (checkpoint,))
        self._last = self._last_rowid()
        self._mark_rowids()

    def salvage(self) -> None:
        """Keep the rows the file holds now (rows are whole: nothing to cut)."""
        return None

    def removed(self) -> bool:
        """Whether the file was removed or replaced at its path since it was opened."""
        return _removed(self.path, self._probe)

    def flush(self, fsync: bool) -> None:
        return None

    def close(self) -> None:
        self._db.close()
        if self._probe >= 0:
            os.close(self._probe)
            self._probe = -1


class RejectSink(_AppendFile):
    """Rejects JSONL: ``{"id", "reason", "stage", "line", "source"}`` per line."""

    def write_rejects(self, rejects: list[Reject]) -> None:
        if rejects:
            self.write(_encoder.encode_lines(rejects))

    def ids_of_stage(self, stage: str) -> set[str]:
        """Ids of the rejects written at ``stage`` (a scan of the file; rare paths only)."""
        needle = b'"stage":' + _encoder.encode(stage)
        found: set[str] = set()
        for line in self.scan():
            if needle in line:
                ident = _reject_decoder.decode(line).id
                if ident is not None:
                    found.add(ident)
        return found


def open_result_sink(path: Path, kind: str) -> ResultSink:
    """The result sink of ``kind`` (``jsonl`` or ``sqlite``) at ``path``."""
    if kind == "sqlite":
        return SqliteResultSink(path)
    return JsonlResultSink(path)
