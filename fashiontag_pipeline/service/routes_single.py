"""Single-mode tagging (``POST /tagger/v2/tags``) and ``GET /openapi.json``."""

from __future__ import annotations

from aiohttp import web

from .analyzer import (
    CLOTHING_MASK,
    CODE_BAD_TYPE,
    CODE_NO_PREFIX,
    ImageRejected,
    decode_base64_image,
    failure_response,
)
from .bulk_validation import MAX_URL_LENGTH, SINGLE_STRING_FIELDS
from .context import STATE
from .errors import CODE_BAD_DETECTION, CODE_BAD_JSON, Reject, json_response
from .parsing import language, parse_detection, read_json

__all__ = ["handle_openapi", "handle_tag"]

#: Base64 text decoded on the loop below this length (~50 us); longer text in the pool.
_INLINE_BASE64_CHARS = 64 * 1024


async def handle_tag(request: web.Request) -> web.Response:
    """POST /tagger/v2/tags: tag one image now."""
    state = request.app[STATE]
    state.keys.identify(request, bulk=False)
    payload = await read_json(request)
    if not isinstance(payload, dict):
        raise Reject(400, CODE_BAD_JSON, "request body must be a JSON object")
    image = payload.get("image")
    if not isinstance(image, dict):
        raise Reject(400, CODE_BAD_JSON, "image is required and must be an object")
    kind = image.get("type")
    content = image.get("content")
    if kind not in ("url", "base64"):
        raise Reject(400, CODE_BAD_TYPE, f"image.type must be url or base64, got {kind!r}")
    if not isinstance(content, str) or not content:
        raise Reject(400, CODE_BAD_JSON, "image.content is required and must be a string")
    context = payload.get("context")
    if context is not None and not isinstance(context, dict):
        raise Reject(400, CODE_BAD_JSON, "context must be an object")
    for name in SINGLE_STRING_FIELDS:  # spec 2.2: strings (age too, in single mode)
        value = context.get(name) if context else None
        if value is not None and not isinstance(value, str):
            raise Reject(400, CODE_BAD_JSON, f"context.{name} must be a string")
    try:
        mask = parse_detection(context.get("detection") if context else None, "context.detection")
    except ValueError as err:
        raise Reject(400, CODE_BAD_DETECTION, str(err)) from None
    lang = language(request)
    analyzer = state.analyzer
    bucket = state.worker.bucket
    if bucket is not None:
        # Single-mode tagging counts against --rate like bulk images do.
        await bucket.acquire()
    try:
        if kind == "base64":
            try:
                if len(content) > _INLINE_BASE64_CHARS:
                    data = await state.decode.run_sync(decode_base64_image, content)
                else:
                    data = decode_base64_image(content)
            except ImageRejected as err:
                if err.code == CODE_NO_PREFIX:
                    raise Reject(400, err.code, err.message) from None
                raise
            # Never on the event loop: a 113 KB PNG can decode to 40 million pixels.
            analysis = await state.decode.analyze(analyzer, data)
        elif not content.startswith(("http://", "https://")) or len(content) > MAX_URL_LENGTH:
            raise ImageRejected(
                803, f"image.content must be an http(s) URL of at most {MAX_URL_LENGTH} characters"
            )
        elif state.config.fetch:
            analysis = await analyzer.from_url(content)
        else:
            analysis = analyzer.from_text(content)
    except ImageRejected as err:
        return json_response(failure_response(err.code, err.message))
    return web.Response(
        body=state.render_json(analysis, mask or CLOTHING_MASK, lang),
        content_type="application/json",
    )


async def handle_openapi(request: web.Request) -> web.Response:
    """GET /openapi.json."""
    from .openapi import openapi_document

    return web.Response(body=openapi_document(), content_type="application/json")
