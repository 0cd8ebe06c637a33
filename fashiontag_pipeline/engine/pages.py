"""A results page, decoded once: its rows with their tagging results kept as raw JSON.

:func:`decode_page` gives each row's id and the result's bytes as the server sent them (the
JSONL sink writes them with no re-encode). :func:`count_outcomes` and :func:`success_flags`
tell a success from a failure by the result's ``status`` key, first or last, with any JSON
spacing: a page whose every row succeeded costs one C-level regex pass, and a row of any other
shape is decoded, so a server's formatting changes neither the outcome nor, much, the cost.

A row whose tagging result is not a JSON object (``null``, a string, or no ``taggingResult`` at
all) is no outcome of its image: :func:`screen` leaves it out (the pagers send the row again),
on the same pass that finds a page all successes, so the usual page pays nothing for it.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import msgspec

from .._models import STATUS_SUCCESS, says_success
from .._surrogates import mend

__all__ = [
    "NO_ID",
    "NotAPage",
    "Page",
    "PageRow",
    "count_outcomes",
    "decode_page",
    "page_decoder",
    "result_status",
    "screen",
    "success_flags",
]

#: What a row without a ``taggingResult`` holds: no JSON value at all (never an object).
_NO_RESULT = msgspec.Raw(b"")
#: The id of a result whose id is no text nor integer (``null``, a float, an object, none):
#: an id never sent (an id holding a NUL is a client reject, never sent to a task).
NO_ID = "\x00(no id)"


class PageRow(msgspec.Struct, rename="camel", gc=False):
    """One result of a page, its tagging result kept as raw JSON (empty when the server sent
    none: :func:`screen` leaves such a row out)."""

    id: str
    tagging_result: msgspec.Raw = _NO_RESULT


class PageData(msgspec.Struct, gc=False):
    #: ``null`` (a Go service's empty slice) is no row: see :func:`decode_page`.
    results: list[PageRow] | None = []


class Page(msgspec.Struct, gc=False):
    """A results page as the pagers decode it (the typed shape is in ``_models``). Its
    ``status`` may be absent: spec 4.6 shows a results body of ``data`` alone."""

    status: str | None = None
    data: PageData | None = None
    error: str | None = None


class NotAPage(ValueError):
    """A results answer in the spec's shape whose ``status`` is not ``success``: a refusal
    with HTTP 200 (``{"status":"failure","error":...}``), no page of results."""


class _Status(msgspec.Struct, gc=False):
    #: Any JSON value: a status that is no text (``1``) is a failure's, not a result's absence.
    status: Any = ""


class _NumberedRow(msgspec.Struct, rename="camel", gc=False):
    """A result whose id may be a JSON number (``"id": 7``: a service that writes a
    numeric-looking id as a number), or any other JSON value, or none (:data:`NO_ID`)."""

    id: Any = None
    tagging_result: msgspec.Raw = _NO_RESULT


class _NumberedData(msgspec.Struct, gc=False):
    #: Each element as it came (one that is no object, ``null`` in place of a result, is a
    #: row with no id and no tagging result: :func:`screen` leaves it out).
    results: list[msgspec.Raw] | None = []


class _NumberedPage(msgspec.Struct, gc=False):
    status: str | None = None
    data: _NumberedData | None = None
    error: str | None = None


page_decoder = msgspec.json.Decoder(Page)
_numbered_decoder = msgspec.json.Decoder(_NumberedPage)
_numbered_row_decoder = msgspec.json.Decoder(_NumberedRow)
_status_decoder = msgspec.json.Decoder(_Status)


#: A tagging result whose first key is ``status``, with any JSON whitespace (how the reference
#: service and the spec order it), or whose last key is (a server that writes keys in another
#: order, e.g. reversed). Either is the top-level ``status``: a nested object's key can be
#: neither the first after the opening brace nor followed by the closing brace and the end.
#: Anything else (``status`` between other keys) is decoded.
_STATUS_FIRST = re.compile(rb'\{\s*"status"\s*:\s*"([^"\\]*)"')
_STATUS_LAST = re.compile(rb'"status"\s*:\s*"([^"\\]*)"\s*\}\s*\Z')
#: The same two shapes with the value ``success``: a page is classified with one C-level pass
#: of one of these over its rows (``map``), no Python code per row, whichever the key order.
_SUCCESS_FIRST = re.compile(rb'\{\s*"status"\s*:\s*"success"')
#: The first of them without whitespace (how the reference service and most servers write it):
#: the result's first bytes, read with a C-level struct unpack (:func:`_all_exact`).
_EXACT_PREFIX = b'{"status":"success"'
_EXACT_HEAD = (_EXACT_PREFIX,)
_exact_head = struct.Struct(f"{len(_EXACT_PREFIX)}s").unpack_from
_SUCCESS_LAST = re.compile(rb'"status"\s*:\s*"success"\s*\}\s*\Z')
_TAIL = 64
_SUCCESS = STATUS_SUCCESS.encode()
_FAILURE = b"failure"


def decode_page(body: bytes) -> list[PageRow]:
    """The rows of a results page (msgspec.DecodeError when it is not one; :class:`NotAPage`
    when its ``status`` says it is a refusal: the spec counts any status but ``success`` a
    failure).

    A result is kept as the bytes the server sent, so a server that pretty-prints its JSON
    sends line breaks inside them, and the results JSONL must hold one line per result: in a
    valid JSON value a CR or LF byte can only be whitespace between tokens (never inside a
    string), so each becomes a space. A page with none (one ``memchr`` over the body) is
    taken as it is. JSON nested deeper than msgspec reads (its recursion limit), or a string
    that is not UTF-8 (a server writing ISO-8859-1), is no page either: a DecodeError, never
    a RecursionError or UnicodeDecodeError. A page that escapes half of a surrogate
    pair (an id cut by UTF-16 code units across an emoji) is read with ``\ufffd`` in its place
    (:mod:`.._surrogates`; an id cut so is matched by :mod:`.idmatch`)."""
    try:
        try:
            page = page_decoder.decode(body)
        except msgspec.DecodeError:
            page = _numbered(body)
    except msgspec.DecodeError:
        mended = mend(body)
        if mended is None:
            raise
        return decode_page(mended)
    except RecursionError as err:
        raise msgspec.DecodeError(f"JSON nested too deep to read ({err})") from None
    except UnicodeDecodeError as err:  # (msgspec's word for bytes that are not UTF-8)
        raise msgspec.DecodeError(f"not UTF-8 text ({err})") from None
    if page.status is None:
        # Spec 4.6 lists a results page's body as ``data`` alone (4.4 and 4.5 list a
        # ``status``): a page without one is the page, unless it holds no ``data`` (an
        # ``{"error": ...}``). Before, such a page was "missing required field status", every
        # read of it failed, and its rows were sent, and billed, again.
        if page.data is None:
            reason = page.error or "no reason given"
            raise NotAPage(f"HTTP 200 with no status and no data: {reason}")
    elif not says_success(page.status):
        raise NotAPage(f"HTTP 200 with status {page.status!r}: {page.error or 'no reason given'}")
    rows = (page.data.results if page.data is not None else None) or []
    if b"\n" in body or b"\r" in body:
        rows = [_one_line(row) for row in rows]
    return rows


def _numbered(body: bytes) -> Page:
    """A page whose ids are not all text, or whose results are not all objects: an integer's
    id as text (``7`` -> ``"7"``: the pagers find the sent id it stands for, ``"007"`` too),
    any other (``null``, ``7.0``, ``true``, an object, none) :data:`NO_ID`, a result under no
    id sent (its row is sent again, the rest of the page is read); an element that is no
    object (``null`` in place of a result, a string) a row with neither id nor tagging result
    (:func:`screen` leaves it out: its row is sent again, the rest of the page is read); the
    first error again when it is no page of that shape either."""
    try:
        page = _numbered_decoder.decode(body)
    except msgspec.DecodeError:
        page_decoder.decode(body)  # raises the error of the spec's shape
        raise
    rows = (page.data.results if page.data is not None else None) or []
    return Page(page.status, PageData([_numbered_row(raw) for raw in rows]), page.error)


def _numbered_row(raw: msgspec.Raw) -> PageRow:
    try:
        row = _numbered_row_decoder.decode(raw)
    except msgspec.DecodeError:  # no object (``null``, a string, a number, a list)
        return PageRow(NO_ID, _NO_RESULT)
    return PageRow(_text_id(row.id), row.tagging_result)


def _text_id(ident: Any) -> str:
    if isinstance(ident, str):
        return ident
    if isinstance(ident, int) and not isinstance(ident, bool):
        return str(ident)
    return NO_ID


def _one_line(row: PageRow) -> PageRow:
    raw = bytes(row.tagging_result)
    if b"\n" not in raw and b"\r" not in raw:
        return row
    return PageRow(row.id, msgspec.Raw(raw.replace(b"\r", b" ").replace(b"\n", b" ")))


def count_outcomes(rows: list[PageRow]) -> tuple[int, int]:
    """(tagged ok, tagging failed) among a page's rows.

    A result whose first or last key is ``status`` is classified from that key alone, whatever
    the spacing; any other shape is decoded, which is correct but costs a parse of the row.
    A page whose every row says ``success`` in its first key, or every row in its last key,
    costs one C-level regex pass (see :func:`success_flags`)."""
    ok = _all_success(_raws(rows))
    if ok is not None:
        return ok, 0
    ok = sum(success_flags(rows))
    return ok, len(rows) - ok


def _all_exact(raws: list[msgspec.Raw]) -> bool:
    """Whether every result starts with :data:`_EXACT_PREFIX` (no whitespace): each one's first
    bytes, unpacked in C, and the heads equal to it counted by ``list.count`` (one C loop, no
    ``map``/``all`` of comparisons: ~15% fewer instructions a row). The same test as a match
    of the literal's regex, at ~half of its instructions per row (sre sets a match state up for
    every call and allocates its match); a result shorter than the prefix (``null``, none)
    raises, and is not one."""
    try:
        return [*map(_exact_head, raws)].count(_EXACT_HEAD) == len(raws)
    except struct.error:
        return False


def _raws(rows: list[PageRow]) -> list[msgspec.Raw]:
    """The rows' tagging results. (A comprehension: its attribute loads are specialized for the
    struct's slots, ~half the instructions of ``map(operator.attrgetter(...))``, whose every
    call looks the name up.)"""
    return [row.tagging_result for row in rows]


def _all_success(raws: list[msgspec.Raw]) -> int | None:
    """``len(raws)`` when every result's status is ``success`` (the usual page), found with
    one pass of a regex over the rows; None when some row needs a closer look."""
    if _all_exact(raws) or None not in map(_SUCCESS_FIRST.match, raws):
        return len(raws)
    # Keys in another order (status last): the same, from each row's last bytes. A row whose
    # first key is a status takes that status (as in success_flags), so none may have one.
    starts = [n - _TAIL if n > _TAIL else 0 for n in map(len, raws)]
    if None not in map(_SUCCESS_LAST.search, raws, starts) and not any(
        map(_STATUS_FIRST.match, raws)
    ):
        return len(raws)
    return None


def screen(rows: list[PageRow]) -> tuple[list[PageRow], bool]:
    """(the rows whose tagging result is a JSON object, True when every row is a success).

    The usual page (every row a success) costs the one regex pass of :func:`count_outcomes`,
    whose work it saves (see :meth:`~.state.Journal.commit`'s ``all_success``); on any other
    page each row is classified as :func:`success_flags` does, and a row whose result is not an
    object (``null``, a string, none at all) is left out. An object whose ``status`` is no
    string (``"status": 1``) is the service's answer for its image, a failure (DESIGN: any
    status but ``success``): left out, its row was sent (and billed) again on every task."""
    raws = _raws(rows)
    if _all_success(raws) is not None:
        return rows, True
    statuses = list(map(_status_of, raws))
    if None not in statuses:
        return rows, False
    return [row for row, status in zip(rows, statuses, strict=True) if status is not None], False


def _status_of(raw: msgspec.Raw) -> bytes | None:
    """The ``status`` of a tagging result (b"" when it has none or it is no string), None when
    it is not one (no JSON object)."""
    found = _STATUS_FIRST.match(raw)
    if found is None:
        n = len(raw)
        found = _STATUS_LAST.search(raw, n - _TAIL if n > _TAIL else 0)
    if found is not None:
        status: bytes = found.group(1)
        return status
    try:
        status = _status_decoder.decode(raw).status
    except msgspec.DecodeError:  # not an object
        return None
    except UnicodeDecodeError:  # a status not in UTF-8 (ISO-8859-1): no success, U+FFFD in it
        return _status_of(msgspec.Raw(bytes(raw).decode("utf-8", "replace").encode()))
    return status.encode() if isinstance(status, str) else b""


def result_status(raw: msgspec.Raw) -> str:
    """The ``status`` of a tagging result as the pages count it ("" when it has none): its
    first or last key with any spacing, else the decoded object's; a result whose status is
    no string gives ""."""
    status = _status_of(raw)
    return "" if status is None else status.decode("utf-8", "replace")


def success_flags(rows: list[PageRow]) -> list[bool]:
    """Per row of a page: is its tagging result a success (see :func:`count_outcomes`; a row
    :func:`screen` would leave out is no success)."""
    raws = _raws(rows)
    if _all_success(raws) is not None:
        return [True] * len(raws)
    success, failure = _SUCCESS, _FAILURE
    # ``success`` in another case (``SUCCESS``: the spec shows no values) is a success too;
    # the usual two words cost a comparison each.
    return [
        status == success or (status is not None and status != failure and _says(status))
        for status in map(_status_of, raws)
    ]


def _says(status: bytes) -> bool:
    return says_success(status.decode("utf-8", "replace"))
