"""OpenAPI 3.1 description of the reference service, served at ``/openapi.json``.

Bodies are described by JSON Schemas generated from the very msgspec structs of
:mod:`fashiontag_pipeline._models`, so the document cannot drift from the wire shapes.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from .._models import (
    MAX_PAGE_SIZE,
    BulkTaskRequest,
    BulkTaskResponse,
    SingleTagRequest,
    TaggingResponse,
    TaskListResponse,
    TaskResultsResponse,
    TaskStatusResponse,
)
from .config import DEFAULT_LIST_SIZE, MAX_LIST_SIZE

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_SINGLE_ERROR = {
    "type": "object",
    "required": ["status", "error"],
    "properties": {
        "status": {"type": "string"},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
        },
    },
}
_BULK_ERROR = {
    "type": "object",
    "required": ["status", "error"],
    "properties": {
        "status": {"type": "string"},
        "error": {"type": "string"},
        "failureList": {"type": "array", "items": {"type": "object"}},
    },
}
_ERROR_TEXT = {
    "400": "Malformed body, whole-request limit, or STRICT failure",
    "401": "Missing or unknown API key",
    "403": "The key is not a bulk key",
    "404": "Unknown task (or another key's task)",
    "405": "Method not allowed",
    "409": "Results asked while TASK_PROCESSING",
    "410": "Task expired (PUT) or results expired (GET)",
    "413": "Request body too large",
    "429": "Rate limited; see Retry-After",
    "500": "Transient server error",
    "503": "Transient server error",
}


def _errors(schema_name: str, codes: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for code in codes:
        response = _json_body(_ref(schema_name), _ERROR_TEXT[code])
        if code == "429":
            response["headers"] = {
                "Retry-After": {"schema": {"type": "number"}, "description": "seconds"}
            }
        out[code] = response
    return out


_COMMON = ("401", "429", "500", "503")
_LANGUAGE = {
    "name": "accept-language",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "en (default), ko, zh, ja; q-lists accepted",
}
_TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}


@functools.cache
def openapi_document() -> bytes:
    """The OpenAPI document (JSON bytes), built once."""
    (
        (
            single_req,
            single_resp,
            bulk_req,
            bulk_resp,
            list_resp,
            status_resp,
            results_resp,
        ),
        components,
    ) = msgspec.json.schema_components(
        [
            SingleTagRequest,
            TaggingResponse,
            BulkTaskRequest,
            BulkTaskResponse,
            TaskListResponse,
            TaskStatusResponse,
            TaskResultsResponse,
        ],
        ref_template=_REF,
    )
    components["SingleError"] = _SINGLE_ERROR
    components["BulkError"] = _BULK_ERROR
    write_errors = ("400", "403", "413", *_COMMON)
    paths: dict[str, Any] = {
        "/tagger/v2/tags": {
            "post": {
                "operationId": "tag",
                "summary": "Tag one image (single mode)",
                "parameters": [_LANGUAGE],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": single_req}},
                },
                "responses": {
                    "200": _json_body(single_resp, "Tagging response (status may be failure)"),
                    **_errors("SingleError", ("400", "413", *_COMMON)),
                },
            }
        },
        "/tagger/v2.12/bulk": {
            "post": {
                "operationId": "createTask",
                "summary": "Create a bulk task",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": bulk_req}},
                },
                "responses": {
                    "202": _json_body(bulk_resp, "Task created"),
                    **_errors("BulkError", write_errors),
                },
            },
            "get": {
                "operationId": "listTasks",
                "summary": "One page of the key's tasks, newest first (data.taskInfo added)",
                "parameters": [
                    {
                        "name": "offset",
                        "in": "query",
                        "required": False,
                        "description": "0 = the newest task",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "size",
                        "in": "query",
                        "required": False,
                        "description": f"default {DEFAULT_LIST_SIZE}",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_SIZE},
                    },
                ],
                "responses": {
                    "200": _json_body(list_resp, "Tasks"),
                    **_errors("BulkError", ("400", "403", *_COMMON)),
                },
            },
        },
        "/tagger/v2.12/bulk/{task_id}": {
            "put": {
                "operationId": "appendToTask",
                "summary": "Append images to a task",
                "parameters": [_TASK_ID],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": bulk_req}},
                },
                "responses": {
                    "202": _json_body(bulk_resp, "Images appended"),
                    **_errors("BulkError", (*write_errors, "404", "410")),
                },
            },
            "get": {
                "operationId": "taskResults",
                "summary": "One page of a done task's results",
                "parameters": [
                    _TASK_ID,
                    {
                        "name": "offset",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "size",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
                    },
                    _LANGUAGE,
                ],
                "responses": {
                    "200": _json_body(results_resp, "Results page"),
                    **_errors("BulkError", ("400", "403", "404", "409", "410", *_COMMON)),
                },
            },
        },
        "/tagger/v2.12/bulk/{task_id}/status": {
            "get": {
                "operationId": "taskStatus",
                "summary": "One task's status and counts",
                "parameters": [_TASK_ID],
                "responses": {
                    "200": _json_body(status_resp, "Task status"),
                    **_errors("BulkError", ("403", "404", *_COMMON)),
                },
            }
        },
    }
    document = {
        "openapi": "3.1.0",
        "info": {
            "title": "fashiontag reference tagging service",
            "version": "2.12",
            "description": "Single mode (v2) and bulk mode (v2.12) of the tagging service spec. "
            "The analyzer is a reference, not a fashion model.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
        "security": [{"apiKey": []}],
    }
    return msgspec.json.encode(document)
