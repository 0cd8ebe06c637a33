"""Validation: every spec rule a client can check, before a row costs a round trip.

A row becomes a :class:`~fashiontag_pipeline.TaggingRequest` or a reject with a reason:
``id`` present, a non-empty string; the image an http(s) URL (bulk mode takes URLs only);
``detection`` values among the nine the spec allows; context fields of the right type
(strings; ``age`` a list of strings); uniqueness of ids within the run is checked against the
state store (:meth:`~.state.StateDB.dedupe`), so it holds across resumes without keeping ids in
memory.
"""

from __future__ import annotations

from typing import Any

from .._models import BulkContext, Detection, Image, ImageType, TaggingRequest
from .sinks import Reject
from .source import RowBatch
from .state import position

__all__ = ["STAGE_CLIENT", "Item", "Validator"]

STAGE_CLIENT = "client"

#: (id, position, request): a row that passed validation.
Item = tuple[str, int, TaggingRequest]

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


class Validator:
    """Turns row batches into tagging requests and client-side rejects. Stateless per row."""

    def __init__(self) -> None:
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
            raise _RowError("url must be an http:// or https:// URL (bulk mode takes URLs only)")
        rest = value.split("://", 1)[1]
        host = rest.split("/", 1)[0].split("?", 1)[0]
        # ``str.split()`` cuts at every (Unicode) whitespace: one part equal to the value
        # means the URL holds none, checked in C rather than per character.
        if not host or value.split() != [value]:
            raise _RowError("url is not a valid http(s) URL")
        return value

    # ------------------------------------------------------------------ batches

    def validate(
        self, batch: RowBatch, *, skip_upto: int = -1
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        """(accepted items, (position, reject) pairs) of a batch; rows at positions <=
        ``skip_upto`` are left out (a resume has already handled them)."""
        if batch.kind == "jsonl":
            return self._validate_jsonl(batch, skip_upto)
        return self._validate_csv(batch, skip_upto)

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
        self, batch: RowBatch, skip_upto: int
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        i_id, i_url, i_det, i_age, extras = self._layout(batch.header)
        width = len(batch.header)
        plain = not extras and i_det < 0 and i_age < 0  # id and url only: no context fields
        src, name = batch.source, batch.name
        shifted = position(src, 0)
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        for line, fields in batch.rows:
            pos = shifted | line
            if pos <= skip_upto:
                continue
            ident: str | None = None
            try:
                if len(fields) != width:
                    if len(fields) > i_id:
                        ident = fields[i_id] or None
                    raise _RowError(f"row has {len(fields)} fields, the header has {width}")
                ident = fields[i_id]
                if not ident:
                    ident = None
                    raise _RowError("id is missing")
                url = self._url(fields[i_url])
                if plain:
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
                    context = BulkContext(ident, **kwargs)
                request = TaggingRequest(Image(URL, url), context)
            except _RowError as err:
                rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, name)))
                continue
            items.append((ident, pos, request))
        return items, rejects

    def _validate_jsonl(
        self, batch: RowBatch, skip_upto: int
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
                request = TaggingRequest(
                    image=Image(type=ImageType.URL, content=self._jsonl_url(obj)),
                    context=BulkContext(id=ident, **self._jsonl_context(obj)),
                )
            except _RowError as err:
                rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, name)))
                continue
            items.append((ident, pos, request))
        return items, rejects

    def _jsonl_url(self, obj: dict[str, Any]) -> str:
        image = obj.get("image")
        if "url" in obj or image is None:
            return self._url(obj.get("url"))
        if not isinstance(image, dict):
            raise _RowError("image must be an object with type and content")
        if image.get("type") != "url":
            raise _RowError("image.type must be url (bulk mode takes URLs only)")
        return self._url(image.get("content"))

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
