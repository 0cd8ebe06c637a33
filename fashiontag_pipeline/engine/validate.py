"""Validation: every spec rule a client can check, before a row costs a round trip.

A row becomes a :class:`~fashiontag_pipeline.TaggingRequest` or a reject with a reason: ``id``
present, a non-empty string; the image an http(s) URL (bulk mode takes URLs only); ``detection``
values among the nine the spec allows; context fields of the right type (strings; ``age`` a list
of strings). The rules for one field are in :mod:`.rules`; this module applies them to a batch of
CSV or JSONL rows. Uniqueness of ids within the run is checked against the state store
(:meth:`~.state.StateDB.dedupe`), so it holds across resumes without keeping ids in memory.

Routing (:meth:`Validator.route`, what the engine uses): rows whose image cannot go through bulk
(a local path, a ``file:`` URL, a ``data:image/...;base64,`` URI: :func:`.rules.single_target`)
become :class:`~.rules.SingleRequest` items for the single endpoint (:mod:`.single`); whether the
file exists and whether the base64 decodes is checked by the single stage (in a thread), not
here. :meth:`Validator.validate` keeps the bulk-only rules (every non-http(s) image is a reject).

Cost: a batch whose columns are ``id``, ``url`` and context fields taken as text, plain lines
(:class:`~.rows.PlainRows`) or rows the csv module parsed, is checked and built column by
column (:mod:`.plainblock`), its rows that break a rule one by one with the full rule set
(:meth:`Validator.general`, which the tests compare the block paths with); a batch with
``detection`` or ``age`` columns, or part of which a resume skips, row by row. JSONL rows
(:mod:`.jsonlrows`) likewise: a block of decoded lines (:class:`~.rows.JsonRows`) column by
column, the rows of other key orders one by one. All give the same items and rejects.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from .._models import BulkContext, Image, ImageType, TaggingRequest
from .jsonlrows import JsonlRows
from .plainblock import context_block, parsed_block, plain_block
from .policy import Measured, batch_size
from .rows import PlainRows, RowBatch
from .rules import (
    CONTEXT_FIELDS,
    MAX_ID_SAFE_CHARS,
    PLAIN_URL,
    SINGLE_DATA,
    SINGLE_FILE,
    STAGE_CLIENT,
    DetectionRule,
    Item,
    NotHttp,
    RowError,
    SingleItem,
    SingleRequest,
    age_values,
    http_url,
    id_error,
    single_request,
    single_target,
)
from .sinks import Reject
from .state import position

__all__ = [
    "SINGLE_DATA",
    "SINGLE_FILE",
    "STAGE_CLIENT",
    "Item",
    "SingleItem",
    "SingleRequest",
    "Validator",
]

URL = ImageType.URL
_POSITION = itemgetter(1)
#: (index of id, index of url, of detection, of age, [(index, context field)]) of a header.
_Layout = tuple[int, int, int, int, list[tuple[int, str]]]
#: The reason of a row that is the header again (part files of an export joined with ``cat``).
REPEATED_HEADER = (
    "row repeats the header (manifests joined into one, each with its header): no image to tag"
)


#: Why a row has more fields than the header when a field before a comma ends with a
#: backslash: an unquoted value's comma escaped, as Snowflake's ``COPY INTO`` writes it
#: without ``FIELD_OPTIONALLY_ENCLOSED_BY`` (a CSV reader splits the value there).
ESCAPED_COMMA = (
    " (a comma escaped as \\, in an unquoted field: Snowflake's ESCAPE_UNENCLOSED_FIELD; unload"
    " with FIELD_OPTIONALLY_ENCLOSED_BY = '\"')"
)


def _repeats_header(fields: list[str], header: list[str]) -> bool:
    """Whether a row's fields are the header's names (in any case, a BOM or spaces around
    them): the header line of a part file that follows another in the same input."""
    return [f.strip().lstrip("\ufeff").strip().lower() for f in fields] == [
        name.lower() for name in header
    ]


class Validator(JsonlRows):
    """Turns row batches into tagging requests and client-side rejects. Stateless per row."""

    def __init__(self, *, cwd: str | None = None) -> None:
        #: Base of relative local paths (the current working directory by default).
        self.cwd = cwd if cwd is not None else os.getcwd()
        self._detection = DetectionRule()
        self._layouts: dict[tuple[str, ...], _Layout] = {}
        self._key_orders: dict[tuple[str, ...], list[tuple[str, str]] | str] = {}

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

    def general(
        self, batch: RowBatch, *, route: bool = False
    ) -> tuple[list[Item], list[SingleItem], list[tuple[int, Reject]]]:
        """Every row of ``batch`` (CSV or JSONL) through the full rule set, one by one: what
        the block paths of :meth:`route` must give (the tests compare them)."""
        shifted = position(batch.source, 0)
        items: list[Item] = []
        singles: list[SingleItem] = []
        rejects: list[tuple[int, Reject]] = []
        if batch.kind == "jsonl":
            for line, obj in batch.rows:
                pos = shifted | line
                self._jsonl_row(batch, line, obj, pos, items, rejects, singles if route else None)
            return items, singles, rejects
        layout = self._layout(batch.header)
        for line, fields in batch.rows:
            pos = shifted | line
            self._csv_row(
                batch, layout, line, fields, pos, items, rejects, singles if route else None
            )
        return items, singles, rejects

    def _layout(self, header: list[str]) -> _Layout:
        key = tuple(header)
        layout = self._layouts.get(key)
        if layout is None:
            index = {name: i for i, name in enumerate(header)}
            extras = [(index[c], f) for c, f in CONTEXT_FIELDS.items() if c in index]
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
        rows = batch.rows
        whole_past = bool(rows) and (shifted | rows[0][0]) > skip_upto  # (none resumed past)
        if extras or i_det >= 0 or i_age >= 0:
            if i_det < 0 and i_age < 0 and whole_past:
                return self._mixed_block(batch, layout, rows, shifted, singles)
            for line, fields in rows:
                pos = shifted | line
                if pos > skip_upto:
                    row(batch, layout, line, fields, pos, items, rejects, singles)
            return items, rejects
        if whole_past:  # (id and url, and maybe columns no rule reads)
            if width == 2 and isinstance(rows, PlainRows):
                whole = self._plain_block(rows, i_id, shifted)
                if whole is not None:
                    return whole, rejects
            return self._mixed_block(batch, layout, rows, shifted, singles)
        # Rows past a resume's mark (id and url only): a row whose id is set and whose url is
        # an http(s) URL with a host and no whitespace (one C-level regex match, the same rule
        # as rules.http_url) becomes its request right here; any other row takes the general
        # path.
        plain_url = PLAIN_URL.fullmatch
        append = items.append
        for line, fields in rows:
            pos = shifted | line
            if pos <= skip_upto:
                continue
            if type(fields) is list and len(fields) == width:
                ident = fields[i_id]
                url = fields[i_url]
                if (
                    ident
                    and plain_url(url) is not None
                    and url.count("://") == 1  # (a URL holding another: rules._JOINED)
                    and "\x00" not in ident
                    and len(ident) <= MAX_ID_SAFE_CHARS
                ):
                    append((ident, pos, TaggingRequest(Image(URL, url), BulkContext(ident))))
                    continue
            row(batch, layout, line, fields, pos, items, rejects, singles)
        return items, rejects

    #: The block of ``id,url`` lines (:func:`.plainblock.plain_block`).
    _plain_block = staticmethod(plain_block)

    def _mixed_block(
        self,
        batch: RowBatch,
        layout: _Layout,
        rows: Sequence[tuple[int, Any]],
        shifted: int,
        singles: list[SingleItem] | None,
    ) -> tuple[list[Item], list[tuple[int, Reject]]]:
        """A batch whose columns are the id, the URL and text context fields: the rows that
        pass every rule built whole (:mod:`.plainblock`), the others checked one by one
        (their rejects, single-mode items, or requests the general path builds otherwise),
        all in line order."""
        i_id, i_url, _, _, extras = layout
        width = len(batch.header)
        whole = context_block if isinstance(rows, PlainRows) else parsed_block
        block, rest = whole(rows, width, i_id, i_url, extras, shifted)  # type: ignore[arg-type]
        items: list[Item] = []
        rejects: list[tuple[int, Reject]] = []
        for k in rest:
            line, fields = rows[k]
            self._csv_row(batch, layout, line, fields, shifted | line, items, rejects, singles)
        if not items:
            return block, rejects
        size = block.size + batch_size(items)
        return Measured(sorted([*block, *items], key=_POSITION), size), rejects

    def _csv_row(
        self,
        batch: RowBatch,
        layout: _Layout,
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
                ident = getattr(fields, "ident", None)  # (a BadRow may know its id)
                raise RowError(fields)
            if len(fields) != width:
                if len(fields) > i_id:
                    ident = fields[i_id] or None
                escaped = len(fields) > width and any(f.endswith("\\") for f in fields[:-1])
                raise RowError(
                    f"row has {len(fields)} fields, the header has {width}"
                    + (ESCAPED_COMMA if escaped else "")
                )
            ident = fields[i_id]
            if not ident:
                ident = None
                raise RowError("id is missing")
            refused = id_error(ident)
            if refused is not None:
                raise RowError(refused)
            target: tuple[str, str] | None = None
            try:
                url = http_url(fields[i_url])
            except NotHttp as not_http:
                if _repeats_header(fields, batch.header):
                    ident = None  # (the header's name, no row's id)
                    raise RowError(REPEATED_HEADER) from None
                target = single_target(not_http.args[0], singles is not None, self.cwd)
            if plain and target is None:
                context = BulkContext(ident)
            else:
                kwargs: dict[str, Any] = {}
                for i, field in extras:
                    value = fields[i]
                    if value:
                        kwargs[field] = value
                if i_det >= 0 and fields[i_det]:
                    detection = self._detection(fields[i_det])
                    if detection:  # (a cell of separators or spaces is none, as an empty one)
                        kwargs["detection"] = detection
                if i_age >= 0 and fields[i_age]:
                    age = age_values(fields[i_age])
                    if age:
                        kwargs["age"] = age
                if target is not None:
                    assert singles is not None
                    singles.append((ident, pos, single_request(target, ident, kwargs, line, name)))
                    return
                context = BulkContext(ident, **kwargs)
            request = TaggingRequest(Image(URL, url), context)
        except RowError as err:
            rejects.append((pos, Reject(ident, str(err), STAGE_CLIENT, line, name)))
            return
        items.append((ident, pos, request))
