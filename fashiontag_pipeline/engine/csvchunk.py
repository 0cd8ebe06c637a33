"""A chunk of CSV text parsed by the csv module, wherever the chunk was cut.

The source cuts what it has read at the last newline. A newline inside a quoted field is no
record boundary, and whether a quote opens a quoted field depends on where it stands: a quote
inside an unquoted field (``Jeans 32" waist``) is a plain character to the csv module, so
counting quotes cannot tell where records end (it once cut records in two: valid rows became
rejects, their tails rows of ids the manifest never had, and the same bytes read in other
pieces gave other rows). So the csv module itself decides: the chunk is parsed with a marker
line after it. A record still open at the chunk's end (a quoted field the cut went through)
takes the marker in; its text is handed back (:attr:`CsvChunk.rest`) to be parsed whole with
the bytes that follow. The input's last chunk gets no marker: an open quoted field there ends
with the input, as the csv module reads a whole file.

Line numbers are the csv module's (``\\r``, ``\\n`` and ``\\r\\n`` each end a line), counted
from the chunk's first line: a record's number is where it starts, the same however the input
was cut, since a cut falls only after a newline.
"""

from __future__ import annotations

import csv
import io
import itertools

__all__ = ["CsvChunk"]

#: The marker line's text: two Unicode noncharacters, which no manifest holds. If one did, its
#: record would only be handed back until the input's last chunk (no marker) reads it.
_MARK = "\uffff\ufffe"


class CsvChunk:
    """The rows of one chunk of CSV text (complete lines), parsed lazily, a batch at a time."""

    def __init__(self, text: str, *, last: bool) -> None:
        self._lines = io.StringIO(text, newline="").readlines()
        self._count = len(self._lines)
        feed = self._lines if last else itertools.chain(self._lines, (_MARK + "\n",))
        self._reader = csv.reader(feed)
        #: Lines of the records parsed so far.
        self.consumed = 0
        #: Every record of the chunk was parsed.
        self.done = False
        #: The text of a record still open at the chunk's end (None: none was).
        self.rest: str | None = None

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
            start, self.consumed = self.consumed, reader.line_num
            if self.consumed > self._count:  # the record took the marker line in
                self.done = True
                if fields == [_MARK]:
                    self.consumed = self._count
                else:  # open at the chunk's end: parsed again with what follows
                    self.rest = "".join(self._lines[start:])
                    self.consumed = start
                break
            if fields:
                append((base + start + 1, fields))
        return rows
