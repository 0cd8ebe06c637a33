"""Validation of bulk create/append bodies: whole-request limits, then each tagging request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._models import MAX_DESCRIPTION_LENGTH, MAX_REQUESTS_PER_WRITE
from .context import ServiceState
from .errors import CODE_BAD_DETECTION, CODE_BAD_JSON, Reject, json_response
from .parsing import parse_detection
from .store import TaskRecord, iso

__all__ = [
    "ECHO_MAX_CHARS",
    "MAX_ALBUM_NAME_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_URL_LENGTH",
    "SINGLE_STRING_FIELDS",
    "ParsedWrite",
    "Validated",
    "accept",
    "parse_bulk",
    "validate",
    "write_response",
]

MAX_ID_LENGTH = 1024
MAX_URL_LENGTH = 8192
MAX_ALBUM_NAME_LENGTH = 256
#: In ``failureList`` echoes: the longest string kept, and the most array items kept. Strings
#: are echoed whole up to the longest URL the service takes (a client may match failures by
#: URL or id); longer ones (a base64 image sent to bulk) are cut.
ECHO_MAX_CHARS = MAX_URL_LENGTH
ECHO_MAX_ITEMS = 16
_ECHO_CONTEXT_FIELDS = (
    "id",
    "detection",
    "gender",
    "brand",
    "currency",
    "price",
    "age",
    "keywords",
    "productContentName",
    "season",
)

_STRING_CONTEXT_FIELDS = (
    "gender",
    "brand",
    "currency",
    "price",
    "keywords",
    "productContentName",
    "season",
)
#: The context fields single mode takes as strings: those, its id and its age.
SINGLE_STRING_FIELDS = ("id", *_STRING_CONTEXT_FIELDS, "age")


@dataclass(slots=True)
class ParsedWrite:
    requests: list[Any]
    album_name: str | None
    description: str | None
    strict: bool
    default_detection: int | None


@dataclass(slots=True)
class Validated:
    ids: list[str] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def parse_bulk(payload: Any) -> ParsedWrite:
    if not isinstance(payload, dict):
        raise Reject(400, CODE_BAD_JSON, "request body must be a JSON object")
    requests = payload.get("taggingRequest")
    if not isinstance(requests, list):
        raise Reject(400, CODE_BAD_JSON, "taggingRequest is required and must be an array")
    if not 1 <= len(requests) <= MAX_REQUESTS_PER_WRITE:
        raise Reject(
            400,
            CODE_BAD_JSON,
            f"taggingRequest must have 1 to {MAX_REQUESTS_PER_WRITE} elements, got {len(requests)}",
        )
    description = payload.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise Reject(400, CODE_BAD_JSON, "description must be a string")
        if len(description) > MAX_DESCRIPTION_LENGTH:
            raise Reject(
                400,
                CODE_BAD_JSON,
                f"description is longer than {MAX_DESCRIPTION_LENGTH} characters",
            )
    album_name = payload.get("albumName")
    if album_name is not None and (
        not isinstance(album_name, str) or len(album_name) > MAX_ALBUM_NAME_LENGTH
    ):
        raise Reject(
            400, CODE_BAD_JSON, f"albumName must be a string of at most {MAX_ALBUM_NAME_LENGTH}"
        )
    option = payload.get("option")
    strict = False
    if option is not None:
        if not isinstance(option, list) or not all(isinstance(o, str) for o in option):
            raise Reject(400, CODE_BAD_JSON, "option must be an array of strings")
        unknown = [o for o in option if o != "STRICT"]
        if unknown:
            raise Reject(400, CODE_BAD_JSON, f"unsupported option {unknown[0]!r} (only STRICT)")
        strict = "STRICT" in option
    try:
        default_detection = parse_detection(payload.get("defaultDetection"), "defaultDetection")
    except ValueError as err:
        raise Reject(400, CODE_BAD_DETECTION, str(err)) from None
    return ParsedWrite(requests, album_name, description, strict, default_detection)


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
        mask = parse_detection(context.get("detection"), "context.detection")
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


def _echo_value(value: Any, max_chars: int) -> Any:
    """A scalar as sent (a string cut to ``max_chars`` with a trailing ``…``), an array's first
    :data:`ECHO_MAX_ITEMS` scalars; anything nested deeper only named (``"<object>"``)."""
    if isinstance(value, str):
        return value if len(value) <= max_chars else value[:max_chars] + "\u2026"
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list):
        return [
            _echo_value(v, max_chars) if not isinstance(v, list | dict) else _nested(v)
            for v in value[:ECHO_MAX_ITEMS]
        ]
    return _nested(value)


def _nested(value: Any) -> str:
    return "<array>" if isinstance(value, list) else "<object>"


def _echo(element: Any) -> dict[str, Any]:
    """The failed element as the spec lists it: image {type, content} and the context fields,
    long values cut (a failing 15 MB request no longer gets a 15 MB answer)."""
    if not isinstance(element, dict):
        return {}
    echo: dict[str, Any] = {}
    image = element.get("image")
    if isinstance(image, dict):
        echo["image"] = {
            k: _echo_value(image[k], ECHO_MAX_CHARS) for k in ("type", "content") if k in image
        }
    elif "image" in element:
        echo["image"] = _echo_value(element["image"], ECHO_MAX_CHARS)
    context = element.get("context")
    if isinstance(context, dict):
        echo["context"] = {
            k: _echo_value(context[k], ECHO_MAX_CHARS) for k in _ECHO_CONTEXT_FIELDS if k in context
        }
    elif "context" in element:
        echo["context"] = _echo_value(element["context"], ECHO_MAX_CHARS)
    return echo


def validate(
    state: ServiceState, task: TaskRecord | None, parsed: ParsedWrite, task_default: int
) -> Validated:
    out = Validated()
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


def write_response(task: TaskRecord, accepted: Validated) -> web.Response:
    return json_response(
        {
            "taskId": task.task_id,
            "albumName": task.album_name,
            "taskExpiredAt": iso(task.expire_at),
            "validation": {"accept": len(accepted.ids), "failure": len(accepted.failures)},
            "failureList": accepted.failures,
        },
        202,
    )


def accept(state: ServiceState, task: TaskRecord, accepted: Validated, *, extend: bool) -> None:
    state.store.accept(
        task,
        accepted.ids,
        accepted.hashes,
        accepted.masks,
        urls=accepted.urls if state.config.fetch else None,
        processed=state.inline,
        extend=extend and bool(accepted.ids),
    )
