"""A chunk of CSV text parsed by the csv module, wherever the chunk was cut.

The source cuts what it has read at the last newline. A newline inside a quoted field is no
record boundary, and whether a quote opens a quoted field depends on where it stands: a quote
inside an unquoted field (``Jeans 32" waist``) is a plain character to the csv module, so
counting quotes cannot tell where records end (it once cut records in two: valid rows became
rejects, their tails rows of ids the manifest never had, and the same bytes read in other
pieces gave other rows). So the csv module itself decides: the chunk is parsed with a marker
line after it. A record still open at the chunk's end (a quoted field the cut went through)
takes the marker in; its text is handed back (:attr:`CsvChunk.rest`) to be parsed whole with
the bytes that follow. In the input's last chunk such a record is a quote never closed: its
first line is refused and the lines after it are read as rows (the csv module would end the
field with the input, every row after the quote read into it: tagged as one row's brand, say,
or one reject, the rows themselves without an outcome).

Line numbers are the csv module's (``\\r``, ``\\n`` and ``\\r\\n`` each end a line), counted
from the chunk's first line: a record's number is where it starts, the same however the input
was cut, since a cut falls only after a newline.
"""

from __future__ import annotations

import _csv
import csv
import io
import itertools
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_LINES",
    "MAX_RECORD_LINES",
    "SQL_NULL",
    "CsvChunk",
    "csv_lines",
    "cut_unnamed",
    "header_record",
    "top_lines",
    "unnamed_end",
]

#: The most lines one CSV record may span. A quote that opens a field and is never closed (one
#: stray ``"`` at the start of a field) makes the rest of the input one record to the csv
#: module: every row after it would be read as part of that field and have no outcome (one
#: reject for the whole rest, or for its first 64 MiB when the field limit refuses it), while
#: the open record was held and parsed again with every chunk read (memory and time growing
#: with the manifest). A record spanning more lines than this is refused at its first line and
#: the lines after that line are read as rows again, however the input was cut.
MAX_RECORD_LINES = 1000

#: The most lines a header may span (cells holding line breaks: Alt+Enter in an Excel cell).
MAX_HEADER_LINES = 50
#: The most bytes read on for a header's quoted cell to close (then the header is its first
#: line, and what follows is read as rows, a line with no end refused as too long).
MAX_HEADER_BYTES = 4 << 20

#: A cell that is exactly this is no value, as an empty one is: a SQL NULL as Snowflake's
#: ``COPY INTO`` (its default ``NULL_IF``), PostgreSQL's and MySQL's text exports write it.
#: Read as text it was an id (``\\N``, every later NULL id a duplicate of it), a ``detection``
#: that refused its row, or a brand sent to the service.
SQL_NULL = "\\N"

#: The marker line's text: two Unicode noncharacters, which no manifest holds. If one did, its
#: record would only be handed back until the input's last chunk (no marker) reads it.
_MARK = "\uffff\ufffe"


def csv_lines(text: str) -> list[str]:
    """The lines of ``text`` as the csv module ends them: at ``\\r``, ``\\n`` and ``\\r\\n``
    only, not at the other characters ``str.splitlines`` ends a line at (NEL, U+2028, a
    vertical tab, a form feed, ``\\x1c``), which are text in a field."""
    return io.StringIO(text, newline="").readlines()


#: How much of a manifest's first text :func:`top_lines` splits into lines (up to the line end
#: after it) when the header and the lines read after it lie within.
HEAD_PEEK = 16 << 10


def top_lines(text: str) -> list[str]:
    """The first :func:`csv_lines` of ``text``: enough to read its header record from and the
    lines after it that :func:`header_record` and the errors that name them read (at least
    ``2 * MAX_HEADER_LINES + 2`` after the blank lines it starts with), else all of them.
    A first read holds up to a MiB of rows (~17,000): splitting them into lines only to join
    them again cost ~1,000 instructions a row of it."""
    cut = text.find("\n", HEAD_PEEK) + 1  # (after a LF: no CRLF cut in two)
    if cut:
        lines = csv_lines(text[:cut])
        skip = 0
        while skip < len(lines) and not lines[skip].strip():
            skip += 1
        if len(lines) - skip > 2 * MAX_HEADER_LINES + 1:
            return lines
    return csv_lines(text)


def header_record(lines: list[str], *, last: bool) -> tuple[list[str], int] | None:
    """The header's names and the lines it spans, ``lines`` starting at its first: the first
    CSV record, which a quoted cell holding a line break (``"Retail Price\nin EUR"``: Alt+Enter
    in an Excel cell) makes span several lines. None when that record is still open at the end
    of ``lines`` and more text may close it (not the input's ``last`` text). A record that
    breaks the quoting rules, or spans more than :data:`MAX_HEADER_LINES`, is its first line
    alone (a header with a stray quote reads as it always did), and so is one holding rows: a
    stray quote's cell that a row's inch mark (``Monitor 27"``) seemed to close."""
    window = lines[:MAX_HEADER_LINES]
    reader = csv.reader(window, strict=True)
    try:
        names = next(reader)
        if reader.line_num == 1 or not _holds_rows(names, len(next(csv.reader(lines[:1])))):
            return names, reader.line_num
    except csv.Error:
        open_at_end = reader.line_num == len(window) < MAX_HEADER_LINES
        if open_at_end and not last and len(window) == len(lines):
            return None
    except StopIteration:
        pass
    return next(csv.reader(lines[:1])), 1


def unnamed_end(names: list[str]) -> int:
    """How many names at the header's end are empty (``id,url,``: an exporter that writes a
    trailing delimiter on the header only): no columns, so rows without those cells are read
    (:func:`cut_unnamed`), not each refused as shorter than the header."""
    n = len(names)
    while n > 2 and not names[n - 1]:
        n -= 1
    return len(names) - n


def cut_unnamed(rows: Iterable[tuple[int, Any]], width: int, unnamed: int) -> list[Any]:
    """``rows`` with the cells under a header's ``unnamed`` empty end names cut off (those
    rows that have them: a row may have none, some or all of them): each row is then as wide
    as the header's names. Other rows (too short, too long, unreadable) are left as they are."""
    most = width + unnamed
    return [
        (line, f[:width] if type(f) is list and width < len(f) <= most else f) for line, f in rows
    ]


def _holds_rows(names: list[str], width: int) -> bool:
    """Whether a header record spanning lines holds rows: a URL, or a line of a cell (after
    its line break) with as many fields as its first line has, a row's ``width`` (two at least:
    a row's id and URL)."""
    width = max(width, 2)
    return any(
        "://" in name or any(part.count(",") + 1 >= width for part in name.splitlines()[1:])
        for name in names
    )


class CsvChunk:
    """The rows of one chunk of CSV text (complete lines), parsed lazily, a batch at a time."""

    NULL = SQL_NULL

    def __init__(self, text: str, *, last: bool) -> None:
        self._lines = csv_lines(text)
        backslash = "\\" in text  # (one memchr: a two-character search is ~70x slower)
        self._nulls = backslash and SQL_NULL in text
        self._escapes = backslash and '\\"' in text  # (maybe Spark's escaped quote: rows)
        self._count = len(self._lines)
        self._last = last
        #: The line the reader started at (0, or the line after a refused record).
        self._from = 0
        self._reader = self._read_from(0)
        #: Lines of the records parsed so far.
        self.consumed = 0
        #: Every record of the chunk was parsed.
        self.done = False
        #: The text of a record still open at the chunk's end (None: none was).
        self.rest: str | None = None

    def _read_from(self, first: int) -> _csv.Reader:
        """A csv reader of the chunk's lines from ``first`` on (then the marker line)."""
        self._from = first
        lines = itertools.islice(self._lines, first, None)
        return csv.reader(itertools.chain(lines, (_MARK + "\n",)))

    def rows(self, limit: int, base: int) -> list[tuple[int, list[str] | str]]:
        """Up to ``limit`` rows: (line number, fields), or (line, reason) for a record the
        csv module refused; ``base`` is the line number before the chunk."""
        rows: list[tuple[int, list[str] | str]] = []
        reader = self._reader
        append = rows.append
        while len(rows) < limit:
            try:
                fields: list[str] | str = next(reader)
            except StopIteration:
                self.done = True
                break
            except csv.Error as err:
                fields = f"not a valid CSV row: {err}"
            start, self.consumed = self.consumed, self._from + reader.line_num
            # Lines of the chunk the record spans (the marker line is none of them).
            span = min(self.consumed, self._count) - start
            if self.consumed > self._count and fields == [_MARK]:
                self.done = True
                self.consumed = self._count
                break
            open_at_end = self.consumed > self._count
            if (
                (isinstance(fields, str) and span > 1)
                or span > MAX_RECORD_LINES
                or (open_at_end and self._last)
            ):
                # Refused (or unterminated): its first line is the reject, and the lines the
                # record swallowed are read again as rows, never lost with it.
                if not isinstance(fields, str):
                    within = (
                        f"within {MAX_RECORD_LINES:,} lines"
                        if span > MAX_RECORD_LINES
                        else "by the end of the manifest"
                    )
                    fields = (
                        "not a valid CSV row: a quoted field opened on this line is not closed"
                        f" {within} (an unmatched quote?)"
                    )
                append((base + start + 1, fields))
                self.consumed = start + 1
                reader = self._reader = self._read_from(start + 1)
                continue
            if open_at_end:  # open at the chunk's end (not the input's)
                self.done = True
                # parsed again with what follows
                self.rest = "".join(self._lines[start:])
                self.consumed = start
                break
            if span > 1 and (bad := _misquoted(self._lines[start : start + span])):
                # A stray quote that a later field's quote seemed to close: its first line is
                # the reject, and the lines it swallowed are read again as rows.
                append(
                    (
                        base + start + 1,
                        f"not a valid CSV row: it spans {span:,} lines, and on line"
                        f" {base + start + bad:,} a quote that ends a field is followed by"
                        " neither a comma nor a line end (an unmatched quote?)",
                    )
                )
                self.consumed = start + 1
                reader = self._reader = self._read_from(start + 1)
                continue
            if (
                self._escapes
                and type(fields) is list
                and _escaped_quote(self._lines[start:][:span])
            ):
                fields = ESCAPED_QUOTE
            if fields:
                if self._nulls and SQL_NULL in fields:
                    fields = ["" if f == SQL_NULL else f for f in fields]
                append((base + start + 1, fields))
        return rows


#: The reject of a row whose quoted field holds a quote escaped with a backslash, which the
#: csv module, lenient, reads as the field's end (``"Levi\\"s"`` read as ``Levi\\s"``).
ESCAPED_QUOTE = (
    'not a valid CSV row: a quote escaped with a backslash (\\") in a quoted field, as Spark'
    ' writes CSV by default: write it with the option escape set to \'"\' (a quote doubled, "")'
)


def _escaped_quote(lines: list[str]) -> bool:
    """Whether a record's ``lines`` hold a quote escaped with a backslash (``\\"``) that
    breaks the quoting rules (a quoted field's end followed by more text): Spark's CSV."""
    return any('\\"' in line for line in lines) and _misquoted(lines) > 0


def _misquoted(lines: list[str]) -> int:
    """The line (counted from 1) of a record's ``lines`` where it breaks the quoting rules
    (a closing quote followed by another character than a comma, a quote or a line end), else
    0. The csv module takes such a quote, leniently, for a plain character, so a stray quote
    that opens a field is "closed" by the next field that opens with one, the rows between
    read into it: run only on the rare record that spans several lines."""
    reader = csv.reader(lines, strict=True)
    try:
        for _ in reader:
            pass
    except csv.Error:
        return reader.line_num or 1
    return 0
