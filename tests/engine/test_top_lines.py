"""The header of a CSV manifest is read from the first lines of its first read only
(``csvchunk.top_lines``), not from all of them split and joined again: the same header, rows,
line numbers and errors as when every line of that read was split, on every layout of a
manifest's top (blank lines, CRLF, bare CRs, a header spanning lines, long rows, none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fashiontag_pipeline.engine import csvchunk, source
from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest

ROWS = 3000  # (~130 KiB: past csvchunk.HEAD_PEEK)


def _rows(n: int = ROWS, width: int = 0) -> list[str]:
    pad = "x" * width
    return [f"p{i},https://img.example/{i}.jpg,{pad}b{i}" for i in range(n)]


LAYOUTS = {
    "plain": "id,url,brand\n" + "\n".join(_rows()) + "\n",
    "blank-lines-first": "\n \n\t\n" * 20 + "id,url,brand\n" + "\n".join(_rows()) + "\n",
    "crlf": "id,url,brand\r\n" + "\r\n".join(_rows()) + "\r\n",
    "bare-cr": "id,url,brand\r" + "\r".join(_rows()) + "\r",
    "header-spanning-lines": 'id,url,"brand\nname\nhere"\n' + "\n".join(_rows()) + "\n",
    "header-quote-never-closed": 'id,url,"brand\n' + "\n".join(_rows()) + "\n",
    "long-rows": "id,url,brand\n" + "\n".join(_rows(300, width=900)) + "\n",
    "blank-lines-past-the-peek": (" " * 1000 + "\n") * 80 + "id,url,brand\n" + "\n".join(_rows()),
    "first-row-spanning-lines": 'id,url,brand\np,https://x/p.jpg,"a\nb"\n' + "\n".join(_rows()),
    "short": "id,url\np1,https://x/1.jpg\n",
    "header-only": "id,url\n",
    "no-url-column": "id,image_src\n" + "\n".join(_rows()) + "\n",
    "urls-under-a-header": "image\n" + "\n".join(f"https://x/{i}.jpg" for i in range(ROWS)),
}


def _read(path: Path) -> tuple[str, list[str] | None, list[tuple[int, object]]]:
    try:
        reader = open_manifest(str(path), 0)
    except Exception as err:  # (the error a manifest's top gets, compared as text)
        return f"{type(err).__name__}: {err}", None, []
    try:
        return "", reader.header, list(iter_rows_sync(reader))
    finally:
        reader.close()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_header_read_from_the_top_lines_reads_as_all_lines_did(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.csv"
    path.write_bytes(LAYOUTS[layout].encode())
    got = _read(path)
    monkeypatch.setattr(source, "top_lines", csvchunk.csv_lines)  # every line of the read
    assert got == _read(path)
    assert got[0] or got[2] or layout == "header-only"  # (rows read, or the same error)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_top_lines_are_the_first_lines_and_enough_for_the_header(layout: str) -> None:
    text = LAYOUTS[layout]
    every = csvchunk.csv_lines(text)
    top = csvchunk.top_lines(text)
    assert top == every[: len(top)]
    skip = next(i for i, line in enumerate(every) if line.strip())
    assert top == every or len(top) - skip > 2 * csvchunk.MAX_HEADER_LINES + 1
    if layout == "plain":
        assert len(top) < len(every) // 2  # (the point: the rows are not split here)
