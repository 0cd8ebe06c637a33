"""A CSV header is its first record, which a quoted cell's line break makes span lines: never
rows read into it (each failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine.plainbody import request_of
from fashiontag_pipeline.engine.source import open_manifest
from fashiontag_pipeline.engine.validate import Validator
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args
from .test_single_mode import red_picture


@pytest.mark.parametrize("image", ["https://img.example/{}.jpg", "img/{}.jpg"], ids=["url", "path"])
async def test_a_header_quote_closed_by_a_rows_inch_mark_takes_no_rows(
    tmp_path: Path, image: str
) -> None:
    """A header with a stray quote (``"productContentName`` with no closing one, read as its
    first line before the header could span lines) and a row whose name ends with an inch
    mark (``Monitor 27"``): the quote and the mark were taken for one header cell, the rows
    between read into the header's last name, neither tagged nor rejected, exit 0. A header
    record holding rows (a URL, a line as wide as a row) is its first line, as before."""
    (tmp_path / "img").mkdir()
    for i in range(6):
        red_picture(tmp_path / "img" / f"{i}.jpg")
    rows = [f"p{i},{image.format(i)},Monitor {20 + i}" for i in range(6)]
    rows[3] += '"'
    manifest = tmp_path / "m.csv"
    manifest.write_text('id,url,"productContentName\n' + "\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV, cwd=tmp_path
        )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(6))
    assert sorted(o.ids) == sorted(ids_of(6)) and o.rejects == []


@pytest.mark.parametrize(
    ("header", "row"),
    [
        ("id,url,", "p{0},https://x/{0}.jpg"),
        ("id,url,brand, ,", 'p{0},https://x/{0}.jpg,"acme"'),
    ],
    ids=["plain", "quoted-with-brand"],
)
async def test_a_header_ending_with_a_delimiter_reads_every_row(
    tmp_path: Path, header: str, row: str
) -> None:
    """A header ending with a delimiter (``id,url,``: some exporters write the trailing comma
    on the header only): every row was a reject "row has 2 fields, the header has 3", exit 0,
    nothing tagged. Empty names at the header's end are no columns: rows with or without the
    trailing empty cells are read (a value in such an unnamed cell is ignored, as before)."""
    width = len(header.rstrip(", ").split(","))
    unnamed = len(header.split(",")) - width
    rows = [row.format(i) for i in range(8)]
    rows[2] += ","  # the trailing delimiter on a row too
    rows[3] += "," * unnamed
    rows[4] += ",unnamed"  # a value under no name: ignored, as it always was
    manifest = tmp_path / "m.csv"
    manifest.write_text(header + "\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV, cwd=tmp_path
        )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(8))
    assert sorted(o.ids) == sorted(ids_of(8)) and o.rejects == [], o.rejects
    reader = open_manifest(str(manifest), 0)
    try:
        batch = reader.read_batch()
        assert batch is not None
        items, rejects = Validator().validate(batch)
    finally:
        reader.close()
    assert not rejects and len(items) == 8
    requests = [request_of(ident, request) for ident, _, request in items]
    assert {request.context.brand for request in requests} == {"acme" if width == 3 else None}
