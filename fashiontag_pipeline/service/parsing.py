"""Request reading shared by the routes: JSON body, detection lists, language, query integers."""

from __future__ import annotations

import re
from typing import Any

import anyio
import msgspec
from aiohttp import web

from .._models import LANGUAGES, Detection
from .analyzer import detection_mask
from .context import STATE
from .errors import CODE_BAD_JSON, CODE_INTERNAL, Dropped, Reject
from .taxonomy import parse_accept_language

__all__ = ["language", "parse_detection", "query_int", "read_json"]

_DETECTION_VALUES = {d.value: d for d in Detection}
_ALLOWED_DETECTION = ", ".join(d.value for d in Detection)

_decoder = msgspec.json.Decoder()
_QUERY_INT = re.compile(r"-?[0-9]{1,18}")
_CLOSE = {"Connection": "close"}


async def read_json(request: web.Request) -> Any:
    """The decoded JSON body: 413 past ``max_body_bytes`` (declared or chunked), 408 when it
    takes longer than ``body_timeout`` to arrive, 400 (824) when it is not JSON (or does not
    decode as its ``Content-Encoding``), 503 when the bodies being read at once would pass
    ``bodies_budget`` (memory stays bounded whatever the number of clients holding a large
    body open)."""
    state = request.app[STATE]
    config = state.config
    max_bytes = config.max_body_bytes
    too_large = Reject(413, 809, f"request body is larger than {max_bytes} bytes", headers=_CLOSE)
    length = request.content_length
    if length is not None and length > max_bytes:
        raise too_large
    taken = 0
    try:
        chunks: list[bytes] = []
        try:
            with anyio.fail_after(config.body_timeout):
                while chunk := await request.content.readany():
                    taken += len(chunk)
                    state.body_bytes += len(chunk)
                    if taken > max_bytes:
                        raise too_large
                    if state.body_bytes > config.bodies_budget:
                        raise Reject(
                            503,
                            CODE_INTERNAL,
                            "too many request bodies are being received at once; retry later",
                            headers={**_CLOSE, "Retry-After": "1"},
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise Reject(
                408,
                CODE_BAD_JSON,
                f"request body did not arrive within {config.body_timeout:g} s",
                headers=_CLOSE,
            ) from None
        except ConnectionResetError:
            # The client went away before its body was whole: nobody to answer.
            raise Dropped from None
        except web.RequestPayloadError:
            # aiohttp could not read the body (a Content-Encoding it does not match, a broken
            # chunked encoding): the caller's doing, not a 500.
            encoding = request.headers.get("Content-Encoding")
            raise Reject(
                400,
                CODE_BAD_JSON,
                f"request body does not decode as its Content-Encoding {encoding[:32]!r}"
                if encoding
                else "request body could not be read as sent",
                headers=_CLOSE,
            ) from None
        body = b"".join(chunks)
        del chunks
        if not body:
            raise Reject(400, CODE_BAD_JSON, "request body is empty (JSON expected)")
        try:
            return _decoder.decode(body)
        except msgspec.DecodeError as err:
            raise Reject(400, CODE_BAD_JSON, f"request body is not valid JSON: {err}") from None
        except RecursionError:
            # msgspec recurses per nesting level: a deep enough document exhausts the stack.
            raise Reject(400, CODE_BAD_JSON, "request body is nested too deeply") from None
        except (UnicodeDecodeError, ValueError):
            raise Reject(400, CODE_BAD_JSON, "request body is not valid UTF-8 JSON") from None
    finally:
        state.body_bytes -= taken


def parse_detection(value: Any, where: str) -> int | None:
    """Mask of a detection list; None when absent or empty; ValueError names a bad value."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{where} must be an array of strings")
    mask = 0
    for item in value:
        detection = _DETECTION_VALUES.get(item) if isinstance(item, str) else None
        if detection is None:
            raise ValueError(
                f"{where} has an invalid value {item!r} (allowed: {_ALLOWED_DETECTION})"
            )
        mask |= detection_mask([detection], 0)
    return mask or None


def language(request: web.Request) -> int:
    return LANGUAGES.index(parse_accept_language(request.headers.get("accept-language")))


def query_int(request: web.Request, name: str, default: int) -> int:
    """The query parameter ``name`` as a plain decimal integer (``-?[0-9]{1,18}``: no sign
    ``+``, spaces or ``_`` as Python's ``int`` would take); ``default`` when absent or empty;
    400 when given more than once (``?offset=1&offset=2``: which one was meant?)."""
    given = request.query.getall(name, [])
    if len(given) > 1:
        raise Reject(400, CODE_BAD_JSON, f"{name} is given more than once")
    raw = given[0] if given else None
    if raw is None or raw == "":
        return default
    if _QUERY_INT.fullmatch(raw) is None:
        raise Reject(400, CODE_BAD_JSON, f"{name} must be a decimal integer, got {raw[:32]!r}")
    return int(raw)
