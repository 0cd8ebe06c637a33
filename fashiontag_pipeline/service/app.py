"""The reference tagging service on aiohttp.web: every endpoint of spec section 4.

Routes::

    POST /tagger/v2/tags                      single-mode tagging            200
    POST /tagger/v2.12/bulk                   create a task                  202
    GET  /tagger/v2.12/bulk                   list the key's tasks           200
    PUT  /tagger/v2.12/bulk/{task}            append to a task               202
    GET  /tagger/v2.12/bulk/{task}/status     one task's status              200
    GET  /tagger/v2.12/bulk/{task}            one page of results            200
    GET  /openapi.json                        this interface, described

Status codes and error bodies follow DESIGN section 3. Middlewares, outermost first: request
log + error mapping (every failure becomes the JSON error shape of its path, nothing crashes a
handler), then fault injection (``--faults``).

Start it with :func:`running_service` (async context manager), :func:`run_service` (for
``tg.start``), or ``fashiontag serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
from aiohttp import web

from .._config import DEV_API_KEY, DEV_BULK_API_KEY
from .._models import (
    LANGUAGES,
    MAX_DESCRIPTION_LENGTH,
    MAX_PAGE_SIZE,
    MAX_REQUESTS_PER_WRITE,
    STATUS_FAILURE,
    STATUS_SUCCESS,
    Detection,
)
from .analyzer import (
    CLOTHING_MASK,
    CODE_BAD_TYPE,
    CODE_NO_PREFIX,
    Analysis,
    Analyzer,
    ImageRejected,
    ReferenceAnalyzer,
    decode_base64_image,
    detection_mask,
    failure_response,
)
from .faults import Fault, FaultDice, FaultSpec
from .store import OUTCOME_DONE, TaskRecord, TaskStore, iso
from .taxonomy import parse_accept_language
from .worker import TaggingWorker

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "RunningService",
    "ServiceConfig",
    "create_app",
    "run_service",
    "running_service",
]

logger = logging.getLogger("fashiontag_pipeline.service")

SINGLE_PATH = "/tagger/v2/tags"
BULK_PATH = "/tagger/v2.12/bulk"
DEFAULT_TASK_TTL = 600.0
DEFAULT_RESULT_TTL = 7 * 86400.0
#: 1,000 requests with 8 KB URLs and full contexts fit with room to spare; so does a 10 MB
#: base64 single-mode image.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_ID_LENGTH = 1024
MAX_URL_LENGTH = 8192
MAX_ALBUM_NAME_LENGTH = 256

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

_STRING_CONTEXT_FIELDS = (
    "gender",
    "brand",
    "currency",
    "price",
    "keywords",
    "productContentName",
    "season",
)
_DETECTION_VALUES = {d.value: d for d in Detection}
_ALLOWED_DETECTION = ", ".join(d.value for d in Detection)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Everything the reference service needs. Keys never show in the repr.

    When both key tuples are empty, the development keys of :mod:`.._config` are accepted.
    """

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    bulk_api_keys: tuple[str, ...] = field(default=(), repr=False)
    task_ttl: float = DEFAULT_TASK_TTL
    result_ttl: float = DEFAULT_RESULT_TTL
    rate: float = 0.0
    fetch: bool = False
    faults: FaultSpec | None = None
    state_path: Path | None = None
    clock: Callable[[], float] | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    fetch_concurrency: int = 32
    analyzer: Analyzer | None = None

    def __post_init__(self) -> None:
        if self.task_ttl <= 0 or self.result_ttl <= 0:
            raise ValueError("task_ttl and result_ttl must be positive")
        if self.rate < 0:
            raise ValueError("rate must not be negative")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")

    @property
    def uses_dev_keys(self) -> bool:
        return not self.api_keys and not self.bulk_api_keys


class _Reject(Exception):
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


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=_encoder.encode(payload),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error_response(path: str, reject: _Reject) -> web.Response:
    """The error body of DESIGN section 3 for the path's family."""
    if path.startswith(BULK_PATH):
        body: dict[str, Any] = {"status": STATUS_FAILURE, "error": reject.message}
        if reject.failure_list is not None:
            body["failureList"] = reject.failure_list
    else:
        body = {"status": STATUS_FAILURE, "error": {"code": reject.code, "message": reject.message}}
    return _json(body, reject.status, reject.headers)


def _fingerprint(key: bytes) -> bytes:
    return hashlib.sha256(b"fashiontag-owner:" + key).digest()[:16]


class _KeyRing:
    """Accepted keys. Comparison is constant-time and visits every key."""

    def __init__(self, single: tuple[str, ...], bulk: tuple[str, ...]) -> None:
        if not single and not bulk:
            single, bulk = (DEV_API_KEY,), (DEV_BULK_API_KEY,)
        self._keys = [(k.encode(), False) for k in single] + [(k.encode(), True) for k in bulk]

    def identify(self, request: web.Request, *, bulk: bool) -> bytes:
        """The owner fingerprint of the request's key; :class:`_Reject` 401/403 otherwise."""
        given = request.headers.get("x-api-key")
        if not given:
            raise _Reject(401, CODE_KEY_REQUIRED, "API key required (header x-api-key)")
        raw = given.encode("utf-8", "surrogateescape")
        matched = False
        is_bulk = False
        for key, key_is_bulk in self._keys:
            if hmac.compare_digest(raw, key):
                matched = True
                is_bulk = is_bulk or key_is_bulk
        if not matched:
            raise _Reject(401, CODE_AUTH_FAILED, "authentication failed")
        if bulk and not is_bulk:
            raise _Reject(403, CODE_AUTH_FAILED, "this API key is not a bulk key")
        return _fingerprint(raw)


@dataclass(slots=True)
class _Parsed:
    requests: list[Any]
    album_name: str | None
    description: str | None
    strict: bool
    default_detection: int | None


@dataclass(slots=True)
class _Accepted:
    ids: list[str] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


class ServiceState:
    """What the handlers share: config, keys, store, analyzer, worker, fault dice."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.clock: Callable[[], float] = config.clock or time.time
        self.keys = _KeyRing(config.api_keys, config.bulk_api_keys)
        self.store = TaskStore(
            clock=self.clock,
            task_ttl=config.task_ttl,
            result_ttl=config.result_ttl,
            state_path=config.state_path,
        )
        self.analyzer: Analyzer = config.analyzer or ReferenceAnalyzer()
        self.worker = TaggingWorker(
            self.store,
            self.analyzer,
            rate=config.rate,
            fetch_concurrency=config.fetch_concurrency,
        )
        self.dice: FaultDice | None = (
            config.faults.dice() if config.faults is not None and config.faults.active else None
        )
        self.inline = config.rate <= 0 and not config.fetch
        self.render_json = _json_renderer(self.analyzer)


def _json_renderer(analyzer: Analyzer) -> Callable[[Analysis, int, int], bytes]:
    """The analyzer's ``render_json`` when it has one, else its ``render`` encoded."""
    fast: Callable[[Analysis, int, int], bytes] | None = getattr(analyzer, "render_json", None)
    if fast is not None:
        return fast
    render = analyzer.render

    def encoded(analysis: Analysis, detection: int, lang: int) -> bytes:
        return _encoder.encode(render(analysis, detection, lang))

    return encoded


STATE: web.AppKey[ServiceState] = web.AppKey("fashiontag_state", ServiceState)


# --------------------------------------------------------------------------- middlewares


@web.middleware
async def _log_and_map_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    started = time.perf_counter()
    status = 0
    try:
        response = await handler(request)
        status = response.status
        return response
    except _Reject as reject:
        status = reject.status
        return _error_response(request.path, reject)
    except web.HTTPRequestEntityTooLarge:
        status = 413
        return _error_response(request.path, _Reject(413, 809, "request body is too large"))
    except web.HTTPException as http_exc:
        status = http_exc.status
        if http_exc.status in (404, 405):
            return _error_response(
                request.path,
                _Reject(
                    http_exc.status,
                    CODE_BAD_ROUTE,
                    f"invalid URI or method: {request.method} {request.path}",
                ),
            )
        raise
    except _Dropped:
        # The transport is already aborted: aiohttp drops this response quietly.
        status = -1
        return web.Response(status=500)
    except asyncio.CancelledError:
        status = -1
        raise
    except Exception:
        status = 500
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(request.path, _Reject(500, CODE_INTERNAL, "internal error"))
    finally:
        if logger.isEnabledFor(logging.DEBUG):
            # Never headers: they hold the API key.
            logger.debug(
                "%s %s -> %s in %.1f ms",
                request.method,
                request.path,
                status if status >= 0 else "dropped",
                (time.perf_counter() - started) * 1000,
            )


class _Dropped(Exception):
    """The connection was closed on purpose (fault injection)."""


def _drop_connection(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise _Dropped


def _fault_middleware(dice: FaultDice) -> Any:
    spec = dice.spec

    @web.middleware
    async def inject_faults(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not request.path.startswith("/tagger/"):
            return await handler(request)
        delay = dice.latency()
        if delay:
            await anyio.sleep(delay)
        fault, code = dice.roll(is_write=request.method in ("POST", "PUT"))
        if fault is Fault.NONE:
            return await handler(request)
        if fault is Fault.ERROR:
            raise _Reject(code, CODE_INTERNAL, f"injected fault: HTTP {code}")
        if fault is Fault.RATE_LIMITED:
            raise _Reject(
                429,
                CODE_QUOTA,
                "rate limited, retry later",
                headers={"Retry-After": f"{spec.retry_after:g}"},
            )
        if fault is Fault.DROP:
            _drop_connection(request)
        # Ambiguous: the write is applied in full, then the answer is lost.
        await handler(request)
        return _drop_connection(request)

    return inject_faults


# --------------------------------------------------------------------------- helpers


async def _read_json(request: web.Request) -> Any:
    length = request.content_length
    max_bytes = request.app[STATE].config.max_body_bytes
    if length is not None and length > max_bytes:
        raise _Reject(413, 809, f"request body is larger than {max_bytes} bytes")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _Reject(413, 809, f"request body is larger than {max_bytes} bytes") from None
    if not body:
        raise _Reject(400, CODE_BAD_JSON, "request body is empty (JSON expected)")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as err:
        raise _Reject(400, CODE_BAD_JSON, f"request body is not valid JSON: {err}") from None


def _parse_detection(value: Any, where: str) -> int | None:
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


def _language(request: web.Request) -> int:
    return LANGUAGES.index(parse_accept_language(request.headers.get("accept-language")))


def _task_body(task: TaskRecord) -> dict[str, Any]:
    total, done, processing, failure = task.counts()
    return {
        "taskId": task.task_id,
        "count": {"total": total, "done": done, "processing": processing, "failure": failure},
        "description": task.description,
        "taskStatus": task.status.value,
        "taskExpireAt": iso(task.expire_at),
        "resultExpiredAt": iso(task.result_expire_at),
        "createDate": iso(task.created),
        "albumName": task.album_name,
    }


def _parse_bulk(payload: Any) -> _Parsed:
    if not isinstance(payload, dict):
        raise _Reject(400, CODE_BAD_JSON, "request body must be a JSON object")
    requests = payload.get("taggingRequest")
    if not isinstance(requests, list):
        raise _Reject(400, CODE_BAD_JSON, "taggingRequest is required and must be an array")
    if not 1 <= len(requests) <= MAX_REQUESTS_PER_WRITE:
        raise _Reject(
            400,
            CODE_BAD_JSON,
            f"taggingRequest must have 1 to {MAX_REQUESTS_PER_WRITE} elements, got {len(requests)}",
        )
    description = payload.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _Reject(400, CODE_BAD_JSON, "description must be a string")
        if len(description) > MAX_DESCRIPTION_LENGTH:
            raise _Reject(
                400,
                CODE_BAD_JSON,
                f"description is longer than {MAX_DESCRIPTION_LENGTH} characters",
            )
    album_name = payload.get("albumName")
    if album_name is not None and (
        not isinstance(album_name, str) or len(album_name) > MAX_ALBUM_NAME_LENGTH
    ):
        raise _Reject(
            400, CODE_BAD_JSON, f"albumName must be a string of at most {MAX_ALBUM_NAME_LENGTH}"
        )
    option = payload.get("option")
    strict = False
    if option is not None:
        if not isinstance(option, list) or not all(isinstance(o, str) for o in option):
            raise _Reject(400, CODE_BAD_JSON, "option must be an array of strings")
        unknown = [o for o in option if o != "STRICT"]
        if unknown:
            raise _Reject(400, CODE_BAD_JSON, f"unsupported option {unknown[0]!r} (only STRICT)")
        strict = "STRICT" in option
    try:
        default_detection = _parse_detection(payload.get("defaultDetection"), "defaultDetection")
    except ValueError as err:
        raise _Reject(400, CODE_BAD_DETECTION, str(err)) from None
    return _Parsed(requests, album_name, description, strict, default_detection)


def _element_error(element: Any, default_mask: int) -> tuple[str | None, str, int, str]:
    """(id, url, mask, error message or "") of one bulk element."""
    if not isinstance(element, dict):
        return None, "", 0, "tagging request must be an object"
    image = element.get("image")
    context = element.get("context")
    image_id = context.get("id") if isinstance(context, dict) else None
    if not isinstance(image, dict):
        return None, "", 0, "image is required and must be an object"
    if image.get("type") != "url":
        return None, "", 0, f"image.type must be url in bulk mode, got {image.get('type')!r}"
    url = image.get("content")
    if not isinstance(url, str) or not url:
        return None, "", 0, "image.content is required and must be a URL string"
    if not url.startswith(("http://", "https://")) or len(url) > MAX_URL_LENGTH:
        return None, "", 0, "image.content must be an http(s) URL of at most 8192 characters"
    if not isinstance(context, dict):
        return None, "", 0, "context is required in bulk mode and must be an object"
    if not isinstance(image_id, str) or not image_id:
        return None, "", 0, "context.id is required and must be a non-empty string"
    if len(image_id) > MAX_ID_LENGTH:
        return None, "", 0, f"context.id is longer than {MAX_ID_LENGTH} characters"
    try:
        mask = _parse_detection(context.get("detection"), "context.detection")
    except ValueError as err:
        return image_id, url, 0, str(err)
    for name in _STRING_CONTEXT_FIELDS:
        value = context.get(name)
        if value is not None and not isinstance(value, str):
            return image_id, url, 0, f"context.{name} must be a string"
    age = context.get("age")
    if age is not None and (not isinstance(age, list) or not all(isinstance(a, str) for a in age)):
        return image_id, url, 0, "context.age must be an array of strings in bulk mode"
    return image_id, url, mask if mask is not None else default_mask, ""


def _echo(element: Any) -> dict[str, Any]:
    if isinstance(element, dict):
        return {k: element[k] for k in ("image", "context") if k in element}
    return {}


def _validate(
    state: ServiceState, task: TaskRecord | None, parsed: _Parsed, task_default: int
) -> _Accepted:
    out = _Accepted()
    default_mask = parsed.default_detection or task_default
    seen: set[str] = set()
    analyzer = state.analyzer
    for element in parsed.requests:
        image_id, url, mask, error = _element_error(element, default_mask)
        if (
            not error
            and image_id is not None
            and (image_id in seen or (task is not None and state.store.has_id(task, image_id)))
        ):
            error = f"duplicate context.id {image_id!r}: ids must be unique within a task"
        if error:
            out.failures.append({"request": _echo(element), "errorMessage": error})
            continue
        assert image_id is not None
        seen.add(image_id)
        out.ids.append(image_id)
        out.hashes.append(analyzer.from_text(url).content_hash)
        out.masks.append(mask)
        out.urls.append(url)
    return out


def _write_response(task: TaskRecord, accepted: _Accepted) -> web.Response:
    return _json(
        {
            "taskId": task.task_id,
            "albumName": task.album_name,
            "taskExpiredAt": iso(task.expire_at),
            "validation": {"accept": len(accepted.ids), "failure": len(accepted.failures)},
            "failureList": accepted.failures,
        },
        202,
    )


def _accept(state: ServiceState, task: TaskRecord, accepted: _Accepted, *, extend: bool) -> None:
    state.store.accept(
        task,
        accepted.ids,
        accepted.hashes,
        accepted.masks,
        urls=accepted.urls if state.config.fetch else None,
        processed=state.inline,
        extend=extend and bool(accepted.ids),
    )


# --------------------------------------------------------------------------- handlers


async def handle_tag(request: web.Request) -> web.Response:
    """POST /tagger/v2/tags: tag one image now."""
    state = request.app[STATE]
    state.keys.identify(request, bulk=False)
    payload = await _read_json(request)
    if not isinstance(payload, dict):
        raise _Reject(400, CODE_BAD_JSON, "request body must be a JSON object")
    image = payload.get("image")
    if not isinstance(image, dict):
        raise _Reject(400, CODE_BAD_JSON, "image is required and must be an object")
    kind = image.get("type")
    content = image.get("content")
    if kind not in ("url", "base64"):
        raise _Reject(400, CODE_BAD_TYPE, f"image.type must be url or base64, got {kind!r}")
    if not isinstance(content, str) or not content:
        raise _Reject(400, CODE_BAD_JSON, "image.content is required and must be a string")
    context = payload.get("context")
    if context is not None and not isinstance(context, dict):
        raise _Reject(400, CODE_BAD_JSON, "context must be an object")
    try:
        mask = _parse_detection(context.get("detection") if context else None, "context.detection")
    except ValueError as err:
        raise _Reject(400, CODE_BAD_DETECTION, str(err)) from None
    lang = _language(request)
    analyzer = state.analyzer
    bucket = state.worker.bucket
    if bucket is not None:
        # Single-mode tagging counts against --rate like bulk images do.
        await bucket.acquire()
    try:
        if kind == "base64":
            try:
                data = decode_base64_image(content)
            except ImageRejected as err:
                if err.code == CODE_NO_PREFIX:
                    raise _Reject(400, err.code, err.message) from None
                raise
            if len(data) > 256 * 1024:
                analysis = await anyio.to_thread.run_sync(analyzer.from_bytes, data)
            else:
                analysis = analyzer.from_bytes(data)
        elif not content.startswith(("http://", "https://")):
            raise ImageRejected(803, "image.content must be an http(s) URL")
        elif state.config.fetch:
            analysis = await analyzer.from_url(content)
        else:
            analysis = analyzer.from_text(content)
    except ImageRejected as err:
        return _json(failure_response(err.code, err.message))
    return web.Response(
        body=state.render_json(analysis, mask or CLOTHING_MASK, lang),
        content_type="application/json",
    )


async def handle_create(request: web.Request) -> web.Response:
    """POST /tagger/v2.12/bulk: create a task."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    parsed = _parse_bulk(await _read_json(request))
    accepted = _validate(state, None, parsed, CLOTHING_MASK)
    if parsed.strict and accepted.failures:
        raise _Reject(
            400,
            CODE_BAD_JSON,
            f"STRICT: {len(accepted.failures)} tagging request(s) failed validation",
            failure_list=accepted.failures,
        )
    task_id = secrets.token_hex(12)
    task = state.store.create_task(
        task_id=task_id,
        owner=owner,
        album_name=parsed.album_name or f"album-{task_id[:12]}",
        description=parsed.description,
        default_detection=parsed.default_detection or CLOTHING_MASK,
    )
    _accept(state, task, accepted, extend=False)
    return _write_response(task, accepted)


def _lookup(request: web.Request, state: ServiceState, owner: bytes) -> TaskRecord:
    task_id = request.match_info["task_id"]
    task = state.store.get(task_id, owner)
    if task is None:
        raise _Reject(404, CODE_BAD_ROUTE, f"task {task_id} not found")
    return task


async def handle_append(request: web.Request) -> web.Response:
    """PUT /tagger/v2.12/bulk/{task}: append images to a live task."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    if state.clock() >= task.expire_at:
        raise _Reject(410, CODE_BAD_ROUTE, f"task {task.task_id} expired at {iso(task.expire_at)}")
    parsed = _parse_bulk(await _read_json(request))
    accepted = _validate(state, task, parsed, task.default_detection)
    if parsed.strict and accepted.failures:
        raise _Reject(
            400,
            CODE_BAD_JSON,
            f"STRICT: {len(accepted.failures)} tagging request(s) failed validation",
            failure_list=accepted.failures,
        )
    # Time may have passed while the body was read and checked.
    if state.clock() >= task.expire_at:
        raise _Reject(410, CODE_BAD_ROUTE, f"task {task.task_id} expired at {iso(task.expire_at)}")
    _accept(state, task, accepted, extend=True)
    return _write_response(task, accepted)


async def handle_list(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk: every task of the key."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    tasks = [_task_body(t) for t in state.store.tasks_of(owner)]
    return _json({"status": STATUS_SUCCESS, "data": {"tasks": tasks}})


async def handle_status(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk/{task}/status."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    return _json({"status": STATUS_SUCCESS, "data": _task_body(task)})


def _query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise _Reject(400, CODE_BAD_JSON, f"{name} must be an integer, got {raw!r}") from None


async def handle_results(request: web.Request) -> web.Response:
    """GET /tagger/v2.12/bulk/{task}?offset=&size=: one page of a done task's results."""
    state = request.app[STATE]
    owner = state.keys.identify(request, bulk=True)
    task = _lookup(request, state, owner)
    offset = _query_int(request, "offset", 0)
    size = _query_int(request, "size", MAX_PAGE_SIZE)
    if offset < 0:
        raise _Reject(400, CODE_BAD_JSON, "offset must be >= 0")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise _Reject(400, CODE_BAD_JSON, f"size must be between 1 and {MAX_PAGE_SIZE}")
    if task.purged or (
        task.result_expire_at is not None and state.clock() >= task.result_expire_at
    ):
        raise _Reject(
            410,
            CODE_BAD_ROUTE,
            f"results of task {task.task_id} expired at {iso(task.result_expire_at)}",
        )
    if task.processed < task.total:
        raise _Reject(
            409,
            CODE_BAD_ROUTE,
            f"task {task.task_id} is still TASK_PROCESSING; results are readable once TASK_DONE",
        )
    lang = _language(request)
    end = min(offset + size, task.total)
    render = state.render_json
    encode_id = _encoder.encode
    ids, masks = task.ids, task.masks
    hashes, outcomes, measured = task.hashes, task.outcomes, task.measured
    parts = [
        b'{"status":"success","data":{"taskInfo":{"totalCount":%d,"offset":%d,"size":%d},'
        b'"results":[' % (task.total, offset, size)
    ]
    append = parts.append
    sep = b'{"id":'
    for index in range(offset, end):
        append(sep)
        append(encode_id(ids[index]))
        append(b',"taggingResult":')
        outcome = outcomes[index] if outcomes is not None else OUTCOME_DONE
        if outcome == OUTCOME_DONE:
            analysis = Analysis(hashes[index], measured[index] if measured is not None else None)
            append(render(analysis, masks[index], lang))
        else:
            append(_failure_json(outcome))
        sep = b'},{"id":'
    append(b"}]}}" if end > offset else b"]}}")
    return web.Response(body=b"".join(parts), content_type="application/json")


@functools.lru_cache(maxsize=64)
def _failure_json(outcome: int) -> bytes:
    return _encoder.encode(
        failure_response(outcome, FAILURE_MESSAGES.get(outcome, "tagging failed"))
    )


async def handle_openapi(request: web.Request) -> web.Response:
    """GET /openapi.json."""
    from .openapi import openapi_document

    return web.Response(body=openapi_document(), content_type="application/json")


# --------------------------------------------------------------------------- app and runners


async def _background(app: web.Application) -> AsyncIterator[None]:
    """Runs the tagging worker for the app's lifetime (aiohttp's cleanup_ctx idiom: the app
    may be run by aiohttp's own runners, where no anyio task group of ours exists)."""
    state = app[STATE]
    worker = asyncio.get_running_loop().create_task(state.worker.run())
    try:
        yield
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await state.analyzer.aclose()
        state.store.close()


def create_app(config: ServiceConfig) -> web.Application:
    """The aiohttp application of the reference service."""
    state = ServiceState(config)
    middlewares: list[Any] = [_log_and_map_errors]
    if state.dice is not None:
        middlewares.append(_fault_middleware(state.dice))
    app = web.Application(middlewares=middlewares, client_max_size=config.max_body_bytes)
    app[STATE] = state
    app.router.add_post(SINGLE_PATH, handle_tag)
    app.router.add_post(BULK_PATH, handle_create)
    app.router.add_get(BULK_PATH, handle_list)
    app.router.add_put(BULK_PATH + "/{task_id}", handle_append)
    app.router.add_get(BULK_PATH + "/{task_id}/status", handle_status)
    app.router.add_get(BULK_PATH + "/{task_id}", handle_results)
    app.router.add_get("/openapi.json", handle_openapi)
    app.cleanup_ctx.append(_background)
    return app


@dataclass(frozen=True)
class RunningService:
    """A started service: its base URL, the app, and the store (for tests)."""

    url: str
    app: web.Application
    host: str
    port: int

    @property
    def store(self) -> TaskStore:
        return self.app[STATE].store

    @property
    def state(self) -> ServiceState:
        return self.app[STATE]


@contextlib.asynccontextmanager
async def running_service(
    config: ServiceConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningService]:
    """Run the service on ``host:port`` (0 = a free port) for the ``async with`` body."""
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        actual = port
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                actual = int(address[1])
                break
        url_host = f"[{host}]" if ":" in host else host
        yield RunningService(url=f"http://{url_host}:{actual}", app=app, host=host, port=actual)
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def run_service(
    config: ServiceConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; reports the base URL through ``task_status`` (``tg.start``)."""
    async with running_service(config, host, port) as service:
        task_status.started(service.url)
        await anyio.sleep_forever()
