"""What :mod:`.fastrender` joins: JSON fragments encoded once, and the draws that pick them.

Every catalogue entry of a language is encoded once as the prefix of its JSON object
(``{"id":"C01","name":"top","confidence":``), every 4-decimal float in [0, 1] once with the
closing brace of its object, so that rendering a result is joining bytes. :func:`draw_one` and
:func:`draw_many` draw exactly the random numbers ``StructRenderer._one`` and ``_many``
(:mod:`.render`) draw and return the encoded list instead of structs.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING

import msgspec

from ._synthesis import DETECTIONS

if TYPE_CHECKING:
    from .taxonomy import Entry, Taxonomy

__all__ = ["CONF", "FL", "Fragments", "draw_many", "draw_one", "encoded_float", "k4"]

_encode = msgspec.json.encode
_first = itemgetter(0)

#: ``CONF[k]``: the encoded form of the float ``k / 10000`` (what ``round(x, 4)`` gives for
#: ``k = round(x * 10000)``) and the closing brace of its object, for k in 0..10000.
CONF: list[bytes] = [_encode(k / 10000) + b"}" for k in range(10001)]
#: ``FL[k]``: the encoded float ``k / 10000`` for k in 0..20000 (positions reach 1.275).
FL: list[bytes] = [_encode(k / 10000) for k in range(20001)]
_FLOATS: dict[float, bytes] = {k / 10000: _encode(k / 10000) for k in range(10001)}


def encoded_float(value: float) -> bytes:
    encoded = _FLOATS.get(value)
    return encoded if encoded is not None else _encode(value)


def k4(x: float) -> int:
    """``k`` such that ``round(x, 4) == k / 10000``, for 0 <= x < 2 (exactly; see _many)."""
    t = x * 10000.0
    k = int(t + 0.5)
    if -0.4999 < t - k < 0.4999:
        return k
    return round(round(x, 4) * 10000.0)


def _conf(x: float) -> bytes:
    """``encoded_float(round(x, 4)) + b"}"`` for 0 <= x <= 1."""
    return CONF[k4(x)]


def _id_name(entry: Entry, lang: int) -> bytes:
    return _encode({"id": entry.id, "name": entry.names[lang]})


def _scored_prefix(entry: Entry, lang: int) -> bytes:
    # '{"id":"C01","name":"top","confidence":' - the value and '}' follow.
    return _encode({"id": entry.id, "name": entry.names[lang], "confidence": 0})[:-2]


def _scored_list(entries: tuple[Entry, ...], lang: int) -> tuple[bytes, ...]:
    return tuple(_scored_prefix(e, lang) for e in entries)


class Fragments:
    """Everything of one language, encoded once."""

    def __init__(self, tax: Taxonomy, lang: int) -> None:
        self.imageinfo = tuple(_id_name(e, lang) for e in tax.imageinfo)
        self.gender = tuple(_id_name(e, lang) for e in tax.gender)
        self.colors = _scored_list(tax.colors, lang)
        self.materials = _scored_list(tax.materials, lang)
        self.looks = _scored_list(tax.looks, lang)
        self.details = _scored_list(tax.details, lang)
        self.prints = _scored_list(tax.prints, lang)
        self.textures = _scored_list(tax.textures, lang)
        self.length = _scored_list(tax.length, lang)
        self.fit = _scored_list(tax.fit, lang)
        self.shape = _scored_list(tax.shape, lang)
        self.neck_line = _scored_list(tax.neck_line, lang)
        self.heel_height = _scored_list(tax.heel_height, lang)
        self.toe_type = _scored_list(tax.toe_type, lang)
        self.heel_shape = _scored_list(tax.heel_shape, lang)
        self.sole_type = _scored_list(tax.sole_type, lang)
        self.sleeve_length = tuple(
            b',"sleeveLength":' + _id_name(e, lang) for e in tax.sleeve_length
        )
        # Per group index, per category: ('{"info":[...],"category":{...},"position":{"x":',
        # the scored prefixes of the category's items).
        self.categories: tuple[tuple[tuple[bytes, tuple[bytes, ...]], ...], ...] = tuple(
            tuple(
                (
                    b'{"info":['
                    + _id_name(tax.info[d], lang)
                    + b'],"category":'
                    + _id_name(e, lang)
                    + b',"position":{"x":',
                    _scored_list(tax.items[e.id], lang),
                )
                for e in tax.categories[d]
            )
            for d in DETECTIONS
        )
        palette = tax.palette
        # '{"code":"a1b2c3","name":"...","pixelFraction":'
        self.palette = tuple(
            _encode({"code": palette.code(i), "name": palette.name(i, lang), "pixelFraction": 0})[
                :-2
            ]
            for i in range(palette.size)
        )


def draw_one(rnd: Callable[[], float], entries: tuple[bytes, ...]) -> bytes:
    """Mirrors ``StructRenderer._one``: b"" when the draw is below the threshold."""
    point = rnd() * len(entries)
    index = int(point)
    # k = round(point - index, 4) * 10000, exactly (see _many).
    t = (point - index) * 10000.0
    k = int(t + 0.5)
    if not -0.4999 < t - k < 0.4999:
        k = k4(point - index)
    if k < 2000:  # conf < MIN_CONFIDENCE
        return b""
    return entries[index] + CONF[k]


def draw_many(
    rnd: Callable[[], float], entries: tuple[bytes, ...], most: int, chance: float
) -> bytes:
    """Mirrors ``StructRenderer._many``: the encoded list, b"" when empty.

    Confidences are handled as integers ``k = round(conf, 4) * 10000``: ``int(t + 0.5)`` of
    ``t = conf * 10000.0`` is exact unless t lies within float error of a half (a tie, which
    ``round`` breaks on the exact decimal value); those rare cases go through ``round``. ``k``
    orders and compares (``k < 2000`` <=> ``conf < 0.2``) exactly as the float does.
    """
    if rnd() >= chance:
        return b""
    n = len(entries)
    if most == 1:
        rnd()  # the count draw: always 1
        point = rnd() * n
        index = int(point)
        t = (point - index) * 10000.0
        k = int(t + 0.5)
        if not -0.4999 < t - k < 0.4999:
            k = k4(point - index)
        if k < 2000:
            return b""
        return b"[" + entries[index] + CONF[k] + b"]"
    picked: list[tuple[int, int]] = []
    seen: list[int] = []
    for _ in range(1 + int(rnd() * most)):
        point = rnd() * n
        index = int(point)
        t = (point - index) * 10000.0
        k = int(t + 0.5)
        if not -0.4999 < t - k < 0.4999:
            k = k4(point - index)
        if k < 2000 or index in seen:
            continue
        seen.append(index)
        picked.append((k, index))
    if not picked:
        return b""
    if len(picked) == 1:
        k, index = picked[0]
        return b"[" + entries[index] + CONF[k] + b"]"
    # Stable, like sort(key=-confidence): reverse=True keeps equal items in order.
    picked.sort(key=_first, reverse=True)
    return b"[" + b",".join([entries[i] + CONF[k] for k, i in picked]) + b"]"
