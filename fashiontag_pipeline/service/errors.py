"""Errors of the reference service: service codes, the refusal exception, error bodies (DESIGN
section 3)."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from .._models import STATUS_FAILURE

__all__ = [
    "BULK_PATH",
    "CODE_AUTH_FAILED",
    "CODE_BAD_DETECTION",
    "CODE_BAD_JSON",
    "CODE_BAD_ROUTE",
    "CODE_INTERNAL",
    "CODE_KEY_REQUIRED",
    "CODE_QUOTA",
    "FAILURE_MESSAGES",
    "SINGLE_PATH",
    "Dropped",
    "Reject",
    "error_response",
    "json_response",
]

_encoder = msgspec.json.Encoder()

SINGLE_PATH = "/tagger/v2/tags"
BULK_PATH = "/tagger/v2.12/bulk"

CODE_AUTH_FAILED = 609
CODE_KEY_REQUIRED = 612
CODE_BAD_ROUTE = 623
CODE_INTERNAL = 500
CODE_QUOTA = 823
CODE_BAD_JSON = 824
CODE_BAD_DETECTION = 825

#: Messages of the per-image failure codes kept in the store (only the code is stored).
FAILURE_MESSAGES = {
    802: "base64 image could not be decoded",
    803: "image URL could not be fetched",
    805: "image format not supported (BMP, GIF, JPEG, PNG, TIFF, WEBP are)",
    806: "unsupported aspect ratio",
    807: "image too small",
    808: "image too large (pixels)",
    809: "image file too large (bytes)",
    500: "internal error",
}


class Reject(Exception):
    """A request refused with a status, a service code and a message."""

    def __init__(
        self,
        status: int,
        code: int,
        message: str,
        *,
        failure_list: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.failure_list = failure_list
        self.headers = headers


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=_encoder.encode(payload),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(path: str, reject: Reject) -> web.Response:
    """The error body of DESIGN section 3 for the path's family."""
    if path.startswith(BULK_PATH):
        body: dict[str, Any] = {"status": STATUS_FAILURE, "error": reject.message}
        if reject.failure_list is not None:
            body["failureList"] = reject.failure_list
    else:
        body = {"status": STATUS_FAILURE, "error": {"code": reject.code, "message": reject.message}}
    return json_response(body, reject.status, reject.headers)


class Dropped(Exception):
    """The connection is gone: closed on purpose (fault injection), or by a client that went
    away in the middle of its request body. Nothing is answered, nothing logged past DEBUG."""
