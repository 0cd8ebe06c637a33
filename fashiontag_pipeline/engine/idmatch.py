"""Telling which sent row a result is for when the service changed its id on the way back.

The spec has the service return each result under the ``context.id`` it was sent, but services
normalise the ids they echo: they strip or collapse whitespace, normalise Unicode (NFC), change
letter case, write a numeric-looking id as a JSON number (``"id": 7`` for ``"007"``), cut
ids longer than some length, or percent-encode (or decode) an id that is a URL. A result under
an id never sent to its task is then no row's outcome as it stands, and every row of such a
service would be sent (and billed) again ``max_sends`` times, then rejected, although the
service answered each one.

:func:`id_key` reduces an id to what those changes leave of it; :class:`IdMatcher` finds, among
the ids sent to one task, the one a changed id stands for: the single sent id with the same key,
or, for a key of at least :data:`MIN_PREFIX` characters, the single sent id whose key starts
with it (an id cut short; one cut by UTF-16 code units across an emoji ends in U+FFFD, which is
left out). When two ids sent to the task share that key or prefix, the result cannot be told
apart and is none (its row is sent again in another task, where it may not be shared). An id
cut short is also checked against the run's other ids by the pagers (another task's result,
under its own id or the start of it, is none of this task's rows). Pure and cheap to build;
only a task whose results carry a changed id builds one.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from urllib.parse import unquote

__all__ = ["CUT_PAIR", "MIN_PREFIX", "EchoedIds", "IdMatcher", "id_key"]

#: The shortest key taken as an id cut short: a service that cuts ids does so at a length
#: meant for ids (tens of characters), and a short prefix shared by one id is a coincidence.
MIN_PREFIX = 16

#: What is left of a surrogate pair cut in half by a service that cuts ids by UTF-16 code units
#: (an emoji across the cut), as the pagers read it (:mod:`.._surrogates`).
CUT_PAIR = "\ufffd"

_INTEGER = re.compile(r"([+-]?)0*([0-9]+)")


def id_key(ident: str | int) -> str:
    """``ident`` without what services change in ids they echo: percent escapes, surrounding
    and repeated whitespace, Unicode form, letter case, and the leading zeros and plus sign of
    an integer (``" 007 "``, ``"7"``, ``7`` and ``"+7"`` have one key; ``"a%20b"`` and
    ``"a b"`` too)."""
    if isinstance(ident, int):
        text = str(ident)
    else:
        while "%" in ident and (decoded := unquote(ident)) != ident:
            ident = decoded  # (as the coarse key: "%2541" is "%41", then "A")
        text = " ".join(unicodedata.normalize("NFC", ident).split())
        text = unicodedata.normalize("NFC", text.casefold())
    number = _INTEGER.fullmatch(text)
    if number is not None:
        sign, digits = number.groups()
        return "-" + digits if sign == "-" and digits != "0" else digits
    return text


class IdMatcher:
    """The ids sent to one task, found by the key of an id the service changed."""

    def __init__(self, sent: set[str]) -> None:
        by_key: dict[str, str | None] = {}
        for ident in sent:
            key = id_key(ident)
            # Two ids of one key: a result under that key is either's (None: no match).
            by_key[key] = ident if key not in by_key else None
        self._by_key = by_key
        self._keys: list[str] | None = None

    def match(self, ident: str | int) -> str | None:
        """The sent id that ``ident`` stands for, or None when none does or more than one
        might."""
        return self.find(ident)[0]

    def find(self, ident: str | int) -> tuple[str | None, bool]:
        """(:meth:`match`, True when ``ident`` is taken as that id cut short): an id cut
        short may also be another task's id, or the start of one, which the caller checks."""
        key = id_key(ident)
        if key in self._by_key:
            return self._by_key[key], False
        if isinstance(ident, str) and key.endswith(CUT_PAIR):
            key = key.rstrip(CUT_PAIR)  # cut across an emoji: its first half, read as U+FFFD
        if not isinstance(ident, str) or len(key) < MIN_PREFIX:
            return None, False
        # Cut short: the one key that starts with it (sorted, they sit side by side).
        keys = self._keys
        if keys is None:
            keys = self._keys = sorted(self._by_key)
        i = bisect.bisect_left(keys, key)
        if i == len(keys) or not keys[i].startswith(key):
            return None, False
        if i + 1 < len(keys) and keys[i + 1].startswith(key):
            return None, False
        return self._by_key[keys[i]], True


def _echoed(echo: str, ids: list[str]) -> str | None:
    """The id a shortened echo stands for (a service may cut a long id in its ``failureList``,
    ending it with an ellipsis); None when none or several match. Without this, the refused
    row counted as accepted and was sent again for ever."""
    stem = echo.rstrip("…").rstrip(".")
    if not stem or stem == echo:
        return None
    found = [i for i in ids if i.startswith(stem) and len(i) > len(stem)]
    return found[0] if len(found) == 1 else None


class EchoedIds:
    """The id of a write's rows that an id echoed in its answer's ``failureList`` names: as
    sent, changed as the results pages' ids are (``"id": 17`` for ``"017"``, case:
    :class:`IdMatcher`), or shortened (:func:`_echoed`, or cut), in that order; None when none
    (or several) match. Before, a refused ``017`` echoed as 17 was taken as accepted and sent
    again until ``max_sends``. Its set and matcher are built when an echo needs them (a
    write's answer seldom lists any)."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self._mine: set[str] | None = None
        self._matcher: IdMatcher | None = None

    @property
    def mine(self) -> set[str]:
        if self._mine is None:
            self._mine = set(self.ids)
        return self._mine

    def __call__(self, ident: str | None) -> str | None:
        if ident is None or ident in self.mine:
            return ident
        if self._matcher is None:
            self._matcher = IdMatcher(self.mine)
        found, is_cut = self._matcher.find(ident)
        if found is not None and not is_cut:
            # An id of the write changed (case, spacing, zeros) before an id cut short: the
            # echo ``SKU...`` of ``sku...`` was taken for ``SKU-12`` cut, the wrong row.
            return found
        if (cut := _echoed(ident, self.ids)) is not None:
            return cut
        return found
