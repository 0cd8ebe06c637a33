"""Sinks: where outcomes go. Results JSONL (default), results SQLite (:mod:`.sqlite_sink`),
rejects JSONL; each output locked while open and watched for removal (:mod:`.outfiles`).

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

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import msgspec

from .._exceptions import StateError, StateInUseError
from .outfiles import lock_output, removed_from
from .pages import PageRow
from .result_lines import page_lines
from .sqlite_sink import SqliteResultSink

__all__ = [
    "JsonlResultSink",
    "LineSet",
    "Reject",
    "RejectSink",
    "ResultSink",
    "ReusedLine",
    "SqliteResultSink",
    "committed_last_id",
    "open_result_sink",
]


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


class LineSet:
    """Line numbers, a bit each up to the highest: the lines of a stdin with a reject, which a
    resume of it asks about. (A set of ints took ~95 bytes a reject: a night's dump with
    millions of duplicates or bad rows cost its resume hundreds of MB; this is 1.25 MB for 10M
    lines.)"""

    __slots__ = ("_bits",)

    def __init__(self) -> None:
        self._bits = bytearray()

    def add(self, line: int) -> None:
        if line < 0:
            return
        byte = line >> 3
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte + 1 - len(self._bits)))
        self._bits[byte] |= 1 << (line & 7)

    def __contains__(self, line: object) -> bool:
        if not isinstance(line, int) or line < 0 or line >> 3 >= len(self._bits):
            return False
        return bool(self._bits[line >> 3] >> (line & 7) & 1)


class _IdTask(msgspec.Struct, rename="camel", gc=False):
    id: str
    task_id: str


_id_task_decoder = msgspec.json.Decoder(_IdTask)


class _Id(msgspec.Struct, gc=False):
    id: str | None = None


class FirstLine(msgspec.Struct, gc=False):
    """What :func:`committed_last_id` and :func:`uncommitted_first_line` read of a line: its
    id, its task (a results line; None for the single endpoint's), its manifest (a reject)."""

    id: str | None = None
    task_id: str | None = msgspec.field(default=None, name="taskId")
    source: str | None = None
    reused: bool = False


_id_decoder = msgspec.json.Decoder(_Id)
_first_line_decoder = msgspec.json.Decoder(FirstLine)
_reject_decoder = msgspec.json.Decoder(Reject)
_encoder = msgspec.json.Encoder()


class _AppendFile:
    """An append-only file with a byte checkpoint.

    Unbuffered: every write is a whole page group or a batch of rejects (one per commit), so a
    buffer would only add a copy of every result (~1.5 KB per image) before the same system
    call.

    Opened ``O_APPEND``, and the file's length is counted here (:attr:`_end`), not read back:
    a file cut short under the run (logrotate's ``copytruncate``, ``> results.jsonl``) takes
    the next lines at its new end instead of at the old offset behind a hole of NUL bytes,
    and stays shorter than the count, which :meth:`removed` tells."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = self._open(path)
        self._end = self._fh.seek(0, os.SEEK_END)

    @staticmethod
    def _open(path: Path) -> io.FileIO:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            lock_output(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "r+b", buffering=0)

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
        self._end = checkpoint

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
        self._end = keep

    def removed(self) -> bool:
        """Whether the file was removed, replaced or cut short at its path since it was
        opened (the lines written before are no longer there). One removed before a line was
        written to it (a cleanup job deleting empty files: a run's rejects, most nights) lost
        nothing: it is made again at its path."""
        if not removed_from(self.path, self._fh.fileno(), self._end):
            return False
        return not self._made_again()

    def _made_again(self) -> bool:
        """The file, removed with nothing written to it, made again at its path (False when
        lines were written to it, or something else is at its path now)."""
        if self._end or os.path.lexists(self.path):
            return False
        try:
            fh = self._open(self.path)
        except (OSError, StateInUseError):
            return False
        self._fh.close()
        self._fh, self._end = fh, fh.seek(0, os.SEEK_END)
        return self._end == 0

    def made_again(self) -> None:
        """The file made again at its path (and locked) if it was removed before its first
        line (a cleanup of empty files). Made again at its first line only, an output stayed
        gone while its run waited for results (hours, for a slow service), and another run
        given the same ``--out`` with a state of its own found no file to be refused by: every
        row was tagged (and billed) again. Called after a poll of the tasks, once a second."""
        if not self._end and not self._fh.closed and removed_from(self.path, self._fh.fileno(), 0):
            self._made_again()

    def write(self, data: bytes) -> None:
        if not self._end and removed_from(self.path, self._fh.fileno(), 0):
            self._made_again()  # (its first line: the file may have been deleted empty)
        view = memoryview(data)
        while view:  # a write may take part of the bytes (a signal, a nearly full disk)
            try:
                written = self._fh.write(view)
            except OSError as err:  # a full disk, a file size limit: name the file
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            if not written:
                raise OSError(f"cannot write to {self.path}")
            self._end += written
            view = view[written:]

    def scan(self, start: int = 0) -> Iterator[bytes]:
        """Every complete line written so far (the file is flushed first), from ``start`` (a
        checkpoint: where a line begins) on."""
        self._fh.flush()
        end = self._end
        # Through the open descriptor, not the path: a file removed or renamed aside under
        # the job is still the one written (the job then fails; the engine goes on).
        fd = self._fh.fileno()
        rest = b""
        at = start
        while at < end:
            block = os.pread(fd, min(1 << 20, end - at), at)
            if not block:
                break
            at += len(block)
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
        return self._end

    def flush(self, fsync: bool) -> None:
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()


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

    def made_again(self) -> None: ...

    def flush(self, fsync: bool) -> None: ...

    def close(self) -> None: ...


class JsonlResultSink(_AppendFile):
    """Results JSONL: ``{"id", "taskId", "taggingResult"}`` per line, one write per page."""

    def write_page(self, task_id: str | None, rows: list[PageRow]) -> None:
        self.write(page_lines(task_id, rows))

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


class RejectSink(_AppendFile):
    """Rejects JSONL: ``{"id", "reason", "stage", "line", "source"}`` per line."""

    def write_rejects(self, rejects: list[Reject]) -> None:
        if rejects:
            self.write(_encoder.encode_lines(rejects))

    def ids_of_stage(self, stage: str, start: int = 0) -> Iterator[str]:
        """Ids of the rejects written at ``stage`` from the checkpoint ``start`` on, as the
        file is read (a scan of the file)."""
        return (r.id for r in self._where(b"stage", stage, start) if r.id is not None)

    def lines_of(self, source: str) -> LineSet:
        """The lines of ``source`` with a reject: a scan of the file, for a resume of stdin
        (:func:`~.stdin_replay.check_replayed`)."""
        lines = LineSet()
        for r in self._where(b"source", source):
            if r.source == source:
                lines.add(r.line)
        return lines

    def _where(self, key: bytes, value: str, start: int = 0) -> Iterator[Reject]:
        """The rejects whose line holds ``"key":value`` (only lines that do are decoded)."""
        needle = b'"' + key + b'":' + _encoder.encode(value)
        for line in self.scan(start):
            if needle in line:
                yield _reject_decoder.decode(line)


#: How far back from a checkpoint :func:`committed_last_id` looks for the line it ends.
_TAIL_SPAN = 1 << 20


def committed_last_id(path: Path, checkpoint: int) -> tuple[bool, FirstLine | None]:
    """(whether the JSONL file at ``path`` can hold a run's lines up to ``checkpoint``, the
    line that ends there). Not when a line does not end exactly at the checkpoint, or
    that line is not JSON with an ``id`` (another file now at the path, which a cut there
    would split mid-line). A file shorter than the checkpoint, or that cannot be read, is left
    to :meth:`_AppendFile.truncate` (it lost lines): taken, line None. Blocking."""
    if checkpoint <= 0:
        return True, None
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size < checkpoint:
                return True, None
            start = max(0, checkpoint - _TAIL_SPAN)
            fh.seek(start)
            tail = fh.read(checkpoint - start)
    except OSError:
        return True, None
    if not tail.endswith(b"\n"):
        return False, None
    cut = tail.rfind(b"\n", 0, len(tail) - 1)
    if cut < 0 and start > 0:
        return True, None  # a line longer than the span: not checked
    try:
        return True, _first_line_decoder.decode(tail[cut + 1 :])
    except msgspec.DecodeError:
        return False, None


def uncommitted_first_line(path: Path) -> tuple[bool, FirstLine | None]:
    """(whether the JSONL file at ``path`` can begin with a line of a run that committed none
    of its bytes, that line). Not when its first line is not JSON (another file at the
    path). An empty file, one without a whole line (a run killed in its first write) or that
    cannot be read is taken, with no line to look at: True, None. Blocking."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_TAIL_SPAN)
    except OSError:
        return True, None
    end = head.find(b"\n")
    if end < 0:
        return True, None
    try:
        return True, _first_line_decoder.decode(head[: end + 1])
    except msgspec.DecodeError:
        return False, None


def open_result_sink(path: Path, kind: str) -> ResultSink:
    """The result sink of ``kind`` (``jsonl`` or ``sqlite``) at ``path``."""
    if kind == "sqlite":
        return SqliteResultSink(path)
    return JsonlResultSink(path)
