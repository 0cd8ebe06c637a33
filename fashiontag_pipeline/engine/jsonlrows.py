"""The validator's rules for JSONL rows (each line one JSON object), row by row and as a block.

Row by row (:meth:`JsonlRows._jsonl_row`), every rule: keys taken in any case (``ID``,
``Brand``: :func:`.rules.jsonl_keys`, once per key order), fields in a ``context`` object (the
spec's shape), ``image: {type, content}`` instead of ``url``, ``detection`` and ``age`` lists,
each field's type.

As a block (:meth:`JsonlRows._jsonl_block`, a batch of lines the source decoded in one go:
:class:`~.rows.JsonRows`): a catalogue exported from a database or a product API writes every
row alike, ``{"id": ..., "url": ..., "brand": ...}``, maybe with keys no rule reads. The rows
whose key order is such a one (every read key spelled as read, none of ``image``, ``context``,
``detection``, ``age``, no two spellings of one field) are checked and built column by column
(:func:`.plainblock.built`: the id and URL rules of the CSV block paths; a context value is
sent when it is a non-empty string); every other row goes through :meth:`_jsonl_row`, and all
come out in line order. A row cost ~3-4 us in the row by row rules.
"""

from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any

from .._models import BulkContext, Image, ImageType, TaggingRequest
from .jsonnums import id_text, minus_zero_row, number_text, texts
from .plainblock import built
from .policy import Measured, batch_size
from .rows import JsonRows, RowBatch
from .rules import (
    CONTEXT_FIELDS,
    STAGE_CLIENT,
    DetectionRule,
    Item,
    NotHttp,
    RowError,
    SingleItem,
    age_values,
    http_url,
    id_error,
    jsonl_keys,
    merged_context,
    single_request,
    single_target,
)
from .sinks import Reject
from .state import position

__all__ = ["JsonlRows"]

_POSITION = itemgetter(1)
#: Key orders of JSONL objects whose reading is kept (:meth:`JsonlRows._keyed`).
_MAX_KEY_ORDERS = 4096
_UNSEEN = "unseen"
#: Keys whose rules the block path leaves to the row by row rules (a row naming one of them,
#: even with a null value, is checked there).
_ROW_BY_ROW = frozenset({"image", "context", "detection", "age"})
_TEXT = frozenset({str})


class JsonlRows:
    """The JSONL half of :class:`~.validate.Validator` (its state: the base of relative paths,
    the detection rule, and the reading of each key order seen)."""

    cwd: str
    _detection: DetectionRule
    _key_orders: dict[tuple[str, ...], list[tuple[str, str]] | str]

    def _validate_jsonl(
        self, batch: RowBatch, skip_upto: int, singles: list[SingleItem] | None
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        shifted = position(batch.source, 0)
        rows = batch.rows
        if isinstance(rows, JsonRows) and (shifted | rows.first) > skip_upto:
            return self._jsonl_block(batch, rows, shifted, singles)
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        row = self._jsonl_row
        for line, obj in rows:
            pos = shifted | line
            if pos > skip_upto:
                row(batch, line, obj, pos, items, rejects, singles)
        return items, rejects

    def _jsonl_block(
        self,
        batch: RowBatch,
        rows: JsonRows,
        shifted: int,
        singles: list[SingleItem] | None,
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        """A block of decoded lines: the rows of a plain key order built whole, the others
        checked one by one (their rejects, single-mode items, or requests), in line order."""
        values = rows.values
        first = rows.first
        block, rest = self._plain_rows(values, shifted | first)
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        for k in rest:
            line = first + k
            self._jsonl_row(batch, line, values[k], shifted | line, items, rejects, singles)
        if not items:
            return block, rejects
        size = block.size + batch_size(items)
        return Measured(sorted([*block, *items], key=_POSITION), size), rejects

    def _plain_rows(self, values: list[Any], first: int) -> tuple[Measured, list[int]]:
        """The items of the rows of ``values`` (positions from ``first``) that pass every rule
        and whose key order is plain, and the indexes of the others."""
        n = len(values)
        kept: list[int] | None = None  # the indexes of the objects taken (None: all)
        objs = values
        if set(map(type, values)) != {dict}:
            kept = [k for k, v in enumerate(values) if type(v) is dict]
            objs = [values[k] for k in kept]
        orders = list(map(tuple, objs))  # (the keys of each object, as written)
        distinct = set(orders)
        plain = {keys for keys in distinct if self._plain_order(keys)}
        if plain != distinct:
            taken = [k for k, keys in enumerate(orders) if keys in plain]
            kept = taken if kept is None else [kept[k] for k in taken]
            objs = [objs[k] for k in taken]
        read = {key for keys in plain for key in keys if key in CONTEXT_FIELDS}
        get = dict.get
        ids: list[Any] = list(map(get, objs, repeat("id")))
        urls: list[Any] = list(map(get, objs, repeat("url")))
        by_key: dict[str, list[Any]] = {}
        for key in read:
            # A key left out or null is no value, as an empty string is: "" to the columns.
            column = list(map(get, objs, repeat(key), repeat("")))
            by_key[key] = ["" if v is None else v for v in column] if None in column else column
        if not set(map(type, ids)) | set(map(type, urls)) <= _TEXT or any(
            not set(map(type, column)) <= _TEXT for column in by_key.values()
        ):
            # Numbers as their text (an id: integers only); a value of another type (a float id,
            # a list) and its row are checked one by one.
            ids = texts(ids, ints_only=True)
            by_key = {key: texts(column) for key, column in by_key.items()}
            good = [
                type(i) is str
                and type(u) is str
                and all(type(c[k]) is str for c in by_key.values())
                for k, (i, u) in enumerate(zip(ids, urls, strict=True))
            ]
            indexes = range(n) if kept is None else kept
            kept = [k for k, ok in zip(indexes, good, strict=True) if ok]
            ids = [v for v, ok in zip(ids, good, strict=True) if ok]
            urls = [v for v, ok in zip(urls, good, strict=True) if ok]
            by_key = {
                f: [v for v, ok in zip(c, good, strict=True) if ok] for f, c in by_key.items()
            }
        by_field: dict[str, list[str]] = {}
        for key, column in by_key.items():
            field = CONTEXT_FIELDS[key]
            if field in by_field:  # both spellings, each in rows of its own key order
                column = [a or b for a, b in zip(by_field[field], column, strict=True)]
            by_field[field] = column
        rest = [] if kept is None else sorted(set(range(n)).difference(kept))
        return built(ids, urls, list(by_field.items()), range(first, first + n), kept, rest)

    def _plain_order(self, keys: tuple[str, ...]) -> bool:
        """Whether objects with these keys are read as written by the block path: no key to
        rename or clash (:meth:`_keyed`), none with rules of its own."""
        renames = self._key_orders.get(keys)
        if renames is None:
            renames = jsonl_keys(keys)
            if len(self._key_orders) < _MAX_KEY_ORDERS:
                self._key_orders[keys] = renames
        return not renames and _ROW_BY_ROW.isdisjoint(keys)

    def _jsonl_row(
        self,
        batch: RowBatch,
        line: int,
        obj: Any,
        pos: int,
        items: list[Item],
        rejects: list[tuple[int, Reject]],
        singles: list[SingleItem] | None,
        exact: bool = False,
    ) -> None:
        """One JSONL row, every rule: appends its item, single-mode item or reject (``exact``:
        ``obj`` read with its ``-0`` literals as floats)."""
        ident: str | None = None
        try:
            if isinstance(obj, str) and type(obj) is not str:
                # The source's reason for a line it refuses (a BadRow, which may know its id);
                # a line holding a JSON string is a str, and no object.
                ident = getattr(obj, "ident", None)
                raise RowError(obj)
            if not isinstance(obj, dict):
                raise RowError("line is not a JSON object")
            clash = ""
            if self._key_orders.get(tuple(obj), _UNSEEN):  # (the usual row: keys read as written)
                obj, clash = self._keyed(obj)
            context = obj.get("context")
            if isinstance(context, dict):  # fields in a context object (the spec's shape)
                context, in_context = self._keyed(context)
                clash = clash or in_context
            else:
                context = None
            raw_id = obj.get("id")
            if (raw_id is None or raw_id == "") and context is not None:
                raw_id = context.get("id")
            if raw_id is None or raw_id == "":
                raise RowError(clash or "id is missing")  # (its keys may clash: ID, Id)
            if type(raw_id) is int and raw_id == 0 and not exact:  # (-0 too: jsonnums)
                redone = minus_zero_row(batch.rows, line)
                if redone is not None:
                    self._jsonl_row(batch, line, redone, pos, items, rejects, singles, True)
                    return
            # (an integer is its decimal text: jsonnums)
            ident = raw_id if isinstance(raw_id, str) else id_text(raw_id)
            refused = id_error(ident)
            if refused is not None:
                raise RowError(refused)
            if clash:
                raise RowError(clash)
            source = obj if context is None else merged_context(obj, context)
            url, target = self._jsonl_image(obj, singles is not None)
            if target is not None:
                assert singles is not None
                kwargs = self._jsonl_context(source)
                singles.append(
                    (ident, pos, single_request(target, ident, kwargs, line, batch.name))
                )
                return
            request = TaggingRequest(
                image=Image(type=ImageType.URL, content=url),
                context=BulkContext(id=ident, **self._jsonl_context(source)),
            )
        except RowError as err:
            rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, batch.name)))
            return
        items.append((ident, pos, request))

    def _keyed(self, obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(``obj`` with the keys it names in another case under their names, the reason of a
        reject when two of its keys name one field, else ""): :func:`.rules.jsonl_keys`, once
        per key order (an export writes every row's keys alike; the usual row has none to
        rename and is not copied)."""
        keys = tuple(obj)
        renames = self._key_orders.get(keys)
        if renames is None:
            renames = jsonl_keys(keys)
            if len(self._key_orders) < _MAX_KEY_ORDERS:
                self._key_orders[keys] = renames
        if isinstance(renames, str):
            return obj, renames
        if renames:
            obj = dict(obj)
            for key, name in renames:
                obj[name] = obj.pop(key)
        return obj, ""

    def _jsonl_image(self, obj: dict[str, Any], route: bool) -> tuple[str, tuple[str, str] | None]:
        """(http(s) URL, "") for bulk, or ("", (kind, content)) for the single endpoint."""
        image = obj.get("image")
        if "url" in obj or image is None:
            raw = obj.get("url")
        else:
            if not isinstance(image, dict):
                raise RowError("image must be an object with type and content")
            kind = image.get("type")
            raw = image.get("content")
            if kind == "base64" and route:
                if not isinstance(raw, str) or raw[:11].lower() != "data:image/":
                    raise RowError(
                        "image.content of type base64 must begin with data:image/<ext>;base64,"
                    )
                return "", single_target(raw, route, self.cwd)
            if kind != "url":
                if route:
                    raise RowError("image.type must be url or base64")
                raise RowError("image.type must be url (bulk mode takes URLs only)")
        try:
            return http_url(raw), None
        except NotHttp as not_http:
            return "", single_target(not_http.args[0], route, self.cwd)

    def _jsonl_context(self, source: dict[str, Any]) -> dict[str, Any]:
        """The request's context fields of a row (``source``: the row, or its context object)."""
        kwargs: dict[str, Any] = {}
        for column, field in CONTEXT_FIELDS.items():
            value = source.get(column)
            if value is None:
                continue
            if not isinstance(value, str):
                value = number_text(value)  # (a number is sent as its text)
                if value is None:
                    raise RowError(f"{column} must be a string or a number")
            if value:
                kwargs[field] = value
        age = source.get("age")
        if age is not None:
            values = texts(age if isinstance(age, list) else [age])
            if not all(isinstance(a, str) for a in values):
                raise RowError("age must be a list of strings")
            # (a text, or a number, is values separated by |, as a CSV cell: age_values)
            given = values if isinstance(age, list) else values[0]
            if (age := age_values(given)) is not None:
                kwargs["age"] = age
        detection = self._detection(source.get("detection"))
        if detection:
            kwargs["detection"] = detection
        return kwargs
