"""A strict front for the reference service: every request the engine sends is checked against
the spec (sections 2.1, 2.2, 4.1-4.6, 8) as a service that takes nothing beyond it would check
it, then forwarded unchanged. The violations are recorded (a test asserts none); with
``refuse``, a request with one is answered 400 as such a service answers it (the single
endpoint's 801 for an image it cannot read as the spec's base64, else the whole request)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

BULK = "/tagger/v2.12/bulk"
SINGLE = "/tagger/v2/tags"
DETECTIONS = {
    "TOP",
    "BOTTOM",
    "WHOLEBODY",
    "SWIMWEAR",
    "SHOES",
    "BAG",
    "HAT",
    "JEWELRY",
    "ACCESSORY",
}
LANGUAGES = {"en", "ko", "zh", "ja"}
_TEXT_FIELDS = ("gender", "brand", "currency", "price", "keywords", "productContentName", "season")
_CONTEXT_KEYS = {"id", "detection", "age", *_TEXT_FIELDS}
_BULK_KEYS = {"albumName", "option", "defaultDetection", "description", "taggingRequest"}
_DATA = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,[A-Za-z0-9+/]+=*")
_LONE = re.compile(r"[\ud800-\udfff]")


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value (keys too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


def _detection(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        return [f"{where} is not a non-empty array: {value!r}"]
    bad = [v for v in value if v not in DETECTIONS]
    out = [f"{where} holds {v!r}" for v in bad]
    if len(set(map(str, value))) != len(value):
        out.append(f"{where} repeats a value: {value!r}")
    return out


def _context(context: Any, bulk: bool) -> list[str]:
    if not isinstance(context, dict):
        return [f"context is not an object: {context!r}"[:200]]
    out = [f"context has unknown key {k!r}" for k in context if k not in _CONTEXT_KEYS]
    ident = context.get("id")
    if bulk and (not isinstance(ident, str) or not ident):
        out.append(f"context.id is not a non-empty string: {ident!r}")
    if not bulk and "id" in context and not isinstance(ident, str):
        out.append(f"context.id is not a string: {ident!r}")
    for name in _TEXT_FIELDS:
        if name in context and not isinstance(context[name], str):
            out.append(f"context.{name} is not a string: {context[name]!r}")
    if "age" in context:
        age = context["age"]
        if bulk and not (isinstance(age, list) and all(isinstance(a, str) for a in age)):
            out.append(f"context.age is not an array of strings: {age!r}")
        if not bulk and not isinstance(age, str):
            out.append(f"context.age is not a string: {age!r}")
    if "detection" in context:
        out += _detection(context["detection"], "context.detection")
    return out


def _image(image: Any, bulk: bool) -> list[str]:
    if not isinstance(image, dict) or set(image) != {"type", "content"}:
        return [f"image is not {{type, content}}: {image!r}"[:200]]
    kind, content = image["type"], image["content"]
    if not isinstance(content, str):
        return ["image.content is not a string"]
    if kind == "url" and not content.startswith(("http://", "https://")):
        return [f"image.content is not an http(s) URL: {content[:80]!r}"]
    if kind == "base64" and not bulk and _DATA.fullmatch(content) is None:
        return [f"image.content is no data:image/<ext>;base64, URI: {content[:80]!r}"]
    if kind != "url" and (bulk or kind != "base64"):
        return [f"image.type {kind!r}"]
    return []


def check(method: str, path: str, query: dict[str, str], headers: Any, raw: bytes) -> list[str]:
    """The spec violations of one request."""
    out: list[str] = []
    if not headers.get("x-api-key"):
        out.append("no x-api-key")
    language = headers.get("accept-language")
    if language is not None and language not in LANGUAGES:
        out.append(f"accept-language {language!r}")
    if method == "GET":
        if path.startswith(BULK + "/") and not path.endswith("/status") and query:
            try:
                offset, size = int(query["offset"]), int(query["size"])
            except (KeyError, ValueError):
                return [*out, f"results query {query!r}"]
            if offset < 0 or not 1 <= size <= 100:
                out.append(f"results query {query!r}")
        return out
    if headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
        out.append(f"Content-Type {headers.get('Content-Type')!r}")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        return [*out, f"body is not JSON in UTF-8: {err}"]
    if any(_LONE.search(s) for s in _strings(body)):
        out.append("body holds a lone surrogate")
    if not isinstance(body, dict):
        return [*out, "body is not an object"]
    if path == SINGLE:
        out += [f"single body has unknown key {k!r}" for k in body if k not in ("image", "context")]
        out += _image(body.get("image"), bulk=False)
        if "context" in body:
            out += _context(body["context"], bulk=False)
        return out
    out += [f"bulk body has unknown key {k!r}" for k in body if k not in _BULK_KEYS]
    requests = body.get("taggingRequest")
    if not isinstance(requests, list) or not 1 <= len(requests) <= 1000:
        return [*out, "taggingRequest is not an array of 1 to 1,000"]
    description = body.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > 1024):
        out.append(f"description {description!r}"[:200])
    if "albumName" in body and not isinstance(body["albumName"], str):
        out.append(f"albumName {body['albumName']!r}")
    if "option" in body and body["option"] != ["STRICT"]:
        out.append(f"option {body['option']!r}")
    if "defaultDetection" in body:
        out += _detection(body["defaultDetection"], "defaultDetection")
    ids: set[str] = set()
    for element in requests:
        if not isinstance(element, dict) or set(element) != {"image", "context"}:
            out.append(f"tagging request is not {{image, context}}: {element!r}"[:200])
            continue
        out += _image(element["image"], bulk=True)
        out += _context(element["context"], bulk=True)
        ident = element["context"].get("id") if isinstance(element["context"], dict) else None
        if isinstance(ident, str):
            if ident in ids:
                out.append(f"context.id {ident!r} twice in one write")
            ids.add(ident)
    return out


class StrictFront:
    """The checking proxy; ``violations`` holds (method, path, violation) of every request."""

    def __init__(self, upstream: str, *, refuse: bool = False) -> None:
        self.upstream = upstream
        self.refuse = refuse
        self.url = ""
        self.violations: list[tuple[str, str, str]] = []
        self.bodies: list[tuple[str, str, Any]] = []
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read()
        found = check(request.method, request.path, dict(request.query), request.headers, raw)
        self.violations += [(request.method, request.path, v) for v in found]
        if raw:
            with contextlib.suppress(ValueError):
                self.bodies.append((request.method, request.path, json.loads(raw)))
        if found and self.refuse:
            if request.path == SINGLE:
                error = {"code": 801, "message": "base64 content must begin with its prefix"}
                return web.json_response({"status": "failure", "error": error}, status=400)
            return web.json_response({"status": "failure", "error": found[0]}, status=400)
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("x-api-key", "content-type", "accept-language")
        }
        async with self._session.request(
            request.method,
            self.upstream + request.path,
            params=dict(request.query),
            data=raw or None,
            headers=headers,
        ) as answer:
            payload = await answer.read()
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() in ("content-type", "retry-after")
            }
            return web.Response(status=answer.status, body=payload, headers=kept)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[StrictFront]:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            yield self
        finally:
            await self._session.close()
            await runner.cleanup()
