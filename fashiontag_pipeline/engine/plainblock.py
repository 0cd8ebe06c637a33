"""Whole batches of CSV rows validated at once: the validator's fast paths.

A :class:`~.rows.PlainRows` block holds lines with no quote, CR or NUL, so each row is its
line split at commas; other CSV rows come parsed by the csv module. The requests of the rows
that pass every rule are built column by column in C-level passes instead of row by row in
Python; the rows that break a rule go through the validator's general path (which writes each
bad row's reject). Both give the same items: the tests compare them on every kind of bad line.

* :func:`plain_block`: the ``id,url`` (or ``url,id``) manifest, checked with a few C-level
  passes over the whole block; each row's request is its URL (:mod:`.plainbody`: its chunk's
  JSON is built around the ids and URLs, the bytes the structs would give).
* :func:`context_block` (and :func:`parsed_block`, for rows the csv module parsed: a
  manifest with quoted fields): ``id``, ``url`` and context fields taken as text (``brand``,
  ``gender``, ``price``, ...; a fashion catalogue's usual columns), any order, other columns
  ignored. A row of such a manifest cost ~4.3 us in the general path (a keyword-argument call
  per row, a rule per field) against ~1.3 for an ``id,url`` row. The lines that break a rule
  are left to the general path, the others are built whole. ``detection`` and ``age``
  columns have rules of their own (a list of allowed values; a ``|``-separated list): blocks
  with them take the general path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import compress, repeat
from operator import contains, itemgetter
from typing import Any

from .._models import BulkContext, Image, ImageType, TaggingRequest
from .policy import Measured
from .rows import PlainRows
from .rules import MAX_ID_SAFE_CHARS, PLAIN_URL, unkeyable

__all__ = ["built", "context_block", "parsed_block", "plain_block"]

_URL = ImageType.URL
_FIELDS = itemgetter(1)
#: :data:`~.rules.PLAIN_URL` but for the whitespace its ``\S*`` refuses after the head.
_URL_HEAD = re.compile(r"https?://[^/?\s]")

#: The ASCII characters ``\s`` matches (those ``str.isspace`` takes) but ``\n``, which ends
#: a plain block's lines and so stands in no cell (``\r`` stands in none either; looked for
#: all the same, as cheap as it is).
_ASCII_SPACES = " \t\r\x0b\x0c\x1c\x1d\x1e\x1f"

#: A URL's head that breaks :data:`~.rules.PLAIN_URL` (or a row that has none), found after
#: the separator that starts each URL of a block of ``id,url`` lines (each comma) or of
#: ``url,id`` lines (each newline, the block's text starting with one): no ``http://`` or
#: ``https://``, or no host character after it (``/``, ``?``, whitespace, a comma, the end).
#: sre searches for the separator with a tight C loop and runs the lookahead at each one, one
#: per row: a whole-block ``fullmatch`` of each line's shape cost ~1,900 instructions a row (a
#: repeated group, a character class tested on every character of every id and URL).
_BAD_HEADS = {
    0: re.compile(r",(?!https?://[^/?\s,])"),
    1: re.compile(r"\n(?!https?://[^/?\s,])"),
}


def plain_block(rows: PlainRows, i_id: int, shifted: int) -> Measured | None:
    """The items of a block of ``id,url`` / ``url,id`` lines when every row passes, else None
    (the caller checks row by row).

    A row passes when its line is a non-empty id and an http(s) URL as
    :data:`~.rules.PLAIN_URL` takes it, separated by one comma. The block is checked with
    C-level passes, none of them a Python step per row: as many commas as lines and a comma in
    every line (so exactly one in each: the cells split at commas and newlines alternate id and
    URL; a block the source gives as its cells, :class:`~.rows.PlainChunk`, was found so
    there), no NUL, a URL head after each separator (:data:`_BAD_HEADS`), no empty id, and no
    whitespace in any URL."""
    cells = rows.cells
    if cells is not None:
        # Lines of two cells each (the source's split, rows.PlainChunk): ``body`` their text,
        # a newline after each line.
        body = rows.body
        n = len(cells) >> 1
        heads = body if i_id == 0 else "\n" + body[:-1]
        size = len(body)  # (ids and URLs, a comma and a newline each)
    else:
        lines = rows.lines
        n = len(lines)
        if not lines:
            return None
        body = "\n".join(lines)
        cells = body.replace(",", "\n").split("\n")  # id/url of each line
        # As many cells as two a line: as many commas as lines (the lines' n - 1 newlines and
        # the commas each start a cell), counted by the split the cells need anyway.
        if len(cells) != 2 * n or not all(map(contains, lines, repeat(","))):
            return None
        heads = body if i_id == 0 else "\n" + body
        size = len(body) + 1
    if "\x00" in body:  # an id holding a NUL is refused row by row (see Validator._csv_row)
        return None
    if _BAD_HEADS[i_id].search(heads) is not None:
        return None
    # A URL holding another (rules._JOINED decides) after a "|" or ";": a comma would have
    # split it into cells. The two single-character scans are ~40x cheaper than the count.
    if ("|" in body or ";" in body) and body.count("://") != n:
        return None
    ids = cells[i_id::2]
    if not all(ids):  # (an empty id: a truth test a cell, cheaper than comparing each to "")
        return None
    urls = cells[1 - i_id :: 2]
    # (The longest id's length: ``max`` keyed by ``len`` compares the lengths as ``map``
    # would give them, without its iterator: ~50 fewer instructions a row.)
    if len(max(ids, key=len)) > MAX_ID_SAFE_CHARS and any(map(unkeyable, ids)):
        return None  # (an id no store keys is refused row by row)
    if _spaced(body, urls):
        return None
    first = shifted | rows.first
    positions = range(first, first + len(ids))
    # Each request is its URL (:mod:`.plainbody`: its chunk's JSON built around ids and URLs).
    return Measured(zip(ids, positions, urls, strict=True), size, (ids, positions))


def _spaced(body: str, urls: list[str]) -> bool:
    """Whether a URL of ``urls`` (cells of ``body``) holds whitespace, which
    :data:`~.rules.PLAIN_URL`'s ``\\S*`` refuses.

    Fast path: an ASCII block (``str.isascii`` reads a flag: no pass over the text) holding
    none of the ASCII whitespace characters (a ``memchr`` pass over the block each) has none
    in any URL (``\\n`` is in no cell). Otherwise (an id with a space, say, or
    non-ASCII text) one C-level split over the URLs alone decides: ``str.split()`` cuts at
    exactly what ``\\s`` matches. The fast path saves that join and split (~400 instructions
    a row); the tests compare the two on every kind of whitespace."""
    if body.isascii() and not any(map(body.__contains__, _ASCII_SPACES)):
        return False
    joined = "".join(urls)
    return joined.split(None, 1) != [joined]


def context_block(
    rows: PlainRows,
    width: int,
    i_id: int,
    i_url: int,
    extras: list[tuple[int, str]],
    shifted: int,
) -> tuple[Measured, list[int]]:
    """The items of the lines of a block of ``width`` fields (the id at ``i_id``, the URL at
    ``i_url``, the context field ``name`` at each ``(index, name)`` of ``extras``, other
    columns ignored) that pass every rule, and the indexes (in ``rows.lines``) of the lines
    left to the caller's row by row check: each of those breaks a rule (or has a scheme in
    capitals, which the general path lower-cases).

    The rules, as the general path applies them to such a row: as many fields as the header,
    a non-empty id without NUL, an http(s) URL with a host and no whitespace
    (:data:`~.rules.PLAIN_URL`), and each context field sent when it is not empty (as it is:
    no rule but its being text). A few bad rows in a block cost their own check only: a
    catalogue with a missing URL every few hundred rows keeps the block path for the rest."""
    lines = rows.lines
    n = len(lines)
    counts = list(map(str.count, lines, repeat(",")))
    rest: list[int] = []
    kept: list[int] | None = None  # the indexes of the lines the columns hold (None: all)
    if counts.count(width - 1) != n:
        kept = [k for k, count in enumerate(counts) if count == width - 1]
        rest = [k for k, count in enumerate(counts) if count != width - 1]
        lines = [lines[k] for k in kept]
    cells = ",".join(lines).split(",") if lines else []
    columns = [(name, cells[index::width]) for index, name in extras]
    first = shifted | rows.first
    at = range(first, first + n)
    return built(cells[i_id::width], cells[i_url::width], columns, at, kept, rest)


def parsed_block(
    rows: Sequence[tuple[int, Any]],
    width: int,
    i_id: int,
    i_url: int,
    extras: list[tuple[int, str]],
    shifted: int,
) -> tuple[Measured, list[int]]:
    """:func:`context_block` for rows the csv module parsed (a chunk with quotes, or CRs that
    end no line): ``(line, fields)`` each, ``fields`` the error text of a row it could not
    parse. Fields come whole from the csv module (a quoted one may hold commas), so the
    columns are the rows transposed; the indexes returned are in ``rows``."""
    fields = list(map(_FIELDS, rows))
    rest: list[int] = []
    kept: list[int] | None = None
    if set(map(type, fields)) != {list} or set(map(len, fields)) != {width}:
        kept = [k for k, f in enumerate(fields) if type(f) is list and len(f) == width]
        rest = [k for k, f in enumerate(fields) if type(f) is not list or len(f) != width]
        fields = [fields[k] for k in kept]
    cells = list(zip(*fields, strict=True)) if fields else [()] * width
    columns = [(name, cells[index]) for index, name in extras]
    at = [shifted | line for line, _ in rows]
    return built(list(cells[i_id]), list(cells[i_url]), columns, at, kept, rest)


def built(
    ids: list[str],
    urls: list[str],
    columns: Sequence[tuple[str, Sequence[str]]],
    at: Sequence[int],
    kept: list[int] | None,
    rest: list[int],
) -> tuple[Measured, list[int]]:
    """The items of the rows whose id and URL pass (``at``: the positions of all the block's
    rows; ``kept``: the indexes of those the columns hold, None for all; ``rest``: those the
    caller checks, to which the rows that fail here are added)."""
    # PLAIN_URL is a head (the scheme, a first host character) and no whitespace after it:
    # with no whitespace in any URL (one C-level split over them all) the head alone is
    # matched, not every character of every URL.
    joined = "".join(urls)
    if joined.split(None, 1) == [joined]:
        passed = list(map(_URL_HEAD.match, urls))
    else:
        passed = list(map(PLAIN_URL.fullmatch, urls))
    if (  # (a URL holding another after "|", "," or ";": rules._JOINED decides)
        ("|" in joined or "," in joined or ";" in joined) and joined.count("://") != len(urls)
    ):
        passed = [None if u.count("://") != 1 else m for m, u in zip(passed, urls, strict=True)]
    if (
        None in passed
        or "" in ids
        or "\x00" in "".join(ids)
        or (len(max(ids, key=len, default="")) > MAX_ID_SAFE_CHARS and any(map(unkeyable, ids)))
    ):
        good = [
            match is not None and ident != "" and not unkeyable(ident)
            for match, ident in zip(passed, ids, strict=True)
        ]
        indexes = range(len(at)) if kept is None else kept
        rest = sorted(rest + [k for k, ok in zip(indexes, good, strict=True) if not ok])
        kept = list(compress(indexes, good))
        ids = list(compress(ids, good))
        urls = list(compress(urls, good))
        columns = [(name, list(compress(column, good))) for name, column in columns]
    size = sum(map(len, urls)) + sum(map(len, ids))
    positions = at if kept is None else [at[k] for k in kept]
    if not columns:
        # An id and a URL alone (a JSONL block of ``{"id", "url"}`` objects, or CSV columns
        # no rule reads besides): each request is its URL, as in :func:`plain_block`.
        return Measured(zip(ids, positions, urls, strict=True), size, (ids, positions)), rest
    # The context's fields in the struct's order, positionally: a column per field named by
    # the header (an empty cell is no value), None for each one before the last it names.
    by_name: dict[str, Any] = {"id": ids}
    for name, column in columns:
        size += sum(map(len, column))
        by_name[name] = [value or None for value in column]
    names = BulkContext.__struct_fields__
    last = max(map(names.index, by_name))  # (the fields after it left to their default)
    contexts = map(BulkContext, *[by_name.get(name, repeat(None)) for name in names[: last + 1]])
    requests = map(TaggingRequest, map(Image, repeat(_URL), urls), contexts)
    return Measured(zip(ids, positions, requests, strict=True), size, (ids, positions)), rest
