"""A CSV header is its first record, which a quoted cell's line break makes span lines: never
rows read into it (each failed before its fix)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

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
