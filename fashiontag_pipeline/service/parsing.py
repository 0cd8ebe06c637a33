"""Request reading shared by the routes: JSON body, detection lists, language, query integers."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from .._models import LANGUAGES, Detection
from .analyzer import detection_mask
from .context import STATE
from .errors import CODE_BAD_JSON, Reject
from .taxonomy import parse_accept_language

__all__ = ["language", "parse_detection", "query_int", "read_json"]

_DETECTION_VALUES = {d.value: d for d in Detection}
_ALLOWED_DETECTION = ", ".join(d.value for d in Detection)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


async def read_json(request: web.Request) -> Any:
    length = request.content_length
    max_bytes = request.app[STATE].config.max_body_bytes
    if length is not None and length > max_bytes:
        raise Reject(413, 809, f"request body is larger than {max_bytes} bytes")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Reject(413, 809, f"request body is larger than {max_bytes} bytes") from None
    if not body:
        raise Reject(400, CODE_BAD_JSON, "request body is empty (JSON expected)")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as err:
        raise Reject(400, CODE_BAD_JSON, f"request body is not valid JSON: {err}") from None


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
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise Reject(400, CODE_BAD_JSON, f"{name} must be an integer, got {raw!r}") from None
