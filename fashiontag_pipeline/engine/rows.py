"""What the source hands the validator: a batch of rows of one manifest, a block of plain
CSV lines whose rows are made only when they are read, and a block of JSONL lines decoded
in one go.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import msgspec

__all__ = ["JsonLines", "JsonRows", "PlainRows", "RowBatch"]


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
    the lines split at commas."""

    __slots__ = ("lines",)

    def __init__(self, first: int, lines: list[str]) -> None:
        self.first = first
        self.lines = lines

    def _items(self) -> list[str]:
        return self.lines

    def _row(self, item: str) -> list[str]:
        return item.split(",")

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        first = self.first
        return ((first + k, line.split(",")) for k, line in enumerate(self.lines))


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
