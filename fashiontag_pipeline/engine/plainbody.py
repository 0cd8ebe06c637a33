"""Requests of rows of an id and a URL alone, kept as their URL until their chunk is encoded.

The validator's blocks of rows with an id and a URL alone (:mod:`.plainblock`: CSV ``id,url``
lines, JSONL ``{"id", "url"}`` objects, CSV columns no rule reads besides) give each row's
request as its URL, a ``str`` (an :data:`~.rules.Item` ``(id, position, url)``): the request
is ``{"image": {"type": "url", "content": url}, "context": {"id": id}}``, the id being the
item's own (the id sent). Building the three structs of such a request cost ~150 ns a row
and encoding them ~90; the chunk's JSON is built here around its ids and URLs instead
(:func:`encode_requests`, ~70 ns a row: as text when msgspec escapes none of them), as the
same bytes. Where a struct is needed, a
plain row's is built by :func:`request_of`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .._models import BulkContext, Image, ImageType, TaggingRequest

__all__ = ["encode_requests", "request_of"]

_encoder = msgspec.json.Encoder()
_URL = ImageType.URL

#: A plain request's JSON around its URL and id, as msgspec encodes the structs (field
#: order, no spaces, defaults omitted).
_HEAD = b'[{"image":{"type":"url","content":"'
_MID = b'"},"context":{"id":"'
_NEXT = b'"}},{"image":{"type":"url","content":"'
_TAIL = b'"}}]'
#: The same as text (:func:`_unescaped`).
_HEAD_TEXT = _HEAD.decode()
_MID_TEXT = _MID.decode()
_NEXT_TEXT = _NEXT.decode()
_TAIL_TEXT = _TAIL.decode()


def request_of(ident: str, request: TaggingRequest | str) -> TaggingRequest:
    """The request of an item (a plain row's built from its id and URL)."""
    if type(request) is str:
        return TaggingRequest(Image(_URL, request), BulkContext(ident))
    assert isinstance(request, TaggingRequest)
    return request


def _unescaped(ids: Sequence[str], urls: Sequence[str]) -> bytes:
    """The chunk's JSON built as text around its ids and URLs, then encoded as UTF-8 once:
    for ids and URLs msgspec writes unescaped (see :func:`encode_requests`). Each string's
    JSON is then its own UTF-8 bytes, so no string object a row is made (splitting their
    encoding at ``","`` made two bytes objects a row, ~150 ns of the ~240 this took)."""
    out = [_NEXT_TEXT, "", _MID_TEXT, ""] * len(urls)
    out[0] = _HEAD_TEXT
    out[1::4] = urls
    out[3::4] = ids
    out.append(_TAIL_TEXT)
    return "".join(out).encode("utf-8")


def _strings(encoded: bytes, count: int) -> list[bytes] | None:
    """The ``count`` strings of ``encoded`` (a list of strings msgspec encoded) each as
    msgspec encodes it, without its quotes; None when one holds a quote. msgspec writes every
    quote inside a string as ``\\"``, so with as many quotes in the encoded array as two a
    string, each ``","`` in it is a separator."""
    if encoded.count(b'"') != 2 * count:
        return None
    return encoded[2:-2].split(b'","')


def encode_requests(
    ids: Sequence[str], requests: Sequence[TaggingRequest | str], ids_json: bytes | None = None
) -> bytes:
    """The requests of a chunk (``ids[i]`` the id of ``requests[i]``) as a JSON array: the
    bytes msgspec gives for their structs. When every request is a plain row's URL, built
    around the ids and URLs: as text when msgspec escapes none of them (:func:`_unescaped`),
    else from each one's encoding by msgspec when none holds a quote; otherwise from the
    structs. ``ids_json``: the ids as msgspec encodes them, when the caller has it already
    (the chunk's ids stored beside its body: not encoded twice)."""
    kinds = set(map(type, requests))
    if str not in kinds:
        return _encoder.encode(requests)
    if len(kinds) == 1:
        # Each list encoded by msgspec (a lone surrogate raises here as the structs would).
        urls_json = _encoder.encode(requests)
        if ids_json is None:
            ids_json = _encoder.encode(ids)
        # Fast path: every escape msgspec writes starts with a backslash (a quote, a
        # backslash, a control character), so with none in either encoding (a memchr pass
        # each) every id and URL is written as its own UTF-8 bytes.
        if b"\\" not in urls_json and b"\\" not in ids_json:
            return _unescaped(ids, requests)  # type: ignore[arg-type]  # (every one a str)
        urls = _strings(urls_json, len(requests))
        idents = _strings(ids_json, len(ids)) if urls is not None else None
        if urls is not None and idents is not None:
            out = [_NEXT, b"", _MID, b""] * len(urls)
            out[0] = _HEAD
            out[1::4] = urls
            out[3::4] = idents
            out.append(_TAIL)
            return b"".join(out)
    return _encoder.encode(list(map(request_of, ids, requests)))
