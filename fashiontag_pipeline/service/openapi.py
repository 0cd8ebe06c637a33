"""OpenAPI 3.1 description of the reference service (served at ``/openapi.json``)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

__all__ = ["openapi_document"]


@functools.cache
def openapi_document() -> bytes:
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "fashiontag", "version": "2.12"},
        "paths": {},
    }
    return msgspec.json.encode(doc)
