"""Source: manifests (CSV with header, or JSONL; plain or gzip; files or stdin) as row batches.

Bytes are read in large chunks in a worker thread (``read1`` returns whatever is available, so
rows on a slow stdin are delivered as they arrive), cut after the last newline (a CSV record
the cut went through is read on with the next bytes: :mod:`.csvchunk`), and parsed in one go:
one await per chunk, never per line. Memory is one chunk plus one batch. The bytes half
(opening, gzip, cutting at line ends, the check that the file did not change while read) is
:mod:`.manifest_bytes`; this module parses records into batches.

The format is detected from the first bytes (after gzip, itself detected from its magic bytes):
``{`` starts JSONL; an ``http://`` or ``https://`` URL starts a plain URL list (one URL per
line, no header); anything else must be a CSV header naming ``id`` and ``url``.

A URL list's rows take the URL itself as their id: it is stable (the same image has the same
id in tonight's dump and tomorrow's, whatever lines were added or removed around it, so
resumes and incremental runs line up), and a URL listed twice is the same image, so it is
tagged once and the repeat is a ``duplicate id`` reject. A line number would shift with every
edit of the list and give the same image a new id each night.

A batch holds at most ``max_rows`` rows (the engine's ``read_batch_rows``): a 1 MiB chunk of a
CSV is ~14,000 rows, and the bounded streams between stages hold several batches, so capping
rows (not bytes) is what keeps the memory in flight small and independent of the manifest.
"""

from __future__ import annotations

import csv
import errno
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anyio
import msgspec

try:
    import resource
except ImportError:  # (not on Windows)
    resource = None  # type: ignore[assignment]

from .._exceptions import ManifestError
from . import strays
from .csvchunk import MAX_HEADER_BYTES, CsvChunk, cut_unnamed, header_record, top_lines, unnamed_end
from .foreign_heads import empty_manifest, missing_columns, urls_under_header, what_else
from .manifest_bytes import MAX_LINE_BYTES, RESOURCE_ERRNOS, ManifestBytes
from .rows import JsonLines, JsonRows, PlainChunk, RowBatch
from .rules import CONTEXT_FIELDS

__all__ = [
    "RESOURCE_ERRNOS",
    "ManifestReader",
    "manifests_size",
    "open_manifest",
    "open_manifests",
]

MAX_ROWS = 2000
#: The columns of a CSV manifest that the engine reads (others are ignored).
READ_COLUMNS = frozenset({"id", "url", "detection", "age", *CONTEXT_FIELDS})
#: Each read column by its name in lower case: a header's names are taken in any case (``ID``,
#: ``Url``, ``Brand``: an Excel or ERP export), once per manifest.
_READ_BY_LOWER = {name.lower(): name for name in READ_COLUMNS}

#: The header a URL list is read with: each row is (url, url), the URL being its own id.
URL_LIST_HEADER = ["id", "url"]

_json_decoder = msgspec.json.Decoder()
#: BOMs at a line's start: parts of an export, each written with one, joined with ``cat``.
_LINE_BOMS = re.compile("(?:^|(?<=[\r\n]))\ufeff+")


# A ``data:`` URI is a legitimate CSV field (it routes to single mode), and one of an image up
# to the engine's 20 MiB file cap is ~27 MB of base64: the csv module's default 128 KiB field
# limit would stop the run on it. The limit is process-wide, so it is only ever raised.
CSV_FIELD_LIMIT = MAX_LINE_BYTES
if csv.field_size_limit() < CSV_FIELD_LIMIT:
    csv.field_size_limit(CSV_FIELD_LIMIT)


class ManifestReader(ManifestBytes):
    """Blocking reader of one manifest; :meth:`read_batch` is called in a worker thread."""

    def __init__(self, path: str, source: int, max_rows: int = MAX_ROWS) -> None:
        super().__init__(path)
        self.source = source
        self.max_rows = max(1, max_rows)
        self._head: str | None = None
        #: The text being parsed came from bytes that are not all UTF-8 (each stray byte kept as
        #: a lone surrogate): the rows holding one become rejects in :meth:`_take`.
        self._dirty = False
        self._head_dirty = False
        self._unnamed = 0  # empty names the CSV header ends with (csvchunk.unnamed_end)
        # The chunk being parsed: its CSV records or its lines (JSONL), the line number before
        # the chunk and the line count consumed so far within it.
        self._csv: CsvChunk | None = None
        self._lines: list[str] | None = None
        # A CSV chunk with no quote, CR or NUL: its lines, split at commas without the csv
        # module (the same fields; see _start).
        self._plain: PlainChunk | None = None
        self._base = 0
        self._done = 0

    # -------------------------------------------------------------- records

    def open(self) -> None:
        """Read up to the header and detect the format; ManifestError if it cannot be read."""
        while True:
            data = self._next_records()
            if data is None:
                raise ManifestError(empty_manifest(self.name))
            text, dirty = strays.decode(data, "utf-8-sig" if self._line == 0 else "utf-8")
            if self._line == 0:  # (a BOM written twice: one kept as text, then saved with one)
                text = text.lstrip("\ufeff")
            stripped = text.lstrip()
            if not stripped:
                self._line += text.count("\n")
                continue
            self._head_dirty = dirty
            if stripped.startswith("{"):
                first = stripped.partition("\n")[0]
                if "\x00" in first and (what := what_else(first)):
                    # (No JSON line holds a NUL byte: UTF-16 without a BOM, SQL Server's bcp -w.)
                    raise ManifestError(f"manifest {self.name} {what}")
                if first.strip() == "{":  # (an object's first line, as a pretty-printer ends it)
                    raise ManifestError(
                        f"manifest {self.name} is pretty-printed JSON (each object spans several"
                        " lines), not JSONL: give one object per line (jq -c . FILE > FILE.jsonl)"
                    )
                self.kind = "jsonl"
                self._check_line_ends(stripped, "\r{")
                self._head = text
                return
            if stripped[:8].lower().startswith(("http://", "https://")):
                self.kind = "urls"
                self._check_line_ends(stripped.lower(), "\rhttp")
                self.header = list(URL_LIST_HEADER)
                self._head = text
                return
            self.kind = "csv"
            lines = top_lines(text)  # (where the csv module ends them; enough for the header)
            # The header is the first record after blank lines (it may span several lines).
            skip = 0
            while not lines[skip].strip():
                skip += 1
            held = len(data) + len(self._pending)  # (read on for a header so far only)
            last = (self._eof and not self._pending) or held > MAX_HEADER_BYTES
            record = header_record(lines[skip:], last=last)
            if record is None:  # a header cell's line break the read stopped after: read on
                self._pending = data + self._pending
                continue
            header, span = record
            if dirty and strays.has_stray("".join(lines[skip : skip + span])):
                raise ManifestError(
                    f"manifest {self.name} "
                    + (
                        what_else(lines[skip])
                        or "is neither CSV nor JSONL (its first line is not UTF-8 text)"
                    )
                )
            self._line += skip + span
            names = [_READ_BY_LOWER.get(h.strip().lower(), h.strip()) for h in header]
            self._unnamed = unnamed_end(names)  # (``id,url,``: no third column)
            names = names[: len(names) - self._unnamed]
            missing = [c for c in ("id", "url") if c not in names]
            if missing:
                raise ManifestError(
                    f"manifest {self.name} "
                    + (
                        what_else(lines[skip])
                        or urls_under_header(header, lines[skip + span : skip + span + 1])
                        or missing_columns(missing, header, lines[skip + span :])
                    )
                )
            self._check_columns(names)
            self.header = names
            self._head = text[sum(map(len, lines[: skip + span])) :]
            return

    def _check_line_ends(self, text: str, next_row: str) -> None:
        """ManifestError for a JSONL or URL list whose lines end with a bare CR (old Mac line
        ends): its lines are split at LF, so every row would be read as one line."""
        if next_row in text.partition("\n")[0]:
            raise ManifestError(
                f"manifest {self.name} ends its lines with a bare CR (\\r): save it with LF or"
                " CRLF line ends (JSONL and URL lists are read a line per row)"
            )

    def _check_columns(self, names: list[str]) -> None:
        """ManifestError for a header naming a column the engine reads twice (which of the
        two holds the value would be a guess), or one field under both its spellings."""
        first: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in READ_COLUMNS and name in first:
                raise ManifestError(
                    f"manifest {self.name} names the column {name} twice (columns"
                    f" {first[name] + 1} and {i + 1}): keep one"
                )
            first.setdefault(name, i)
        fields: dict[str, str] = {}
        for name in names:
            field = CONTEXT_FIELDS.get(name)
            if field is not None and fields.setdefault(field, name) != name:
                raise ManifestError(
                    f"manifest {self.name} has both {fields[field]} and {name} columns (the"
                    " same field): keep one"
                )

    def _start(self, text: str) -> None:
        """Begin parsing a chunk of complete records."""
        self._base = self._line
        self._done = 0
        if self.kind != "csv":
            lines = text.split("\n")
            if lines and not lines[-1]:
                lines.pop()
            self._lines = lines
            self._line = self._base + text.count("\n")
        elif (
            '"' not in text
            and "\x00" not in text
            # (a cell read as no value: csvchunk.SQL_NULL; a backslash first: one memchr)
            and ("\\" not in text or CsvChunk.NULL not in text)
            and len(text) <= csv.field_size_limit()
            and "\r" not in (plain := text.replace("\r\n", "\n") if "\r" in text else text)
        ):
            # Without quotes, NULs, \N or CRs but those of CRLF line ends (and no field past the
            # csv module's limit) its rows are the lines split at commas (no blank line a row).
            pairs = len(self.header) == 2 and not self._unnamed and not self._dirty
            self._plain = PlainChunk(plain, pairs)
            self._line = self._base + self._plain.newlines
        else:
            # The input's last chunk (read to its end, nothing pending) has no record after it.
            self._csv = CsvChunk(text, last=self._eof and not self._pending)

    def _take(self) -> Sequence[tuple[int, Any]]:
        """Up to ``max_rows`` rows of the chunk being parsed (a row with bytes that are not
        UTF-8 is the reason it is refused, never an id or URL with those bytes replaced)."""
        rows = self._parse()
        if self._dirty and self.kind == "csv":  # (JSONL and URL lines: screened in _parse)
            rows = strays.screen_csv(rows, self.header)
        return cut_unnamed(rows, len(self.header), self._unnamed) if self._unnamed else rows

    def _parse(self) -> Sequence[tuple[int, Any]]:
        rows: list[tuple[int, Any]] = []
        limit = self.max_rows
        base = self._base
        if self._lines is not None:
            lines, i = self._lines, self._done
            end = len(lines)
            urls = self.kind == "urls"
            if not urls and not self._dirty:
                # The next ``limit`` lines decoded in one C-level pass: when every one decodes
                # none is blank (a blank or whitespace line is no JSON), so they are exactly
                # the rows the loop below takes, with the same values. A block holding a line
                # that does not decode is read by the loop (its reject text, blank lines).
                block = lines[i : i + limit]
                try:
                    values = list(map(_json_decoder.decode, block))
                except strays.NOT_JSON:
                    pass
                else:
                    self._done = i + len(block)
                    if self._done >= end:
                        self._lines = None
                    return JsonRows(base + i + 1, values, block)
            texts: dict[int, str] = {}
            while i < end and len(rows) < limit:
                text_line = lines[i]
                i += 1
                if not text_line.strip():
                    continue
                if self._dirty and strays.has_stray(text_line):
                    rows.append((base + i, strays.screen_line(text_line.strip(), self.kind)))
                    continue
                if urls:
                    url = text_line.strip()
                    rows.append((base + i, [url, url]))
                    continue
                if "-0" in text_line:  # (its text, for a -0 id: jsonnums)
                    texts[base + i] = text_line
                try:
                    rows.append((base + i, _json_decoder.decode(text_line)))
                except strays.NOT_JSON as err:
                    row = strays.screen_escapes(text_line)  # (half an emoji, escaped)
                    if row is None:
                        row = strays.BadRow(f"not valid JSON: {err}")
                    rows.append((base + i, row))
            self._done = i
            if i >= end:
                self._lines = None
            return JsonLines(rows, texts) if texts else rows
        if self._plain is not None:
            plain = self._plain
            taken = plain.take(base + 1, limit)
            if not plain.left:
                self._line = base + plain.newlines  # (fewer than said if not all pairs)
                self._plain = None
            return taken
        chunk = self._csv
        assert chunk is not None
        parsed = chunk.rows(limit, base)
        if chunk.done:
            self._line = base + chunk.consumed
            if chunk.rest is not None:  # a record the cut went through: read on first
                self._pending = chunk.rest.encode("utf-8", "surrogateescape") + self._pending
            self._csv = None
        return parsed

    def read_batch(self) -> RowBatch | None:
        """The next rows (at most ``max_rows``), or None at end of input."""
        self.handing_on()
        while self._csv is None and self._lines is None and self._plain is None:
            if self._head is not None:
                text, self._head = self._head, None
                dirty = self._head_dirty
                if not text:
                    continue
            else:
                data = self._next_records()
                if data is None:
                    return None
                text, dirty = strays.decode(data, "utf-8")
            if "\ufeff" in text:  # (never an id's or a URL's first character, nor JSON's)
                text = _LINE_BOMS.sub("", text)
            self._dirty = dirty
            self._start(text)
        return RowBatch(self.source, self.label, self.kind, self.header, self._take())


def manifests_size(readers: list[ManifestReader]) -> int:
    """Total bytes of the manifests, or 0 when one of them has no known size (stdin)."""
    sizes = [r.size for r in readers]
    return 0 if any(size is None for size in sizes) else sum(s or 0 for s in sizes)


def open_manifest(path: str, source: int, max_rows: int = MAX_ROWS) -> ManifestReader:
    """Open a manifest and read its header (blocking; call in a thread)."""
    reader = ManifestReader(path, source, max_rows)
    try:
        reader.open()
    except BaseException:
        reader.close()
        raise
    return reader


#: Files a run holds open beside its manifests: connections, the state, outputs, logs.
FILES_BESIDE = 512


def _room_for(manifests: int) -> tuple[int, int]:
    """Raise the soft limit of open files (``ulimit -n``, 1,024 on most systems) as far as
    the hard limit lets it when the manifests, all open at once, would not fit beside the
    run's own files (a dump of 2,000 part files), as the Go runtime does for every program;
    returns the limits (soft, hard) then in force."""
    if resource is None:
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = manifests + FILES_BESIDE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft, hard
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, hard
        soft = target
    return soft, hard


async def open_manifests(names: Sequence[str], max_rows: int = MAX_ROWS) -> list[ManifestReader]:
    """Open every manifest in a worker thread, the i-th as source i; none stays open when one
    cannot be read (its :class:`ManifestError` is raised; an OSError saying what to do when
    the limit of open files is too low for them all)."""
    soft, hard = _room_for(len(names))
    readers: list[ManifestReader] = []
    try:
        for i, name in enumerate(names):
            readers.append(await anyio.to_thread.run_sync(open_manifest, name, i, max_rows))
    except BaseException as err:
        for reader in readers:
            reader.close()
        if isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE):
            need = len(names) + FILES_BESIDE
            if err.errno == errno.ENFILE:
                limit, fix = "the system's", "raise it (fs.file-max)"
            else:
                limit, fix = f"{soft}", f"raise it (ulimit -n {need})"
                if resource is not None and hard != resource.RLIM_INFINITY and hard < need:
                    limit = f"{soft}, and its hard limit {hard}"
                    fix = (
                        f"raise the hard limit to {need} (as root: LimitNOFILE= in a systemd"
                        " unit, nofile in /etc/security/limits.conf), then ulimit -n"
                    )
            # Still the OSError of its errno: a shortage of the process (the daemon waits
            # and tries again), never a manifest that cannot be read.
            raise OSError(
                err.errno,
                f"{len(names)} manifests are read in one run, each open from its start, and"
                f" the limit of open files is {limit}: {fix}, or give the rows in fewer files",
            ) from None
        raise
    return readers


async def iter_batches(reader: ManifestReader) -> AsyncIterator[RowBatch]:
    """The batches of an opened manifest, each read in a worker thread."""
    try:
        while True:
            batch = await anyio.to_thread.run_sync(reader.read_batch, abandon_on_cancel=True)
            if batch is None:
                return
            if batch.rows:
                yield batch
    finally:
        reader.close()


def iter_rows_sync(reader: ManifestReader) -> Iterator[tuple[int, Any]]:
    """Every row of an opened manifest (tests and tools)."""
    while (batch := reader.read_batch()) is not None:
        yield from batch.rows
