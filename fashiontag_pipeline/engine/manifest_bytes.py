"""The bytes of a manifest: read in large chunks, gunzipped, cut after the last line end.

:class:`ManifestBytes` is the lower half of :class:`~.source.ManifestReader` (its records
half parses what this one hands over). It opens the file (or takes stdin), reads whatever is
available (``read1``: rows on a slow stdin are delivered as they arrive), detects gzip from
its magic bytes (multi-member files included, NUL padding after the data skipped; a file that
ends inside compressed data is a truncated manifest, never its end), and gives out bytes
holding only complete lines. At the end of a regular file it checks that the file is as long
as when it was opened and was read whole: a manifest rewritten in place while read is an
error, not a shorter manifest; and when the run ends, :meth:`ManifestBytes.changed_since_read`
looks once more (an exporter still appending when the reader reached the end).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal

from .._exceptions import ManifestError
from .._urls import shown_url
from .manifests import ManifestPrint, fingerprint, fingerprint_open

logger = logging.getLogger("fashiontag_pipeline.engine")

__all__ = [
    "GZIP_MAGIC",
    "MAX_LINE_BYTES",
    "READ_SIZE",
    "RESOURCE_ERRNOS",
    "Kind",
    "ManifestBytes",
    "ReadEnd",
    "csv_head",
]

#: ``errno`` values of an ``open`` or a read that fail for the process's lack of a resource
#: (its descriptor limit, the system's file table, memory), not for anything in the file: a
#: manifest met at such a moment is readable later, never "a manifest that cannot be read".
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

GZIP_MAGIC = b"\x1f\x8b"
#: A gzip member of nothing: what an ended decompressor is given to hold no bytes.
_EMPTY_MEMBER = bytes.fromhex("1f8b080000000000020303000000000000000000")
READ_SIZE = 1 << 20
#: What may follow a manifest's last line end and is no row: NUL bytes padding it to a block (a
#: tape or block device's, ``dd conv=sync``), a DOS end-of-file mark (Ctrl-Z, an old ERP's).
_END_PADDING = b"\x00\x1a"
#: The longest line a manifest may hold (also the CSV field limit: a row's one big field,
#: a ``data:`` image, and its few short ones). A line is held whole until its newline, and
#: decoded and parsed in copies of it: a file with no line end (a JSON array on one line, a
#: binary file, a dump cut before its first newline) took ~8 bytes of memory per byte of it
#: (765 MB for a 100 MB line) and would take the whole file into memory. Past it the manifest
#: is refused, naming the line.
MAX_LINE_BYTES = 64 << 20
Kind = Literal["csv", "jsonl", "urls"]


def csv_head(data: bytes) -> bool:
    """Whether the first bytes of an input are not those of a JSONL or URL list (see
    :meth:`ManifestReader.open`), before its format is known."""
    head = data.lstrip()
    while head.startswith(b"\xef\xbb\xbf"):  # (one or more: see ManifestReader.open)
        head = head[3:].lstrip()
    return not head.startswith(b"{") and not head[:8].lower().startswith((b"http://", b"https://"))


#: What a manifest cut or replaced after it was read means for the run's outcomes.
_NOT_THE_FILE_TAGGED = "the file at the path is no longer the one tagged"


#: Bytes of stdin a reader read and handed on to no one (a submit refused after it had read
#: stdin's first chunk to learn its format), as (the stream, its bytes): the next reader of
#: that stream reads them first, so that a retry reads stdin from its start.
_stdin_unread: list[tuple[object, bytes]] = []


def stdin_file() -> os.stat_result | None:
    """The regular file stdin is (``run - < products.jsonl``), None when it is none (a pipe,
    closed): a run's outputs are checked against it, as against a manifest named."""
    try:
        info = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):  # (None, closed, a stand-in)
        return None
    return info if stat.S_ISREG(info.st_mode) else None


class ReadEnd:
    """A manifest file as its reader found it (device, inode, size) and whether the reader
    reached its end: a few ints a run keeps until it ends, when :meth:`changed` looks at the
    path once more (the reader is closed and dropped by then)."""

    __slots__ = ("name", "opened", "opened_mtime_ns", "path", "reached", "read_print")

    def __init__(self, name: str) -> None:
        self.name = name
        #: Where it is looked at again: a relative name from the directory it was opened in (a
        #: program's ``os.chdir`` mid-run, where a file of the same name is, took that file for
        #: the one read, and a complete run for one whose manifest was replaced).
        self.path = _absolute(name)
        #: (st_dev, st_ino, st_size) of a regular file opened by path; None for stdin.
        self.opened: tuple[int, int, int] | None = None
        #: Its modification time then: one written since, its size unchanged, is hashed.
        self.opened_mtime_ns: int | None = None
        #: The fingerprint of the bytes read (the run's, taken when it started).
        self.read_print: ManifestPrint | None = None
        self.reached = False

    def changed(self) -> str | None:
        """How the manifest changed after it was read to its end and what that means (None
        when it has not, and for stdin): longer than the bytes read (an exporter still
        appending when the reader reached the end: rows appended were not tagged), shorter,
        or another file at its path (renamed over it): no longer the file tagged. One stat
        (blocking), once per run. A path that names nothing now (a cleanup job) is no change:
        every row of the file was read. Another file of the very bytes read (an exporter
        that writes the dump again unchanged, ``write tmp; mv``) is no change either: the
        same command finds the run complete (it is hashed then, once)."""
        if self.opened is None or not self.reached:
            return None
        try:
            now = os.stat(self.path)
        except OSError:
            return None
        dev, ino, size = self.opened
        if (now.st_dev, now.st_ino) != (dev, ino) and not self._same_bytes():
            return (
                f"manifest {self.name} names another file than the one the run read"
                f" (replaced after the run had read it to its end): {_NOT_THE_FILE_TAGGED}"
            )
        if now.st_size > size:
            return (
                f"manifest {self.name} grew after the run had read it to its end"
                f" ({size:,} bytes read, {now.st_size:,} now): the rows appended after the read"
                " were not tagged"
            )
        if now.st_size < size:
            return (
                f"manifest {self.name} was cut after the run had read it to its end"
                f" ({size:,} bytes read, {now.st_size:,} now): {_NOT_THE_FILE_TAGGED}"
            )
        if (
            now.st_mtime_ns != self.opened_mtime_ns
            and self.opened_mtime_ns is not None
            and self.read_print is not None
            and self.read_print.sha256 is not None
            and not self._same_bytes()
        ):
            # Written in place, its size unchanged: a copy that set the file's size first
            # (NUL bytes, then the rows) and paused; a mere touch keeps the bytes read.
            return (
                f"manifest {self.name} was written again after the run had read it to its end"
                f" (its size unchanged, {size:,} bytes, its content not the one read: a copy"
                f" that set its size first and filled it later): {_NOT_THE_FILE_TAGGED}"
            )
        return None

    def _same_bytes(self) -> bool:
        """Whether the file at the path now holds the bytes read (size and SHA-256)."""
        read = self.read_print
        if read is None or read.sha256 is None or read.size is None or read.size < 0:
            return False
        try:
            now = fingerprint(self.path)
        except ManifestError:  # a folder or a pipe at the path now
            return False
        return (now.size, now.sha256) == (read.size, read.sha256)


def _absolute(name: str) -> str:
    try:
        return name if name == "-" else os.path.abspath(name)
    except OSError:  # (the working directory removed: the name as it is)
        return name


#: What a manifest named by a URL is told: manifests are files (or stdin), not downloaded.
_A_URL = (
    "a URL: a manifest is a local file or stdin; download it, or pipe it in:"
    " curl -fsS URL | fashiontag run -, aws s3 cp URL - | fashiontag run -"
)


class ManifestBytes:
    """The bytes of one manifest (blocking; see the module). ``kind`` and ``header`` are the
    records half's: what is known of the format decides where a chunk without a line feed
    may be cut."""

    def __init__(self, path: str) -> None:
        self.name = "-" if path == "-" else str(path)
        #: The name its rows' rejects give (``source``): the one its job recorded when a
        #: resume names the file otherwise (moved, relative from elsewhere).
        self.label = self.name
        self._fh: BinaryIO
        if path == "-":
            stdin = sys.stdin  # None in a process started with its standard input closed
            # (A stand-in a program set, io.StringIO or its own, may have no ``closed``.)
            buffer = getattr(stdin, "buffer", None)
            if buffer is None or getattr(stdin, "closed", False):
                raise ManifestError(
                    "cannot read manifest -: this process has no standard input"
                    if stdin is None or buffer is not None
                    else "cannot read manifest -: standard input here has no bytes to read (a"
                    " stand-in for it, a notebook's): give the manifest as a file"
                )
            self._fh = buffer
            self._owns = False
        else:
            try:
                self._fh = open(Path(path), "rb", buffering=READ_SIZE)  # noqa: SIM115
            except OSError as err:
                if err.errno in RESOURCE_ERRNOS:
                    raise  # the process is short of descriptors or memory, not the file
                url = "://" in str(path) and not os.path.lexists(path)  # (never downloaded)
                raise ManifestError(
                    f"cannot read manifest {shown_url(path) if url else path}: {err.strerror}"
                    + (f" ({_A_URL})" if url and err.errno == errno.ENOENT else "")
                ) from None
            self._owns = True
        #: Bytes read from the file (compressed ones for gzip) and its size when it is a
        #: regular file (None for stdin or a pipe): the progress line's estimate of the total.
        self.bytes_read = 0
        #: Stdin's bytes read so far, until a batch of its rows is read (see :meth:`close`).
        self._kept: list[bytes] | None = None if self._owns else []
        self.size: int | None = None
        #: Where reading starts (stdin redirected from a file another command read part of).
        self._offset0 = 0
        #: What the run looks at again when it ends (kept after the reader is dropped).
        self.read_end = ReadEnd(self.name)
        try:
            info = os.fstat(self._fh.fileno())
            if stat.S_ISREG(info.st_mode):
                self.size = info.st_size
                self._offset0 = os.lseek(self._fh.fileno(), 0, os.SEEK_CUR)
                if self._owns:
                    self.read_end.opened = (info.st_dev, info.st_ino, info.st_size)
                    self.read_end.opened_mtime_ns = info.st_mtime_ns
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        self._gunzip: Any = None
        self._sniffed = False
        self._pending = b""
        self._eof = False
        self.kind: Kind = "csv"
        self.header: list[str] = []
        #: Lines parsed so far (the records half counts them): where a line too long is.
        self._line = 0

    def close(self) -> None:
        """Close the file; stdin stays open, and the bytes read from it before any row was
        handed on (its format learnt, then its job refused) are read first by the next reader."""
        if self._owns:
            self._fh.close()
        elif self._kept:
            _stdin_unread[:] = [(self._fh, b"".join(self._kept))]
        self._kept = None

    def handing_on(self) -> None:
        """Rows of it are handed on (a batch read): the bytes read are no longer given back."""
        self._kept = None

    def fingerprint(self, stop: Callable[[], bool] | None = None) -> ManifestPrint:
        """Size and SHA-256 of the file this reader has open (blocking): the bytes it reads,
        whatever the path names by now. None of either for stdin or a pipe. InterruptedError
        once ``stop()`` is true (a stop while the run starts)."""
        fd = self._fh.fileno() if self._owns and self.size is not None else None
        self.read_end.read_print = fingerprint_open(self.name, fd, stop)
        return self.read_end.read_print

    def changed_since_read(self) -> str | None:
        """How this manifest changed after it was read to its end (:class:`ReadEnd`)."""
        return self.read_end.changed()

    def _read_raw(self) -> bytes:
        if _stdin_unread and _stdin_unread[0][0] is self._fh:  # (a refused reader's: see close)
            data = _stdin_unread.pop()[1]
            self._offset0 -= len(data) if self.size is not None else 0  # (read before it)
        else:
            read1 = getattr(self._fh, "read1", None)
            data = (
                bytes(read1(READ_SIZE))
                if read1 is not None
                else os.read(self._fh.fileno(), READ_SIZE)
            )
        if self._kept is not None:
            self._kept.append(data)
        self.bytes_read += len(data)
        return data

    def _read_bytes(self) -> bytes:
        """The next decompressed bytes; b"" at end of input."""
        while True:
            raw = self._read_raw()
            if not self._sniffed and raw:
                # The magic is two bytes; a pipe's first read may hold one.
                while len(raw) < len(GZIP_MAGIC) and (more := self._read_raw()):
                    raw += more
                self._sniffed = True
                if raw[:2] == GZIP_MAGIC:
                    self._gunzip = zlib.decompressobj(wbits=31)
            if self._gunzip is None:
                return raw
            if not raw:
                if not self._gunzip.eof:
                    # The file ended inside a gzip member: rows are missing, never "the end".
                    raise ManifestError(
                        f"manifest {self.name} is a truncated gzip file (it ends after "
                        f"{self.bytes_read:,} bytes, inside compressed data): rows are missing"
                    )
                return b""
            try:
                out: bytes = self._gunzip.decompress(raw)
                while self._gunzip.eof and self._gunzip.unused_data:
                    rest = self._after_member()
                    if rest is None:
                        break
                    self._gunzip = zlib.decompressobj(wbits=31)
                    out += self._gunzip.decompress(rest)
            except zlib.error as err:
                raise ManifestError(
                    f"manifest {self.name} is not valid gzip after {self.bytes_read:,} bytes: {err}"
                ) from None
            if out:
                return out

    def _after_member(self) -> bytes | None:
        """The bytes after a gzip member's end: the next member's (a multi-member gzip,
        ``cat a.gz b.gz``), or None for NUL bytes padding the file (a block device's, ``dd
        conv=sync``), which gzip and zcat skip: the decompressor is then one that has ended
        and holds nothing, and bytes read later are looked at the same way. Anything else
        after the gzip data is refused: rows of another kind would be lost."""
        rest: bytes = self._gunzip.unused_data.lstrip(b"\0")
        if not rest:
            self._gunzip = zlib.decompressobj(wbits=31)
            self._gunzip.decompress(_EMPTY_MEMBER)
            return None
        if not GZIP_MAGIC.startswith(rest[:2]):
            raise ManifestError(
                f"manifest {self.name} has bytes that are not gzip after the end of its gzip"
                f" data (trailing garbage, within its first {self.bytes_read:,} bytes): rows"
                " in them could not be read; remove them, or gzip them as a member of their own"
            )
        return rest

    def _next_records(self) -> bytes | None:
        """Bytes holding only complete lines, or None at end of input."""
        while True:
            if self._eof:
                if self._pending:
                    data, self._pending = self._pending, b""
                    if data.endswith(b"\n"):
                        return data
                    if not data.strip(_END_PADDING):
                        return None  # (after the last line end: no row)
                    if self.size is None and self._gunzip is None:
                        self._said_cut()
                    return data + b"\n"
                return None
            chunk = self._read_bytes()
            if not chunk:
                self._check_unchanged()
                self._eof = self.read_end.reached = True
                continue
            data = self._pending + chunk
            # (A newline inside a quoted CSV field is no record boundary: the csv module finds
            # a record the cut went through, see csvchunk.)
            cut = data.rfind(b"\n") + 1
            if cut == 0 and self.kind == "csv" and (self.header or csv_head(data)):
                # No LF at all: a CSV saved with bare CR line ends (Excel for Mac). The csv
                # module ends a line at a CR too, so cut after the last one that has a byte
                # after it (not the CR of a CRLF the read went through); else the whole
                # manifest was held (and copied at every read) until its last byte. (A JSONL
                # or URL list with bare CRs is refused at its first line: see open.)
                cut = data.rfind(b"\r", 0, len(data) - 1) + 1
            if cut == 0:
                if len(data) > MAX_LINE_BYTES:
                    raise ManifestError(
                        f"manifest {self.name} line {self._line + 1:,} is longer than"
                        f" {MAX_LINE_BYTES >> 20} MiB (no line end in its first"
                        f" {len(data):,} bytes): not a manifest of one row per line"
                    )
                self._pending = data
                continue
            self._pending = data[cut:]
            return data[:cut]

    def _said_cut(self) -> None:
        """A plain stream (stdin, a pipe) that ended without a line end: its last line may be
        a producer's, cut where it stopped (``head -c``, a killed ``curl``), and no byte says
        which. It is read as it is (a file may end so), and said."""
        logger.warning(
            "manifest %s ended without a line end: its last line (line %d) was read as it is;"
            " if the command writing it failed, its rows were cut there: pipe the whole stream"
            " again with --resume (each row is sent once), or gzip it on the way (a cut gzip"
            " stream is refused)",
            self.name,
            self._line + 1,
        )

    def _check_unchanged(self) -> None:
        """At the end of a regular file: as long as it was when opened, and read whole. A
        manifest rewritten in place while read (``cp`` or ``> m.csv`` truncate it first)
        ends early: never taken for the manifest's end. (Its mtime alone is not compared: a
        ``touch`` or a backup tool changes it, not the rows.)"""
        if self.size is None:
            return
        try:
            info = os.fstat(self._fh.fileno())
        except (OSError, ValueError):
            return
        if self.bytes_read != self.size - self._offset0 or info.st_size != self.size:
            raise ManifestError(
                f"manifest {self.name} changed while it was read ({self.size:,} bytes when"
                f" opened, {info.st_size:,} now, {self.bytes_read:,} read): its rows may be"
                " cut short or mixed with another version's"
            )
