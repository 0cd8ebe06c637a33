"""Bytes that are not UTF-8 in a manifest (a catalogue exported as Latin-1 in places).

A chunk of a manifest that does not decode is decoded with ``surrogateescape``: each stray
byte is kept as a lone surrogate (U+DC80-U+DCFF), so the rows holding one can be found. A row
whose id or URL holds one is refused (a :class:`BadRow` saying which byte, with its id when
the id is clean): replacing the byte would change the id silently, and could make two ids one.
In any other field (brand, keywords, ...) the byte becomes U+FFFD, as a lenient reader would.
Clean chunks never come here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from .rules import jsonl_keys

__all__ = ["NOT_JSON", "BadRow", "decode", "screen_csv", "screen_line"]

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
    bad_id = isinstance(ident, str) and "\ufffd" in ident
    if bad_id or (isinstance(url, str) and "\ufffd" in url):
        what = "id" if bad_id else "url"
        clean = ident if isinstance(ident, str) and ident and not bad_id else None
        return BadRow(f"not UTF-8 text (in the {what}): save the manifest as UTF-8", clean)
    return obj


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
