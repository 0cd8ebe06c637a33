"""Differential test of the reading and validation fast paths against their references.

Generated CSV manifests (headers naming id, url, context columns in any case and order,
unknown, ``detection`` and ``age`` columns; cells empty, blank, unicode, with NULs, commas,
quotes, CRs; every kind of image; LF, CRLF, mixed and bare-CR line ends, with or without a
last one) are read in pieces cut anywhere (a tiny ``READ_SIZE``) and in batches of any size:

* the rows read are the csv module's;
* each batch's :meth:`Validator.route` and :meth:`Validator.validate` (the block paths) give
  exactly :meth:`Validator.general` (every row through the full rules), also for a resume
  that starts inside the batch;
* a :class:`~.policy.Measured` batch's size is at least the text size of its requests (the
  chunk cutter takes it for an upper bound).
"""

from __future__ import annotations

import csv
import io
import re
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fashiontag_pipeline._exceptions import ManifestError
from fashiontag_pipeline.engine import manifest_bytes
from fashiontag_pipeline.engine.plainbody import encode_requests
from fashiontag_pipeline.engine.policy import item_size
from fashiontag_pipeline.engine.rows import JsonLines, RowBatch
from fashiontag_pipeline.engine.state import KeyedColumns, position
from fashiontag_pipeline.engine.validate import Validator

from .test_fast_paths import TRICKY_URLS, _batches, _csv_module_rows, as_structs

SOURCE = 3  # (positions carry the source's bits)
CONTEXT = ["gender", "brand", "currency", "price", "keywords", "productContentName", "season"]
# Odd characters: line separators to str.splitlines (not to the csv module), whitespace to
# str.split, a NUL, the CSV specials.
ODD = 'ab \u00e9,"\r\n\x00\x85\u2028\u3000\x1c\x0b\x0c\t|'
ODD_CELLS = [
    "",
    " ",
    "a b",
    "\u00e9t\u00e9",
    "a\x00b",
    "a,b",
    'Jeans 32" waist',
    '"q"',
    "a\rb",
    "a\r\nb",
    "a\nb",
    "a\x85b",
    "a\u2028b",
    "\u3000",
    "a\x1cb",
    "x|y",
    "TOP",
    "TOP|HAT",
    "nope",
]
IMAGES = [
    *TRICKY_URLS,
    "data:image/png;base64,AAAA",
    "DATA:IMAGE/PNG;BASE64,AAAA",
    "data:image/png;base64,",
    "data:text/plain;base64,AA",
    "/abs/p.jpg",
    "rel/p.jpg",
    "file:///tmp/x.jpg",
    "FILE:///tmp/x.jpg",
    "file://host/x.jpg",
    "c:\\img\\x.jpg",
    " https://h/x ",
    "https://h/x\u3000",
    "\u3000https://h/x",
    "https://h/a,b",
    'https://h/a"b',
    "https://h/a\rb",
    "https://h/a\nb",
    "Https://h/x\x85",
    "HTTP://h/\u00e9",
    "https://h/\x00",
    "https://h/a\x1cb",
]

good_ids = st.integers(0, 40).map(lambda i: f"g{i}")
good_urls = st.integers(0, 40).map(lambda i: f"https://img.example/{i}.jpg")
odd_text = st.text(alphabet=ODD, max_size=5)
ids = st.one_of(*[good_ids] * 5, st.sampled_from(ODD_CELLS), odd_text)
urls = st.one_of(*[good_urls] * 5, st.sampled_from(IMAGES), odd_text)
values = st.one_of(
    st.just(""), st.sampled_from(["m", "EUR", "12.5", "a b"]), st.sampled_from(ODD_CELLS), odd_text
)
spellings = st.sampled_from([str.lower, str.upper, str.title, lambda s: s, lambda s: f" {s} "])


@st.composite
def headers(draw: st.DrawFn) -> list[str]:
    """The column names of a header (as written): id and url, context, unknown, detection
    and age columns, any case, any order."""
    names = ["id", "url"]
    names += draw(st.lists(st.sampled_from(CONTEXT), unique=True, max_size=4))
    if draw(st.booleans()) and "productContentName" not in names:
        names += draw(st.lists(st.just("product_content_name"), max_size=1))
    names += draw(
        st.lists(
            st.sampled_from(["notes", "sku", "", "x y", "Colour", "no\x85tes", "a\u2028b", "\x0c"]),
            max_size=2,
        )
    )
    names += draw(st.lists(st.sampled_from(["detection", "age"]), unique=True, max_size=1))
    names = draw(st.permutations(names))
    written = [draw(spellings)(n) for n in names]
    if written[0].lstrip()[:1] in ("", "{"):  # (no header starting blank, or JSONL-like)
        written[0] = "sku"
    return written


@st.composite
def manifests(draw: st.DrawFn) -> str:
    written = draw(headers())
    names = [w.strip().lower() for w in written]
    mode = draw(st.sampled_from(["lf", "crlf", "mixed"]))
    ends = {"lf": st.just("\n"), "crlf": st.just("\r\n")}.get(
        mode, st.sampled_from(["\n", "\r\n", "\r"])
    )
    lines = [",".join(written)]
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["raw", "raw", "raw", "quoted", "blank"]))
        if kind == "blank":
            lines.append(draw(st.sampled_from(["", " ", "\u3000"])))
            continue
        cells = []
        for name in names:
            if name == "id":
                cells.append(draw(ids))
            elif name == "url":
                cells.append(draw(urls))
            else:
                cells.append(draw(values))
        if draw(st.integers(0, 9)) == 0:  # a field too few or too many
            cells = cells[:-1] if draw(st.booleans()) else [*cells, draw(values)]
        if kind == "quoted":
            out = io.StringIO()
            quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
            # (The writer quotes a field holding a CR or LF only when its line end has one.)
            csv.writer(out, lineterminator="\r\n", quoting=quoting).writerow(cells)
            lines.append(out.getvalue()[:-2])
        else:
            # Written as they are: a comma or line end in a cell is one to the csv module too;
            # no quote opens a field (an unmatched quote is refused by design, not parsed).
            lines.append(re.sub(r'(^|[,\r\n])"+', r"\1", ",".join(cells)))
    text = "".join(line + draw(ends) for line in lines)
    if draw(st.booleans()):
        text = text.rstrip("\r\n") + ("\n" if mode == "lf" else "\r\n")
    elif draw(st.booleans()):
        text = text.rstrip("\r\n")  # no last line end
    return text


def _listed(batch: RowBatch, skip_upto: int = -1) -> RowBatch:
    shifted = position(batch.source, 0)
    rows = [(line, f) for line, f in batch.rows if shifted | line > skip_upto]
    text = getattr(batch.rows, "text", None)  # (JSONL: the lines' text, read for a 0 id)
    if text is not None:
        rows = JsonLines(rows, {line: t for line, _ in rows if (t := text(line)) is not None})
    return RowBatch(batch.source, batch.name, batch.kind, batch.header, rows)


def _bounded(items: Any) -> None:
    """A measured batch's size is at least the text of its requests."""
    size = getattr(items, "size", None)
    if size is not None:
        assert size >= sum(map(item_size, items))


def _keyed_as_pairs(items: Any) -> None:
    """A block's columns (what the intake hands the dedupe, :class:`~.state.KeyedColumns`)
    are its items' (id, position) pairs, as the list built row by row was."""
    columns = getattr(items, "columns", None)
    if columns is not None:
        keyed = KeyedColumns(*columns)
        pairs = [(ident, pos) for ident, pos, _ in items]
        assert list(keyed) == pairs and len(keyed) == len(pairs)
        assert [keyed[i] for i in range(len(pairs))] == pairs


def _check_batch(batch: RowBatch, cwd: str, skip_upto: int) -> None:
    fast, slow = Validator(cwd=cwd), Validator(cwd=cwd)
    listed = _listed(batch)
    routed = fast.route(batch)
    _keyed_as_pairs(routed[0])
    _keyed_as_pairs(fast.route(listed)[0])  # (the csv module's rows: the parsed block)
    assert (as_structs(routed[0]), *routed[1:]) == slow.general(listed, route=True)
    _bounded(routed[0])
    checked = fast.validate(batch)
    general = slow.general(listed)
    assert (as_structs(checked[0]), checked[1]) == (general[0], general[2])
    _bounded(checked[0])
    encode = msgspec.json.encode
    sent = encode_requests([i for i, *_ in routed[0]], [r for *_, r in routed[0]])
    assert sent == encode([r for *_, r in general[0]])
    # A resume from inside the batch: the rows past it, as the general path takes them.
    resumed = fast.route(batch, skip_upto=skip_upto)
    _keyed_as_pairs(resumed[0])
    assert (as_structs(resumed[0]), *resumed[1:]) == slow.general(
        _listed(batch, skip_upto), route=True
    )
    _bounded(resumed[0])
    items, rejects = fast.validate(batch, skip_upto=skip_upto)
    _keyed_as_pairs(items)
    general = slow.general(_listed(batch, skip_upto))
    assert (as_structs(items), rejects) == (general[0], general[2])


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    text=manifests(),
    max_rows=st.integers(1, 12),
    read_size=st.one_of(st.integers(2, 40), st.just(1 << 20)),
    cut=st.integers(0, 1000),
)
def test_fast_paths_are_the_csv_module_and_the_general_rules(
    text: str, max_rows: int, read_size: int, cut: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest_bytes, "READ_SIZE", read_size)
        path = Path(tmp) / "m.csv"
        path.write_text(text, encoding="utf-8", newline="")
        batches = _batches(path, max_rows, SOURCE)
        assert [row for b in batches for row in b.rows] == _csv_module_rows(text)
        for batch in batches:
            if not batch.rows:
                continue
            lines = [line for line, _ in batch.rows]
            skip_upto = position(SOURCE, lines[cut % len(lines)]) - (cut % 2)
            _check_batch(batch, tmp, skip_upto)


@pytest.mark.parametrize("sep", ["\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1e"])
def test_a_header_holding_a_unicode_line_separator_is_one_line(tmp_path: Path, sep: str) -> None:
    """A header cell holding a character that ``str.splitlines`` cuts at (NEL, LINE
    SEPARATOR, a vertical tab or form feed: FileMaker writes a return in a field as ``\\x0b``)
    is one header line, as it is to the csv module: the header was cut there, its tail read
    as a row (a reject with a line the file does not have), and every row after it
    numbered one line too far, or, the cut being in a read column, every row refused for
    its field count."""
    for header in (f"id,url,no{sep}tes", f"id,url{sep},brand", f"id,url,brand{sep}"):
        text = header + "\na,https://x/a.jpg,b\n"
        p = tmp_path / "m.csv"
        p.write_text(text, encoding="utf-8", newline="")
        batches = _batches(p, 100, SOURCE)
        assert [row for b in batches for row in b.rows] == _csv_module_rows(text), header
        v = Validator()
        (batch,) = batches
        items, rejects = v.validate(batch)
        assert rejects == [] and [i[0] for i in items] == ["a"], header


@pytest.mark.parametrize("read_size", [2, 5, 17, 1 << 20])
@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_a_header_spanning_lines_is_read_whatever_the_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int, end: str
) -> None:
    """A header cell holding a line break is one header however the reads cut it (a pipe
    that delivers its first line alone), and its rows are the csv module's, numbered as it
    numbers them; a quote in a header that no quote closes leaves the header its first line,
    as before."""
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    for header in (f'id,url,"Retail{end}Price{end}(EUR)",brand', 'id,url,"brand'):
        rows = "".join(f"p{i},https://x/{i}.jpg,9,acme{end}" for i in range(5))
        text = header + end + rows
        p = tmp_path / "m.csv"
        p.write_text(text, encoding="utf-8", newline="")
        batches = _batches(p, 3, SOURCE)
        assert batches and batches[0].header[:3] == ["id", "url", header.split(",")[2].strip('"')]
        read = [row for b in batches for row in b.rows]
        if header.endswith('"brand'):  # (to the csv module, the rest of the file is its cell)
            assert read == [(i + 2, [f"p{i}", f"https://x/{i}.jpg", "9", "acme"]) for i in range(5)]
        else:
            assert read == _csv_module_rows(text)


@pytest.mark.parametrize("header", ["id,url", 'id,url,"brand'])
def test_a_header_waits_for_its_cell_a_bounded_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: str
) -> None:
    """A header whose quote no quote closes, then a line with no end (a binary blob, a dump cut
    before its first row's end): the reader reads on for the cell's close only so far (it
    held and copied the whole blob, every read), and the line is refused as too long, as
    after any header."""
    monkeypatch.setattr(manifest_bytes, "MAX_LINE_BYTES", 8 << 20)
    p = tmp_path / "m.csv"
    p.write_bytes(header.encode() + b"\n" + b"x" * (12 << 20))
    with pytest.raises(ManifestError, match="is longer than 8 MiB"):
        _batches(p, 100, SOURCE)
