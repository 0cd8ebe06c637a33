"""Validation: every spec rule a client can check, before a row costs a round trip.

A row becomes a :class:`~fashiontag_pipeline.TaggingRequest` or a reject with a reason:
``id`` present, a non-empty string; the image an http(s) URL (bulk mode takes URLs only);
``detection`` values among the nine the spec allows; context fields of the right type
(strings; ``age`` a list of strings); uniqueness of ids within the run is checked against the
state store (:meth:`~.state.StateDB.dedupe`), so it holds across resumes without keeping ids in
memory.

Routing (:meth:`Validator.route`, what the engine uses): rows whose image cannot go through
bulk become :class:`SingleRequest` items for the single endpoint (:mod:`.single`):

* a ``url`` (CSV column, JSONL ``url`` or ``image: {"type": "url"}``) that is a local path:
  a value with no URL scheme; a relative path is relative to the current working directory
  of the run (resolved when the row is validated and stored absolute, so a resume from
  another directory still reads the same file);
* a ``file:`` URL naming an absolute path (``file:///path`` or ``file://localhost/path``);
* a ``data:image/<ext>;base64,<content>`` URI, in ``url`` or as JSONL
  ``image: {"type": "base64", "content": "data:image/<ext>;base64,..."}``.

http(s) URLs go through bulk as before; any other scheme is a reject. Whether the file exists
and whether the base64 decodes is checked by the single stage (in a thread), not here.
:meth:`Validator.validate` keeps the bulk-only rules (every non-http(s) image is a reject).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

from .._models import BulkContext, Context, Detection, Image, ImageType, TaggingRequest
from .sinks import Reject
from .source import RowBatch
from .state import position

__all__ = ["STAGE_CLIENT", "Item", "SingleItem", "SingleRequest", "Validator"]

STAGE_CLIENT = "client"

#: (id, position, request): a row that passed validation.
Item = tuple[str, int, TaggingRequest]

SINGLE_FILE = "file"
SINGLE_DATA = "data"


class SingleRequest(msgspec.Struct, gc=False):
    """A row routed to the single endpoint, as written ahead to the state store.

    ``kind`` is ``file`` (``content``: an absolute path) or ``data`` (``content``: the
    ``data:image/<ext>;base64,`` URI); ``context`` is the single-mode context (``age`` a
    string); ``line`` and ``source`` locate the row for its rejects line."""

    kind: str
    content: str
    context: Context
    line: int
    source: str


#: (id, position, request): a row routed to the single endpoint.
SingleItem = tuple[str, int, SingleRequest]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: What :meth:`Validator._url` accepts, as one regex: http(s)://, a non-empty host (the text
#: up to the first / or ?), no whitespace anywhere (``\s`` is exactly what ``str.split()``
#: cuts at, checked over every code point).
_PLAIN_URL = re.compile(r"https?://[^/?\s]\S*")
_BULK_ONLY = "url must be an http:// or https:// URL (bulk mode takes URLs only)"
_BAD_SCHEME = (
    "url must be an http:// or https:// URL, a file:// URL, a data:image/<ext>;base64, URI"
    " or a local file path (scheme {scheme!r} is not supported)"
)
_BAD_DATA = "data: URI must be data:image/<ext>;base64,<content>"

_CONTEXT_FIELDS = {
    "gender": "gender",
    "brand": "brand",
    "currency": "currency",
    "price": "price",
    "keywords": "keywords",
    "productContentName": "product_content_name",
    "product_content_name": "product_content_name",
    "season": "season",
}
_ALLOWED = {d.value: d for d in Detection}
_ALLOWED_TEXT = ", ".join(_ALLOWED)
_MAX_CACHE = 4096
URL = ImageType.URL


class _RowError(Exception):
    pass


class _NotHttp(Exception):
    """The image is not an http(s) URL: a reject in bulk-only mode, else maybe routable."""


class Validator:
    """Turns row batches into tagging requests and client-side rejects. Stateless per row."""

    def __init__(self, *, cwd: str | None = None) -> None:
        #: Base of relative local paths (the current working directory by default).
        self.cwd = cwd if cwd is not None else os.getcwd()
        self._detections: dict[str, list[Detection]] = {}
        self._layouts: dict[tuple[str, ...], tuple[int, int, int, int, list[tuple[int, str]]]] = {}

    # ------------------------------------------------------------------ rules

    def _detection(self, value: Any) -> list[Detection] | None:
        if value is None or value == "":
            return None
        if isinstance(value, str):
            cached = self._detections.get(value)
            if cached is not None:
                return cached
            parts = [p.strip() for p in value.split("|")]
            out = self._detection_list([p for p in parts if p])
            if len(self._detections) < _MAX_CACHE:
                self._detections[value] = out
            return out
        if isinstance(value, list):
            return self._detection_list(value)
        raise _RowError("detection must be a list of strings (CSV: values separated by |)")

    @staticmethod
    def _detection_list(values: list[Any]) -> list[Detection]:
        out: list[Detection] = []
        for v in values:
            if not isinstance(v, str):
                raise _RowError("detection values must be strings")
            d = _ALLOWED.get(v.strip().upper())
            if d is None:
                raise _RowError(f"invalid detection value {v!r} (allowed: {_ALLOWED_TEXT})")
            if d not in out:
                out.append(d)
        if not out:
            return []
        return out

    @staticmethod
    def _url(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _RowError("url is missing")
        if not value.startswith(("http://", "https://")):
            raise _NotHttp(value)
        rest = value.split("://", 1)[1]
        host = rest.split("/", 1)[0].split("?", 1)[0]
        # ``str.split()`` cuts at every (Unicode) whitespace: one part equal to the value
        # means the URL holds none, checked in C rather than per character.
        if not host or value.split() != [value]:
            raise _RowError("url is not a valid http(s) URL")
        return value

    def _single_target(self, value: str, route: bool) -> tuple[str, str]:
        """(kind, content) of a non-http(s) image that can go to the single endpoint."""
        if not route:
            raise _RowError(_BULK_ONLY)
        if value.startswith("data:"):
            head, sep, payload = value.partition(",")
            ext = head[len("data:image/") : -len(";base64")]
            if (
                not sep
                or not payload
                or not head.startswith("data:image/")
                or not head.endswith(";base64")
                or not ext
                or "/" in ext
            ):
                raise _RowError(_BAD_DATA)
            return SINGLE_DATA, value
        if "\x00" in value:
            raise _RowError("local path contains a NUL character")
        if value[:5].lower() == "file:":
            parts = urlsplit(value)
            path = unquote(parts.path)
            if parts.netloc not in ("", "localhost") or not path.startswith("/"):
                raise _RowError("file URL must name an absolute local path (file:///path)")
            return SINGLE_FILE, path
        scheme = _SCHEME.match(value)
        if scheme is not None:
            raise _RowError(_BAD_SCHEME.format(scheme=scheme.group()[:-1]))
        return SINGLE_FILE, os.path.join(self.cwd, value)

    def _single(
        self,
        target: tuple[str, str],
        ident: str,
        kwargs: dict[str, Any],
        line: int,
        name: str,
    ) -> SingleRequest:
        age = kwargs.pop("age", None)
        context = Context(id=ident, age=",".join(age) if age else None, **kwargs)
        return SingleRequest(target[0], target[1], context, line, name)

    # ------------------------------------------------------------------ batches

    def validate(
        self, batch: RowBatch, *, skip_upto: int = -1
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        """(accepted items, (position, reject) pairs) of a batch; rows at positions <=
        ``skip_upto`` are left out (a resume has already handled them). Bulk only: every
        image that is not an http(s) URL is a reject."""
        if batch.kind == "jsonl":
            return self._validate_jsonl(batch, skip_upto, None)
        return self._validate_csv(batch, skip_upto, None)

    def route(
        self, batch: RowBatch, *, skip_upto: int = -1
    ) -> tuple[list[Item], list[SingleItem], list[tuple[int, Reject]]]:
        """Like :meth:`validate`, and rows that must go to the single endpoint (local files,
        ``data:`` URIs) come back as a second list instead of rejects."""
        singles: list[SingleItem] = []
        if batch.kind == "jsonl":
            items, rejects = self._validate_jsonl(batch, skip_upto, singles)
        else:
            items, rejects = self._validate_csv(batch, skip_upto, singles)
        return items, singles, rejects

    def _layout(self, header: list[str]) -> tuple[int, int, int, int, list[tuple[int, str]]]:
        key = tuple(header)
        layout = self._layouts.get(key)
        if layout is None:
            index = {name: i for i, name in enumerate(header)}
            extras = [(index[c], f) for c, f in _CONTEXT_FIELDS.items() if c in index]
            layout = (
                index["id"],
                index["url"],
                index.get("detection", -1),
                index.get("age", -1),
                extras,
            )
            self._layouts[key] = layout
        return layout

    def _validate_csv(
        self, batch: RowBatch, skip_upto: int, singles: list[SingleItem] | None
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        layout = self._layout(batch.header)
        i_id, i_url, i_det, i_age, extras = layout
        width = len(batch.header)
        shifted = position(batch.source, 0)
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        row = self._csv_row
        if extras or i_det >= 0 or i_age >= 0:
            for line, fields in batch.rows:
                pos = shifted | line
                if pos > skip_upto:
                    row(batch, layout, line, fields, pos, items, rejects, singles)
            return items, rejects
        # id and url only (the common manifest): a row whose id is set and whose url is an
        # http(s) URL with a host and no whitespace (one C-level regex match, the same rule as
        # _url) becomes its request right here; any other row takes the general path.
        plain_url = _PLAIN_URL.fullmatch
        append = items.append
        for line, fields in batch.rows:
            pos = shifted | line
            if pos <= skip_upto:
                continue
            if type(fields) is list and len(fields) == width:
                ident = fields[i_id]
                url = fields[i_url]
                if ident and plain_url(url) is not None:
                    append((ident, pos, TaggingRequest(Image(URL, url), BulkContext(ident))))
                    continue
            row(batch, layout, line, fields, pos, items, rejects, singles)
        return items, rejects

    def _csv_row(
        self,
        batch: RowBatch,
        layout: tuple[int, int, int, int, list[tuple[int, str]]],
        line: int,
        fields: list[str] | str,
        pos: int,
        items: list[Item],
        rejects: list[tuple[int, Reject]],
        singles: list[SingleItem] | None,
    ) -> None:
        """One CSV row, every rule: appends its item, single-mode item or reject."""
        i_id, i_url, i_det, i_age, extras = layout
        width = len(batch.header)
        plain = not extras and i_det < 0 and i_age < 0  # id and url only: no context fields
        name = batch.name
        ident: str | None = None
        try:
            if isinstance(fields, str):  # the source could not parse this row
                raise _RowError(fields)
            if len(fields) != width:
                if len(fields) > i_id:
                    ident = fields[i_id] or None
                raise _RowError(f"row has {len(fields)} fields, the header has {width}")
            ident = fields[i_id]
            if not ident:
                ident = None
                raise _RowError("id is missing")
            target: tuple[str, str] | None = None
            try:
                url = self._url(fields[i_url])
            except _NotHttp as not_http:
                target = self._single_target(not_http.args[0], singles is not None)
            if plain and target is None:
                context = BulkContext(ident)
            else:
                kwargs: dict[str, Any] = {}
                for i, field in extras:
                    value = fields[i]
                    if value:
                        kwargs[field] = value
                if i_det >= 0 and fields[i_det]:
                    kwargs["detection"] = self._detection(fields[i_det])
                if i_age >= 0 and fields[i_age]:
                    kwargs["age"] = [a.strip() for a in fields[i_age].split("|") if a.strip()]
                if target is not None:
                    assert singles is not None
                    singles.append((ident, pos, self._single(target, ident, kwargs, line, name)))
                    return
                context = BulkContext(ident, **kwargs)
            request = TaggingRequest(Image(URL, url), context)
        except _RowError as err:
            rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, name)))
            return
        items.append((ident, pos, request))

    def _validate_jsonl(
        self, batch: RowBatch, skip_upto: int, singles: list[SingleItem] | None
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        src, name = batch.source, batch.name
        shifted = position(src, 0)
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        for line, obj in batch.rows:
            pos = shifted | line
            if pos <= skip_upto:
                continue
            ident: str | None = None
            try:
                if isinstance(obj, str):
                    raise _RowError(obj)
                if not isinstance(obj, dict):
                    raise _RowError("line is not a JSON object")
                raw_id = obj.get("id")
                if raw_id is None and isinstance(obj.get("context"), dict):
                    raw_id = obj["context"].get("id")
                if raw_id is None or raw_id == "":
                    raise _RowError("id is missing")
                if not isinstance(raw_id, str):
                    raise _RowError("id must be a string")
                ident = raw_id
                url, target = self._jsonl_image(obj, singles is not None)
                if target is not None:
                    assert singles is not None
                    kwargs = self._jsonl_context(obj)
                    singles.append((ident, pos, self._single(target, ident, kwargs, line, name)))
                    continue
                request = TaggingRequest(
                    image=Image(type=ImageType.URL, content=url),
                    context=BulkContext(id=ident, **self._jsonl_context(obj)),
                )
            except _RowError as err:
                rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, name)))
                continue
            items.append((ident, pos, request))
        return items, rejects

    def _jsonl_image(self, obj: dict[str, Any], route: bool) -> tuple[str, tuple[str, str] | None]:
        """(http(s) URL, "") for bulk, or ("", (kind, content)) for the single endpoint."""
        image = obj.get("image")
        if "url" in obj or image is None:
            raw = obj.get("url")
        else:
            if not isinstance(image, dict):
                raise _RowError("image must be an object with type and content")
            kind = image.get("type")
            raw = image.get("content")
            if kind == "base64" and route:
                if not isinstance(raw, str) or not raw.startswith("data:image/"):
                    raise _RowError(
                        "image.content of type base64 must begin with data:image/<ext>;base64,"
                    )
                return "", self._single_target(raw, route)
            if kind != "url":
                if route:
                    raise _RowError("image.type must be url or base64")
                raise _RowError("image.type must be url (bulk mode takes URLs only)")
        try:
            return self._url(raw), None
        except _NotHttp as not_http:
            return "", self._single_target(not_http.args[0], route)

    def _jsonl_context(self, obj: dict[str, Any]) -> dict[str, Any]:
        source = obj.get("context") if isinstance(obj.get("context"), dict) else obj
        assert isinstance(source, dict)
        kwargs: dict[str, Any] = {}
        for column, field in _CONTEXT_FIELDS.items():
            value = source.get(column)
            if value is None:
                continue
            if not isinstance(value, str):
                raise _RowError(f"{column} must be a string")
            if value:
                kwargs[field] = value
        age = source.get("age")
        if age is not None:
            if isinstance(age, str):
                age = [age]
            if not isinstance(age, list) or not all(isinstance(a, str) for a in age):
                raise _RowError("age must be a list of strings")
            if age:
                kwargs["age"] = age
        detection = self._detection(source.get("detection"))
        if detection:
            kwargs["detection"] = detection
        return kwargs
