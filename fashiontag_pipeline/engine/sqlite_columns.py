"""The columns ``--sink sqlite`` fills from a tagging result (status, category, item, its
confidence, error code), whatever its shape: the whole JSON is kept beside them."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from .._models import STATUS_SUCCESS, TaggingResponse, says_success
from .pages import result_status

__all__ = ["columns"]

#: Built on first use (only for ``--sink sqlite``): the decoder of a tagging answer's nested
#: types costs ~0.5 ms of every run's start-up.
_typed_decoder = functools.cache(lambda: msgspec.json.Decoder(TaggingResponse))

_NULL = msgspec.Raw(b"null")


class _Loose(msgspec.Struct, gc=False):
    """A tagging result read field by field (each kept as it came, read on its own)."""

    data: msgspec.Raw = _NULL
    error: msgspec.Raw = _NULL


class _LooseData(msgspec.Struct, gc=False):
    objects: msgspec.Raw = _NULL


class _LooseObject(msgspec.Struct, gc=False):
    tags: msgspec.Raw = _NULL


class _LooseTag(msgspec.Struct, gc=False):
    category: msgspec.Raw = _NULL
    item: msgspec.Raw = _NULL


class _Named(msgspec.Struct, gc=False):
    """A category, an item or an error: the fields the columns take."""

    name: msgspec.Raw = _NULL
    confidence: msgspec.Raw = _NULL
    code: msgspec.Raw = _NULL


_decoders = {
    kind: msgspec.json.Decoder(kind)
    for kind in (_Loose, _LooseData, _LooseObject, _LooseTag, _Named, str, float)
}
_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_code_decoder = msgspec.json.Decoder(int | str)


def _read(raw: msgspec.Raw, decoder: msgspec.json.Decoder[Any]) -> Any:
    """``raw`` decoded, or None when it is not of that type (or not UTF-8)."""
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (a ValidationError too)
        return None


def columns(raw: msgspec.Raw) -> tuple[Any, ...]:
    """(status, category, item, item_confidence, error_code) of a tagging result: the first
    tag of the first object that has one. A result the typed model does not take (a shape the
    spec leaves open: a failure whose code is a word, no status, ``null`` for an empty array,
    an id as a number) is read field by field: each column the JSON gives as its type is
    filled, the rest NULL (an empty status). Before, any such field left category and item
    NULL though the JSON named them."""
    # The status as the pages read it, which the summary counted (no status, or not a string:
    # "", the column takes no NULL): msgspec reads a repeated key's last value, and a result
    # it refuses (a number past a float's range in a field of its error) had no status.
    status = _word(result_status(raw))
    try:
        typed = _typed_decoder().decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (a ValidationError too; not UTF-8)
        return (status, *_loose_columns(raw))
    category = item = None
    confidence = None
    if typed.data is not None:
        for obj in typed.data.objects:
            if obj.tags:
                tag = obj.tags[0]
                category = tag.category.name if tag.category else None
                if tag.item is not None:
                    item, confidence = tag.item.name, tag.item.confidence
                break
    return (status, category, item, confidence, _code(typed.error.code if typed.error else None))


def _loose_columns(raw: msgspec.Raw) -> tuple[Any, ...]:
    """(category, item, item_confidence, error_code) of a result read field by field."""
    top = _read(raw, _decoders[_Loose])
    if top is None:
        return (None, None, None, None)
    error = _read(top.error, _decoders[_Named])
    code = _code(_read(error.code, _code_decoder)) if error is not None else None
    data = _read(top.data, _decoders[_LooseData])
    for obj in (_read(data.objects, _list_decoder) if data is not None else None) or ():
        found = _read(obj, _decoders[_LooseObject])
        tags = _read(found.tags, _list_decoder) if found is not None else None
        if tags:
            tag = _read(tags[0], _decoders[_LooseTag])
            if tag is None:
                break
            category = _read(tag.category, _decoders[_Named])
            item = _read(tag.item, _decoders[_Named])
            return (
                _read(category.name, _decoders[str]) if category is not None else None,
                _read(item.name, _decoders[str]) if item is not None else None,
                _read(item.confidence, _decoders[float]) if item is not None else None,
                code,
            )
    return (None, None, None, code)


#: The integers an SQLite INTEGER holds (a signed 64-bit one).
_INT64 = range(-(2**63), 2**63)


def _code(code: object) -> int | str | None:
    """The ``error_code`` column: an error's code when it is a word or an integer SQLite
    holds; NULL otherwise (a code past 64 bits, as a service that numbers its errors with a
    hash writes, raised OverflowError at the insert and stopped the run at every resume:
    ``result`` keeps it as it came)."""
    if isinstance(code, str) or (type(code) is int and code in _INT64):
        return code
    return None


def _word(status: str) -> str:
    """The ``status`` column: ``success`` for a success in any case (``SUCCESS``: counted
    tagged, as the summary counts it, so that ``WHERE status = 'success'`` agrees with it);
    any other word as the service wrote it (``result`` keeps the JSON as it came)."""
    return STATUS_SUCCESS if says_success(status) else status
