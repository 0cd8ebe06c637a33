"""Keeping ids a service may make one apart: never two of them in one task.

A service that changes the ids it echoes (case, whitespace, Unicode form, leading zeros: see
:mod:`.idmatch`) returns the results of ``a0`` and ``A0``, sent to one task, both under
``A0``; the sent ``A0`` matches the first exactly, and row ``A0`` would be written with image
``a0``'s result. So the task writer sends no two rows whose ids share a :func:`coarse_keys`
key to one task: a chunk holding such rows is split into parts of distinct keys
(:func:`key_parts`), and a chunk sharing a key with the open task's rows goes to a new task.
Every pair of ids :func:`~.idmatch.id_key` makes one shares a coarse key (the coarse key of an
id is that of its ``id_key``); the key is coarser (all whitespace dropped, a negative integer
one with its positive), which only costs a row going to another task. It also undoes changes
:func:`~.idmatch.id_key` does not (NFKC: full-width digits, ligatures; invisible characters
dropped; ``+`` URL-decoded): a result under such a changed id is no row's, and its row is sent
again, but one that was another id of the same task exactly would be taken for that row's
(percent escapes, which both decode, likewise).

The keys are made for a chunk at once, by string operations in C over its ids joined by NUL
(an id never holds one: the client refuses it), not one id at a time.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import cast

import msgspec

from .._models import TaggingRequest
from .policy import Chunk, OpenTask, encode_body, encode_ids

__all__ = ["clashes", "coarse_keys", "key_parts", "keyed"]

#: The sign and leading zeros of an id that is an integer (after its NUL; one digit is kept).
_SIGN_OR_ZEROS = re.compile(r"\x00(?:[+-]0*|0+)(?=[0-9]+(?:\x00|\Z))")
#: An id starting with a sign or a zero (searched for first: cheaper than the substitution).
_SIGN_OR_ZERO = re.compile(r"\x00[+0-]")

#: The default-ignorable code points (Unicode's DerivedCoreProperties): invisible, and dropped
#: by services that clean the ids they echo (zero-width space and joiners, soft hyphen, byte
#: order mark, variation selectors, ...).
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+"
)

#: A run of percent-encoded bytes (a service that URL-decodes the ids it echoes).
_PERCENT = re.compile(r"(?:%[0-9a-fA-F]{2})+")

#: Each ASCII byte of ids joined after NULs, mapped for :func:`_own_keys`: a byte the coarse key
#: changes anywhere (upper-case letters, ``%``, ``+``, the ASCII whitespace ``str.split``
#: drops) to 0xFF, a byte it may change after a NUL (``0``, ``-``: an integer's leading zeros
#: and sign) to 1, NUL to itself and every other byte to ``a``.
_OWN_KEY_BYTES = bytes(
    0
    if b == 0
    else 0xFF
    if chr(b).isspace() or chr(b).lower() != chr(b) or chr(b) in "%+"
    else 1
    if chr(b) in "0-"
    else ord("a")
    for b in range(256)
)
#: An id starting with a zero or a minus sign, in ids mapped by ``_OWN_KEY_BYTES``.
_MAPPED_SIGN_OR_ZERO = re.compile(b"\x00\x01")

#: A chunk's requests, each left encoded (encoded again as it is: the same bytes).
_requests_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def _folded(text: str) -> str:
    """``text`` NFKC, case-folded, without default-ignorable code points."""
    if text.isascii():  # (NFKC changes no ASCII text, nor casefold but its case)
        return text.lower()
    text = unicodedata.normalize("NFKC", _IGNORABLE.sub("", text)).casefold()
    return _IGNORABLE.sub("", unicodedata.normalize("NFKC", text))


def _bytes(match: re.Match[str]) -> str:
    """A run of percent-encoded bytes decoded (as UTF-8; a NUL dropped: no id holds one)."""
    data = bytes.fromhex(match.group().replace("%", ""))
    return data.decode("utf-8", "replace").replace("\x00", "")


def _own_keys(joined: str) -> bool:
    """True when every id of ``joined`` (ids each after a NUL) is its own coarse key, told by
    one table lookup a byte where the general path (:func:`_block`) folds, splits and searches:
    the common case (lower-case ASCII ids, no whitespace, ``%`` or ``+``, none starting with a
    sign or zero). False is safe: the general path then makes the same keys, only slower."""
    if not joined.isascii():
        return False
    mapped = joined.encode("ascii").translate(_OWN_KEY_BYTES)
    # ASCII text folds by lower() alone (no upper-case letter: unchanged); without % or + it
    # is not URL-decoded; without whitespace nothing is split out; and no id starts with a
    # sign or zero (+ is refused anywhere) for the integer's sign and zeros to be dropped.
    return b"\xff" not in mapped and _MAPPED_SIGN_OR_ZERO.search(mapped) is None


def _block(ids: Sequence[str]) -> tuple[str, str]:
    """``ids`` joined, each after a NUL, and their coarse keys joined the same way."""
    joined = "\x00" + "\x00".join(ids)
    if _own_keys(joined):
        return joined, joined
    return joined, _general(joined)


def _general(joined: str) -> str:
    """The coarse keys of the ids of ``joined`` (each after a NUL), joined the same way."""
    text = _folded(joined)
    if "%" in text or "+" in text:  # (URL-decoded: "a%20b" is "a b", and "x+y" "x y")
        while (decoded := _PERCENT.sub(_bytes, text)) != text:
            text = decoded  # (until no escape is left: "%2541" is "%41", then "a")
        text = _folded(text).replace("+", "")
    text = "".join(text.split())
    if _SIGN_OR_ZERO.search(text):
        text = _SIGN_OR_ZEROS.sub("\x00", text)
    return text


def coarse_keys(ids: Sequence[str]) -> list[str]:
    """The coarse key of each of ``ids``: URL-decoded, NFKC, case-folded, NFKC again, without
    whitespace, ``+`` and default-ignorable code points, and an integer without its sign and
    leading zeros."""
    return _block(ids)[1][1:].split("\x00")


def keyed(ids: Sequence[str]) -> set[str]:
    """The coarse keys of ``ids``: fewer than ``ids`` when two of them share a key. (Ids that
    are their own keys, lower-case ones, the common case, are not split out again.)"""
    joined, text = _block(ids)
    return set(ids) if text == joined else set(text[1:].split("\x00"))


def clashes(task: OpenTask, keys: set[str]) -> bool:
    """True when a row of ``keys`` may not go to ``task``: an id of the task has its key (one
    sent again to it, a part of a write refused whole, goes to another task too)."""
    return not task.keys.isdisjoint(keys)


def key_parts(chunk: Chunk) -> list[tuple[Chunk, bytes]]:
    """``chunk``'s rows in parts whose ids have distinct coarse keys (the n-th row of a key in
    the n-th part), each with its body to store (chunk ids 0 until written ahead)."""
    rows: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, key in enumerate(coarse_keys(chunk.ids)):
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(rows):
            rows.append([])
        rows[n].append(i)
    requests = cast(list[TaggingRequest], _requests_decoder.decode(chunk.requests.raw))
    out = []
    for part in rows:
        positions = [chunk.positions[i] for i in part]
        body, encoded = encode_body(positions, [requests[i] for i in part], chunk.sends)
        ids = [chunk.ids[i] for i in part]
        out.append((Chunk(0, ids, positions, encoded, sends=chunk.sends), body))
    return out


def stored(parts: list[tuple[Chunk, bytes]]) -> list[tuple[int, int, bytes, bytes]]:
    """``parts`` as :meth:`StateStore.split_chunk` stores them."""
    return [(len(p.ids), max(p.positions), body, encode_ids(p.ids)) for p, body in parts]
