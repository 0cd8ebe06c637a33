"""Numbers in JSONL rows, read as their text.

A manifest exported from a database writes numeric columns as JSON numbers (PostgreSQL
``row_to_json``, Snowflake ``COPY INTO ... TYPE=JSON``, pandas ``to_json(orient="records",
lines=True)``: ``{"id": 12345, "price": 19.99}``), where a CSV has their text:

* an id that is a JSON integer is its decimal text, exactly however large (``12345``:
  ``"12345"``, the id a CSV of the same rows gives, so one written both ways is a duplicate);
  a float as an id (``1.0``, ``1e3``, ``-0``) is a reject: which id is meant would be a guess;
* a number in a field the spec types as a string (``price``, ``season``, an ``age``) is sent as
  its text: an integer exactly, a float as its shortest round-trip text (``19.99``; ``19.90`` is
  ``19.9``, as the JSON decoder reads it). A boolean is no number: a reject, as before.

msgspec reads ``-0`` as the integer 0 and drops its sign (PostgreSQL writes a float8 -0 so):
a row whose id is the integer 0 is read again from its line's text (kept by the source) with
each ``-0`` literal a float (:func:`minus_zero_row`), so that ``{"id": -0}`` is a reject, not
the id ``0`` (a ``-0`` elsewhere in that row is then sent as ``-0.0``). No other row's text
is looked at (a scan of every chunk for ``-0`` cost ~1% of a run whose ids are
``sku-000000001``).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .rules import RowError, number_text

__all__ = ["id_text", "minus_zero", "minus_zero_row", "number_text", "texts"]

_decoder = msgspec.json.Decoder()

#: What may be a ``-0`` number literal: searched for by its literal head (fast, where a
#: chunk's URLs hold dates, ``2024-05-01``: ``-0`` then a digit is no candidate).
_CANDIDATE = re.compile(r"-0(?![0-9.eE])")
#: A JSON string (on one line) or a ``-0`` literal: strings are kept, the literal rewritten.
_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|(?<=[:,\[\s])-0(?![0-9.eE])')


def minus_zero(text: str) -> str:
    """``text`` (JSONL lines) with each ``-0`` number literal written ``-0.0`` (its line length
    changes; its line ends do not). The text is rewritten only when a candidate follows a
    ``:``, ``,`` or ``[`` (then spaces): a number's place."""
    for found in _CANDIDATE.finditer(text):
        j = found.start() - 1
        while j >= 0 and text[j] in " \t\r":
            j -= 1
        if j >= 0 and text[j] in ":,[":
            return _TOKENS.sub(_literal, text)
    return text


def _literal(found: re.Match[str]) -> str:
    token = found.group()
    return "-0.0" if token == "-0" else token


def minus_zero_row(rows: Any, line: int) -> Any:
    """The row at ``line`` of ``rows`` (a batch's) read with each ``-0`` literal as ``-0.0``;
    None when its text holds none (or was not kept: then it has no ``-0``)."""
    text_of = getattr(rows, "text", None)
    text = None if text_of is None else text_of(line)
    if text is None or (rewritten := minus_zero(text)) == text:
        return None
    return _decoder.decode(rewritten)  # (it decoded before: only -0 is now -0.0)


def id_text(raw: Any) -> str:
    """The id of a row whose ``id`` is not a string: an integer's decimal text, else the
    reject's RowError."""
    if type(raw) is int:
        return str(raw)
    if type(raw) is float:
        raise RowError(
            f"id must be a string or an integer, not the number {raw!r} (an id written with a"
            " point or an exponent, or as -0, is a guess): write it as a string"
        )
    raise RowError("id must be a string or an integer")


def texts(column: list[Any], ints_only: bool = False) -> list[Any]:
    """``column`` with each number as its text (only integers with ``ints_only``: an id); other
    values as they are (the row by row rules reject them)."""
    if ints_only:  # (0 may have been written -0: its row is checked one by one)
        return [str(v) if type(v) is int and v else v for v in column]
    return [v if type(v) is str else (number_text(v) or v) for v in column]
