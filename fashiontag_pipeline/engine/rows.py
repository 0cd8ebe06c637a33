"""What the source hands the validator: a batch of rows of one manifest, a block of plain
CSV lines whose rows are made only when they are read, and a block of JSONL lines decoded
in one go.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec

__all__ = ["JsonRows", "PlainRows", "RowBatch"]


class PlainRows(Sequence[tuple[int, list[str]]]):
    """Consecutive CSV lines with no quote, CR or NUL and no blank line: the rows are exactly
    the lines split at commas, ``first`` being the line number of the first.

    The rows are made when they are read (iteration, indexing), so a validator that can take
    the lines as one block (:meth:`~.validate.Validator.route`) never builds them."""

    __slots__ = ("first", "lines")

    def __init__(self, first: int, lines: list[str]) -> None:
        self.first = first
        self.lines = lines

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, index: int) -> tuple[int, list[str]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, list[str]]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[int, list[str]] | list[tuple[int, list[str]]]:
        if isinstance(index, slice):
            return list(self)[index]
        n = len(self.lines)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self.first + index, self.lines[index].split(",")

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        first = self.first
        return ((first + k, line.split(",")) for k, line in enumerate(self.lines))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlainRows):
            return self.first == other.first and self.lines == other.lines
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PlainRows(first={self.first}, {len(self.lines)} lines)"


class JsonRows(Sequence[tuple[int, Any]]):
    """Consecutive JSONL lines, none blank, each decoded (``values``: what the JSON decoder
    made of each, an object or any other JSON value), ``first`` being the line number of the
    first: the rows ``(line, value)``, made when they are read, so that a validator taking the
    values as one block (:meth:`~.validate.Validator.route`) never builds them."""

    __slots__ = ("first", "values")

    def __init__(self, first: int, values: list[Any]) -> None:
        self.first = first
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> tuple[int, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, Any]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, Any] | list[tuple[int, Any]]:
        if isinstance(index, slice):
            return list(self)[index]
        n = len(self.values)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self.first + index, self.values[index]

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return enumerate(self.values, self.first)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JsonRows):
            return self.first == other.first and self.values == other.values
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JsonRows(first={self.first}, {len(self.values)} lines)"


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
