"""Bodies beside :class:`~fashiontag_pipeline._client.TaggerClient`: the bulk write it sends,
and the single-mode answer it hands on as the service sent it.

:func:`bulk_body` checks a create's or append's requests (count, description) and encodes
them. :func:`tagging_result` takes a single-mode answer that is a tagging result in the shape
bulk results are taken in (a JSON object whose ``status``, if it has one, is text), so a
shape the typed model does not take (a word for ``error.code``, a field of its own) is
written on unchanged, on one line, and a lone surrogate escape is mended; a failure whose
``error`` is text (the bulk paths' error body) is a refusal of the request, no result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import msgspec

from ._models import (
    MAX_DESCRIPTION_LENGTH,
    MAX_REQUESTS_PER_WRITE,
    BulkTaskRequest,
    Detection,
    EncodedRequests,
    TaggingRequest,
    says_success,
)
from ._responses import REFUSING_CODES
from ._surrogates import mend

__all__ = ["Refusal", "bulk_body", "tagging_result"]

_encoder = msgspec.json.Encoder()


class _ResultShape(msgspec.Struct, gc=False):
    """A tagging result read for its shape only (its other fields skipped, yet read as JSON)."""

    status: str = ""
    error: Any = None


class Refusal(ValueError):
    """A single-mode answer that is the bulk paths' error body, ``{"status": "failure",
    "error": "<message>"}`` (DESIGN's single error body has an ``error`` object), or the
    single one with a code of :data:`REFUSING_CODES` (``code``): the request refused (a
    gateway's quota, a rate limit worded so, a key refused), no outcome of the image."""

    def __init__(self, status: str, error: str, code: int | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.code = code


def _refusing_code(error: Any) -> int | None:
    """The code of a single failure body's ``error`` object when it refuses the request."""
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    return code if type(code) is int and code in REFUSING_CODES else None


_shape_decoder = msgspec.json.Decoder(_ResultShape)


def tagging_result(body: bytes) -> bytes:
    """``body`` on one line when it is a tagging result (mended when it holds a lone surrogate
    escape); ValueError saying why when it is not, :class:`Refusal` when it refuses the
    request."""
    try:
        shape = _shape_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
        mended = mend(body)
        if mended is None:
            raise ValueError(str(err)) from None
        return tagging_result(mended)
    if isinstance(shape.error, str) and not says_success(shape.status):
        raise Refusal(shape.status, shape.error)
    code = _refusing_code(shape.error) if shape.error is not None else None
    if code is not None and not says_success(shape.status):
        raise Refusal(shape.status, str(shape.error.get("message") or ""), code)
    # JSON text holds a line break only as whitespace between its tokens.
    if b"\n" in body or b"\r" in body:
        return body.replace(b"\r", b" ").replace(b"\n", b" ")
    return body


def bulk_body(
    requests: Sequence[TaggingRequest] | EncodedRequests,
    description: str | None,
    album_name: str | None,
    default_detection: Sequence[Detection] | None,
    strict: bool,
) -> bytes:
    """The JSON body of a create (or an append: no description nor album name)."""
    count = requests.size if isinstance(requests, EncodedRequests) else len(requests)
    if not count:
        raise ValueError("a bulk write needs at least one tagging request")
    if count > MAX_REQUESTS_PER_WRITE:
        raise ValueError(
            f"a bulk write takes at most {MAX_REQUESTS_PER_WRITE} requests, got {count}"
        )
    if description is not None and len(description) > MAX_DESCRIPTION_LENGTH:
        raise ValueError(f"description is longer than {MAX_DESCRIPTION_LENGTH} characters")
    return _encoder.encode(
        BulkTaskRequest(
            # Encoded requests are spliced in as they are (msgspec writes a Raw verbatim).
            tagging_request=cast(
                list[TaggingRequest],
                requests.raw if isinstance(requests, EncodedRequests) else list(requests),
            ),
            album_name=album_name,
            option=["STRICT"] if strict else None,
            default_detection=list(default_detection) if default_detection else None,
            description=description,
        )
    )
