"""What the source hands the validator: a batch of rows of one manifest, a block of plain
CSV lines whose rows are made only when they are read, and a block of JSONL lines decoded
in one go.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import msgspec

__all__ = ["JsonLines", "JsonRows", "PlainChunk", "PlainRows", "RowBatch"]


_T = TypeVar("_T")


class _LineBlock(Sequence[tuple[int, _T]], Generic[_T]):
    """Consecutive lines of a manifest, ``first`` being the number of the first: the rows
    ``(line, value)``, made when they are read (iteration, indexing), so that a validator
    taking the lines as one block (:meth:`~.validate.Validator.route`) never builds them."""

    __slots__ = ("first",)

    first: int

    def _items(self) -> list[Any]:
        """The lines, as the block keeps them."""
        raise NotImplementedError

    def _row(self, item: Any) -> _T:
        """The value of one line's row."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._items())

    @overload
    def __getitem__(self, index: int) -> tuple[int, _T]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, _T]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, _T] | list[tuple[int, _T]]:
        if isinstance(index, slice):
            return list(self)[index]
        items = self._items()
        n = len(items)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self.first + index, self._row(items[index])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LineBlock) and type(other) is type(self):
            return self.first == other.first and self._items() == other._items()
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(first={self.first}, {len(self)} lines)"


class PlainRows(_LineBlock[list[str]]):
    """Consecutive CSV lines with no quote, CR or NUL and no blank line: the rows are exactly
    the lines split at commas. A block of a two-column manifest (:class:`PlainChunk`) comes as
    its ``cells`` instead (each line's two, in order) and its ``body`` (its text, each line
    ending with a newline), its lines made only if they are read."""

    __slots__ = ("_lines", "body", "cells")

    def __init__(
        self,
        first: int,
        lines: list[str] | None = None,
        *,
        cells: list[str] | None = None,
        body: str = "",
    ) -> None:
        self.first = first
        self._lines = lines
        self.cells = cells
        self.body = body

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.body.split("\n")
            self._lines.pop()  # (the text's last line ends with one)
        return self._lines

    def _items(self) -> list[str]:
        return self.lines

    def _row(self, item: str) -> list[str]:
        return item.split(",")

    def __len__(self) -> int:
        return len(self.lines) if self.cells is None else len(self.cells) >> 1

    @overload
    def __getitem__(self, index: int) -> tuple[int, list[str]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, list[str]]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[int, list[str]] | list[tuple[int, list[str]]]:
        cells = self.cells
        if cells is None or isinstance(index, slice):
            return super().__getitem__(index)
        n = len(cells) >> 1  # (a row's fields from its cells: the lines not made for it)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self.first + index, cells[2 * index : 2 * index + 2]

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        first = self.first
        return ((first + k, line.split(",")) for k, line in enumerate(self.lines))


class PlainChunk:
    """A chunk of CSV lines with no quote, CR or NUL (the text the source read, its last line
    ending with a newline unless it is the input's last), handed out in blocks of at most
    ``limit`` rows (:meth:`take`), each row its line split at commas, a blank line no row.

    ``pairs`` (a manifest of two columns): the text is split at commas and newlines in one
    pass, and a block is taken as its cells when they make its lines, two cells each: the
    text built from them (a comma after the first of each line, a newline after the second) is
    the chunk's next text. Then no string is made a line (nor joined again for the validator's
    block check: :func:`.plainblock.plain_block` takes the cells and that text). A block whose
    lines are not all two cells (a row of one field or three, a blank line) ends that: the rest
    of the chunk is split into lines, as every chunk of other manifests is."""

    __slots__ = ("_at", "_cells", "_lines", "_skip", "_text", "_total", "done", "newlines")

    def __init__(self, text: str, pairs: bool) -> None:
        self._text = text
        self._at = 0  # where the next block's text starts (cells)
        self._skip = 0  # the lines before those of ``_lines``
        self.done = 0  # the lines handed out
        self._cells: list[str] | None = None
        self._lines: list[str] = []
        whole = text.endswith("\n")
        if pairs and whole:
            cells = text.replace(",", "\n").split("\n")
            cells.pop()  # (after the last newline)
            if not len(cells) & 1:
                self._cells = cells
                # Every line two cells: as many lines (corrected in :meth:`take` if not).
                self._total = self.newlines = len(cells) >> 1
                return
        self._split_from(0)
        self._total = len(self._lines)
        #: Whole records end with a newline: then the lines are as many as the newlines.
        self.newlines = self._total if whole else text.count("\n")

    def _split_from(self, at: int) -> None:
        lines = self._text[at:].split("\n")
        if lines and not lines[-1]:
            lines.pop()
        self._lines = lines

    @property
    def left(self) -> bool:
        """Whether lines remain to be handed out."""
        return self.done < self._total

    def take(self, first: int, limit: int) -> Sequence[tuple[int, list[str]]]:
        """The next rows, at most ``limit`` (``first``: the number of the chunk's first line)."""
        start = self.done
        first += start
        cells = self._cells
        if cells is not None:
            block = cells[2 * start : 2 * (start + limit)]
            out = ["", ",", "", "\n"] * (len(block) >> 1)
            out[0::2] = block
            text = "".join(out)
            if self._text.startswith(text, self._at):
                self._at += len(text)
                self.done = start + (len(block) >> 1)
                return PlainRows(first, cells=block, body=text)
            self._cells = None  # the rest as lines
            self._split_from(self._at)
            self._skip = start
            self._total = self.newlines = start + len(self._lines)
        lines = self._lines[start - self._skip : start - self._skip + limit]
        self.done = start + len(lines)
        if "" not in lines:
            return PlainRows(first, lines)
        return [(first + k, line.split(",")) for k, line in enumerate(lines) if line]


class JsonRows(_LineBlock[Any]):
    """Consecutive JSONL lines, none blank, each decoded (``values``: what the JSON decoder
    made of each, an object or any other JSON value; ``lines``: their text, read only for a
    row whose id is the integer 0, which may have been written ``-0``: :mod:`.jsonnums`)."""

    __slots__ = ("lines", "values")

    def __init__(self, first: int, values: list[Any], lines: list[str] | None = None) -> None:
        self.first = first
        self.values = values
        self.lines = lines

    def text(self, line: int) -> str | None:
        """The text of line ``line`` (None when not kept)."""
        return None if self.lines is None else self.lines[line - self.first]

    def _items(self) -> list[Any]:
        return self.values

    def _row(self, item: Any) -> Any:
        return item

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return enumerate(self.values, self.first)


class JsonLines(list[tuple[int, Any]]):
    """JSONL rows decoded one by one, with the text of each line holding ``-0`` (``texts``,
    by line number: for a row whose id is the integer 0, see :class:`JsonRows`)."""

    def __init__(self, rows: list[tuple[int, Any]], texts: dict[int, str]) -> None:
        super().__init__(rows)
        self.texts = texts

    def text(self, line: int) -> str | None:
        return self.texts.get(line)


class RowBatch(msgspec.Struct, gc=False):
    """Rows of one manifest. ``rows`` holds (line, value): for CSV a list of fields, for JSONL
    the decoded object; when a line cannot be parsed (not JSON, a CSV row the csv module
    refuses), the value is the error text (a ``str``; for JSONL a :class:`~.strays.BadRow`,
    as a line holding a JSON string is a ``str`` too) and the row becomes one reject. A block
    of plain CSV lines comes as :class:`PlainRows`, one of JSONL lines as :class:`JsonRows`
    (the same rows, made on demand)."""

    source: int
    name: str
    kind: str
    header: list[str]
    rows: Sequence[tuple[int, Any]]
