"""Bytes that are not UTF-8 in a manifest (a catalogue exported as Latin-1 in places).

A chunk of a manifest that does not decode is decoded with ``surrogateescape``: each stray
byte is kept as a lone surrogate (U+DC80-U+DCFF), so the rows holding one can be found. A row
whose id or URL holds one is refused (a :class:`BadRow` saying which byte, with its id when
the id is clean): replacing the byte would change the id silently, and could make two ids one.
In any other field (brand, keywords, ...) the byte becomes U+FFFD, as a lenient reader would.
Clean chunks never come here. A JSONL line escaping half of a UTF-16 surrogate pair
(``"\\ud83d"``), which the JSON decoder refuses, is read the same way
(:func:`screen_escapes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from .._surrogates import mend
from .rules import jsonl_keys

__all__ = ["NOT_JSON", "BadRow", "decode", "screen_csv", "screen_escapes", "screen_line"]

#: A byte that is not UTF-8, as ``surrogateescape`` keeps it.
_STRAY = re.compile("[\udc80-\udcff]")
_json_decoder = msgspec.json.Decoder()
#: What the JSON decoder raises for a line that is not JSON: RecursionError for one nested
#: deeper than the interpreter's recursion limit (~1,000 levels), the run's end otherwise.
NOT_JSON = (msgspec.DecodeError, RecursionError)


class BadRow(str):
    """A row the source refuses: the reason (a ``str``, as any unparsable row), and the row's
    id when it could be read (``ident``), for its rejects line."""

    ident: str | None

    def __new__(cls, reason: str, ident: str | None = None) -> BadRow:
        row = super().__new__(cls, reason)
        row.ident = ident
        return row


def decode(data: bytes, encoding: str) -> tuple[str, bool]:
    """``data`` as text, and whether some bytes are not UTF-8 (kept as lone surrogates)."""
    try:
        return data.decode(encoding), False
    except UnicodeDecodeError:
        return data.decode(encoding, "surrogateescape"), True


def has_stray(text: str) -> bool:
    return _STRAY.search(text) is not None


def _reason(text: str, what: str) -> str | None:
    found = _STRAY.search(text)
    if found is None:
        return None
    byte = ord(found.group()) - 0xDC00
    return f"not UTF-8 text (byte 0x{byte:02X} in the {what}): save the manifest as UTF-8"


def _replaced(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def screen_csv(rows: Iterable[tuple[int, Any]], header: Sequence[str]) -> list[tuple[int, Any]]:
    """CSV rows (fields, or a ``str`` for a row the parser refused) of a chunk that holds stray
    bytes: a row whose id or URL holds one becomes a :class:`BadRow`; in other fields the byte
    becomes U+FFFD."""
    index = {name: i for i, name in enumerate(header)}  # the last of a repeated name, as
    i_id, i_url = index.get("id", -1), index.get("url", -1)  # the validator reads it
    out: list[tuple[int, Any]] = []
    for line, fields in rows:
        if isinstance(fields, str):
            out.append((line, _replaced(fields) if has_stray(fields) else fields))
            continue
        if not any(map(has_stray, fields)):
            out.append((line, fields))
            continue
        ident = fields[i_id] if 0 <= i_id < len(fields) else None
        url = fields[i_url] if 0 <= i_url < len(fields) else ""
        reason = (_reason(ident, "id") if ident else None) or _reason(url, "url")
        if reason is not None:
            clean = ident if ident and not has_stray(ident) else None
            out.append((line, BadRow(reason, clean)))
        else:
            out.append((line, [_replaced(f) if has_stray(f) else f for f in fields]))
    return out


def screen_line(text: str, kind: str) -> Any:
    """One JSONL line or URL-list line that holds stray bytes, as the source's row value: a
    :class:`BadRow` when its id or URL holds one, else the decoded object (JSONL) with U+FFFD
    in the other fields."""
    if kind == "urls":
        return BadRow(_reason(text, "url") or "not UTF-8 text")
    try:
        obj = _json_decoder.decode(_replaced(text))
    except NOT_JSON as err:
        return BadRow(f"not valid JSON: {err}")
    if not isinstance(obj, dict):
        return obj
    refused = _refused(obj, "\ufffd", "not UTF-8 text (in the {}): save the manifest as UTF-8")
    return obj if refused is None else refused


#: Where :func:`screen_escapes` mended an escape: a noncharacter, in no catalogue's text.
_MARK = "\uffff"
_HALF_PAIR = (
    "the {} holds half of a UTF-16 surrogate pair (a lone \\ud83d-like escape: an emoji cut in"
    " two by the exporter)"
)


def screen_escapes(text: str) -> Any:
    """A JSONL line the JSON decoder refused for escaping half of a UTF-16 surrogate pair
    (``\\ud83d``: an exporter in Java, .NET or JavaScript that cut a name across an emoji),
    read as a line with a stray byte is: U+FFFD in its place in a context field; a
    :class:`BadRow` saying so (with the id when it is clean) when the id or the URL holds
    one. None when the line holds no such escape, or does not decode with them mended (its
    fault is another)."""
    data = text.encode("utf-8", "surrogateescape")
    mended = mend(data)
    marked = mend(data, _MARK.encode("unicode_escape"))
    if mended is None or marked is None:
        return None
    try:
        obj = _json_decoder.decode(mended)
        if not isinstance(obj, dict):
            return obj
        refused = _refused(_json_decoder.decode(marked), _MARK, _HALF_PAIR)
    except NOT_JSON:
        return None
    return obj if refused is None else refused


def _refused(obj: dict[str, Any], mark: str, reason: str) -> BadRow | None:
    """The reject of a row whose id or URL holds ``mark`` (``reason`` naming which), with its
    id when that is clean; None when neither does."""
    # Its id and URL as the validator reads them: under their keys in any case (``ID``, ``URL``).
    read = _read_as(obj)
    context = read.get("context")
    ident = read.get("id")
    if ident is None and isinstance(context, dict):
        ident = _read_as(context).get("id")
    image = read.get("image")
    url = read.get("url")
    if "url" not in read and isinstance(image, dict):
        url = image.get("content")
    bad_id = isinstance(ident, str) and mark in ident
    if bad_id or (isinstance(url, str) and mark in url):
        clean = ident if isinstance(ident, str) and ident and not bad_id else None
        return BadRow(reason.format("id" if bad_id else "url"), clean)
    return None


def _read_as(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the keys it names in another case (``ID``) under their names, as the
    validator reads them (:func:`.rules.jsonl_keys`); as it is when two keys name one field
    (its row is refused for that)."""
    renames = jsonl_keys(tuple(obj))
    if isinstance(renames, str) or not renames:
        return obj
    read = dict(obj)
    for key, name in renames:
        read[name] = read.pop(key)
    return read
