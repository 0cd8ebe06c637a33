"""Whole blocks of plain CSV lines validated at once: the validator's fast paths.

A :class:`~.rows.PlainRows` block holds lines with no quote, CR or NUL, so each row is its
line split at commas. When every row of a block passes every rule, the block's requests can be
built column by column in C-level passes instead of row by row in Python; when any row breaks
a rule the functions here return None and the validator checks the block row by row (the
general path, which writes each bad row's reject). Both give the same items: the tests compare
them on every kind of bad line.

* :func:`plain_block`: the ``id,url`` (or ``url,id``) manifest, checked with one regex over
  the whole block.
* :func:`context_block`: ``id``, ``url`` and context fields taken as text (``brand``,
  ``gender``, ``price``, ...; a fashion catalogue's usual columns), any order, other columns
  ignored. A row of such a manifest cost ~4.3 us in the general path (a keyword-argument call
  per row, a rule per field) against ~1.3 for an ``id,url`` row. ``detection`` and ``age``
  columns have rules of their own (a list of allowed values; a ``|``-separated list): blocks
  with them take the general path.
"""

from __future__ import annotations

import re
from itertools import repeat
from typing import Any

from .._models import BulkContext, Image, ImageType, TaggingRequest
from .policy import Measured
from .rows import PlainRows

__all__ = ["context_block", "plain_block"]

_URL = ImageType.URL

#: A whole block of ``id,url`` (or ``url,id``) lines in which every row passes: a non-empty id
#: and an http(s) URL as :data:`~.rules.PLAIN_URL` takes it. The regex checks the shape of each
#: line (an id with no comma, the scheme, a first host character that is not ``/``, ``?`` or
#: whitespace) and lets the rest of the URL be anything up to the line's end; the caller adds
#: what it leaves out with two C-level passes over the block: as many commas as lines (so no
#: URL holds one) and no whitespace in any URL. Character classes that sre matches a byte at a
#: time (``[^\s,]``: a category test per character) cost 2.5x this split of the work.
_PLAIN_BLOCKS = {
    (0, 1): re.compile(r"(?:[^,\n]+,https?://[^/?\s][^\n]*\n)*"),
    (1, 0): re.compile(r"(?:https?://[^/?\s][^,\n]*,[^\n]+\n)*"),
}
#: URLs one a line (none holds a comma or a line break: they are cells of plain lines), each
#: as :data:`~.rules.PLAIN_URL` takes it but for whitespace after the host's first character,
#: which one C-level split over all of them finds.
_PLAIN_URLS = re.compile(r"(?:https?://[^/?\s][^\n]*\n)*")


def plain_block(rows: PlainRows, i_id: int, shifted: int) -> Measured | None:
    """The items of a block of ``id,url`` / ``url,id`` lines when every row passes (one
    regex over the block), else None (the caller checks row by row)."""
    lines = rows.lines
    text = "\n".join(lines) + "\n"
    if "\x00" in text:  # an id holding a NUL is refused row by row (see Validator._csv_row)
        return None
    if text.count(",") != len(lines) or _PLAIN_BLOCKS[i_id, 1 - i_id].fullmatch(text) is None:
        return None
    cells = text.replace(",", "\n").split("\n")  # id/url of each line, then "" at the end
    ids = cells[i_id:-1:2]
    urls = cells[1 - i_id : -1 : 2]
    # No whitespace in any URL: ``str.split()`` cuts at exactly what ``\s`` matches.
    joined = "".join(urls)
    if joined.split(None, 1) != [joined]:
        return None
    first = shifted | rows.first
    return Measured(
        [
            (ident, pos, TaggingRequest(Image(_URL, url), BulkContext(ident)))
            for pos, ident, url in zip(range(first, first + len(ids)), ids, urls, strict=True)
        ],
        len(text),  # (ids and URLs, a comma and a newline each)
    )


def context_block(
    rows: PlainRows,
    width: int,
    i_id: int,
    i_url: int,
    extras: list[tuple[int, str]],
    shifted: int,
) -> Measured | None:
    """The items of a block of lines of ``width`` fields (the id at ``i_id``, the URL at
    ``i_url``, the context field ``name`` at each ``(index, name)`` of ``extras``, other
    columns ignored) when every row passes, else None (the caller checks row by row).

    The rules, as the general path applies them to such a row: as many fields as the header
    (checked per line: a line short of a comma beside one with an extra one would keep the
    total), a non-empty id without NUL, an http(s) URL with a host and no whitespace, and each
    context field sent when it is not empty (as it is: no rule but its being text)."""
    lines = rows.lines
    n = len(lines)
    if set(map(str.count, lines, repeat(","))) != {width - 1}:
        return None
    cells = ",".join(lines).split(",")
    ids = cells[i_id::width]
    urls = cells[i_url::width]
    if "" in ids or "\x00" in "".join(ids):
        return None
    if _PLAIN_URLS.fullmatch("\n".join(urls) + "\n") is None:
        return None
    joined = "".join(urls)
    if joined.split(None, 1) != [joined]:  # (``\s``, as in plain_block)
        return None
    size = len(joined) + sum(map(len, ids))
    # The context's fields in the struct's order, positionally: a column per field named by
    # the header (an empty cell is no value), None for every row where the header has none.
    by_name: dict[str, Any] = {"id": ids}
    for index, name in extras:
        column = cells[index::width]
        size += sum(map(len, column))
        by_name[name] = [value or None for value in column]
    fields = [by_name.get(name, repeat(None)) for name in BulkContext.__struct_fields__]
    contexts = map(BulkContext, *fields)
    requests = map(TaggingRequest, map(Image, repeat(_URL), urls), contexts)
    first = shifted | rows.first
    return Measured(zip(ids, range(first, first + n), requests, strict=True), size)
