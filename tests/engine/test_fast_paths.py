"""The per-row fast paths of source and validation give exactly what the general paths give.

CSV chunks with no quote, CR or NUL are split at commas instead of going through the csv
module; ``id,url`` rows are accepted with one regex match instead of the full rule set. Both
must agree with the general path on every row, accepted or rejected.
"""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.engine import manifest_bytes, plainblock
from fashiontag_pipeline.engine.plainbody import request_of
from fashiontag_pipeline.engine.rows import PlainChunk, PlainRows, RowBatch
from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest
from fashiontag_pipeline.engine.validate import Validator

TRICKY_URLS = [
    "https://img.example/a.jpg",
    "http://h",
    "http://h?x=1",
    "https://h:8443/p/q?r#f",
    "https://user@h/x",
    "https://",
    "http://",
    "https:///x",
    "https://?q",
    "https://h/a b",
    "https://h/a\tb",
    "https://h/a\u2003b",
    "https://h/a\u00a0b",
    "https://h/\u00e9t\u00e9.jpg",
    "https://h/x ",
    " https://h/x",
    "HTTPS://h/x",
    "Http://h/x",
    "ftp://h/x",
    "https:/h/x",
    "https//h/x",
    "httpx://h/x",
    "mailto:x@y",
    "data:image/png;base64,AAAA",
    "relative/path.jpg",
    "",
]


def _rows(path: Path) -> list[tuple[int, object]]:
    reader = open_manifest(str(path), 0)
    try:
        return list(iter_rows_sync(reader))
    finally:
        reader.close()


def _csv_module_rows(text: str) -> list[tuple[int, list[str]]]:
    """What the csv module makes of ``text`` (header dropped), with line numbers; as the
    README has it, empty names at the header's end (``id,url,``) are no columns: a row's
    cells under them are dropped."""
    reader = csv.reader(io.StringIO(text, newline=""))
    out: list[tuple[int, list[str]]] = []
    line = 0
    header: list[str] = []
    for fields in reader:
        start, line = line, reader.line_num
        if start == 0:
            header = fields
        elif fields:
            out.append((start + 1, fields))
    named = len(header)
    while named > 2 and not header[named - 1].strip():
        named -= 1
    return [(n, f[:named] if named < len(f) <= len(header) else f) for n, f in out]


@pytest.mark.parametrize("read_size", [7, 64, 1 << 20])
def test_csv_split_at_commas_is_the_csv_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    body = [
        "a,https://x/a.jpg",
        "",
        "b,https://x/b.jpg,extra",
        "c",
        ",",
        "d,https://x/\u00e9.jpg",
        "",
        "",
        "e,https://x/e.jpg,,",
    ]
    body += [f"p{i},https://x/{i}.jpg" for i in range(300)]
    text = "id,url\n" + "\n".join(body) + "\n"
    p = tmp_path / "m.csv"
    p.write_text(text)
    assert _rows(p) == _csv_module_rows(text)


@pytest.mark.parametrize("read_size", [7, 64, 1 << 20])
def test_crlf_lines_split_at_commas_are_the_csv_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    """A manifest with Windows line ends (what a spreadsheet exports) and no quote takes the
    split at commas too (it went through the csv module, and every row through the general
    rules); a CR anywhere else still sends its chunk to the csv module."""
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    body = ["a,https://x/a.jpg", "", "b,https://x/b.jpg,extra", "c", ","]
    body += [f"p{i},https://x/{i}.jpg" for i in range(300)]
    text = "id,url\r\n" + "\r\n".join(body) + "\r\n"
    p = tmp_path / "m.csv"
    p.write_text(text, newline="")
    assert _rows(p) == _csv_module_rows(text)
    assert any(isinstance(b.rows, PlainRows) for b in _batches(p, max_rows=100))
    for odd in ("q,https://x/q\r.jpg\r\n", "q,https://x/q.jpg\r", "q,https://x/q.jpg\n"):
        p.write_text(text + odd + "z,https://x/z.jpg\r\n", newline="")
        assert _rows(p) == _csv_module_rows(text + odd + "z,https://x/z.jpg\r\n"), odd


def test_chunks_with_quotes_or_crs_still_use_the_csv_module(tmp_path: Path) -> None:
    text = 'id,url\r\na,"https://x/a,b.jpg"\r\nb,https://x/b.jpg\r\n'
    p = tmp_path / "m.csv"
    p.write_text(text, newline="")
    assert _rows(p) == [(2, ["a", "https://x/a,b.jpg"]), (3, ["b", "https://x/b.jpg"])]


@pytest.mark.parametrize("read_size", [256, 4096, 1 << 20])
def test_two_column_chunks_split_at_once_then_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    """A chunk of a two-column manifest is split at commas and newlines at once, a block taken
    as its cells when they make its lines two by two. Lines of one field and of four
    (cells that add up to two a line, so that the chunk's split alone cannot tell), a blank
    line or a line of three fields end that in the block they are in (past blocks that were
    pairs): the rest of the chunk is read line by line, with the same rows and line numbers
    as the csv module's, in this chunk and the next ones."""
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    good = [f"p{i},https://x/{i}.jpg" for i in range(120)]
    odd = [["c", "a,https://x/a.jpg,b"], ["a,b,c,d", "e", "f"], ["", "x,https://x/x.jpg,y"]]
    odd += [["a,b,c", "d,https://x/d.jpg,f"]]  # (cells for more lines than there are)
    odd += [["b,https://x/b.jpg,extra"], [""]]  # (cells in odd number: a chunk of lines)
    for lines in odd:
        text = "id,url\n" + "\n".join(good[:45] + lines + good[45:]) + "\n"
        p = tmp_path / "m.csv"
        p.write_text(text)
        assert _rows(p) == _csv_module_rows(text), lines
        batches = _batches(p, max_rows=10)
        rows = [row for b in batches for row in b.rows]
        assert rows == _csv_module_rows(text), lines
        cells = [getattr(b.rows, "cells", None) is not None for b in batches]
        assert any(cells) or len(lines) == 1, lines
        assert Validator().route(batches[-1])[2] == []  # (the last rows are good)
    # A chunk without its last line end (the input's last) is read line by line.
    p.write_text("id,url\n" + "\n".join(good))
    assert _rows(p) == _csv_module_rows("id,url\n" + "\n".join(good))


@pytest.mark.parametrize("route", [False, True])
def test_plain_rows_validate_like_the_general_path(tmp_path: Path, route: bool) -> None:
    ids = ["", "x"] + [f"id{i}" for i in range(len(TRICKY_URLS))]
    rows: list[tuple[int, object]] = []
    line = 2
    for ident in ids:
        for url in TRICKY_URLS:
            rows.append((line, [ident, url]))
            line += 1
    rows += [(line, "not a valid CSV row: x"), (line + 1, ["only-id"]), (line + 2, ["a", "b", "c"])]
    plain = RowBatch(0, "m.csv", "csv", ["id", "url"], rows)
    # The same rows with an empty optional column, every one through the general path: the
    # same requests (empty context values are left out).
    general = RowBatch(
        0,
        "m.csv",
        "csv",
        ["id", "url", "gender"],
        [(n, [*f, ""] if isinstance(f, list) else f) for n, f in rows],
    )
    v = Validator(cwd=str(tmp_path))
    fast = v.route(plain) if route else (*v.validate(plain)[:1], [], v.validate(plain)[1])
    slow = v.general(general, route=route)
    assert as_structs(fast[0]) == slow[0]  # accepted items
    assert fast[1] == slow[1]  # single-mode items

    # Same rejects with the same reasons; only the field-count message names the header width.
    def same(reason: str) -> str:
        return "field count" if reason.startswith("row has ") else reason

    assert [(p, r.id, r.line, same(r.reason)) for p, r in fast[2]] == [
        (p, r.id, r.line, same(r.reason)) for p, r in slow[2]
    ]
    assert len(fast[2]) > 10
    accepted = {item[2].image.content for item in as_structs(v.validate(plain)[0])}
    assert accepted == {
        "https://img.example/a.jpg",
        "http://h",
        "http://h?x=1",
        "https://h:8443/p/q?r#f",
        "https://user@h/x",
        "https://h/\u00e9t\u00e9.jpg",
        "https://h/x",  # HTTPS://h/x: a scheme in capitals is sent lower-cased
        "http://h/x",  # Http://h/x
    }


def answer(got: tuple[Any, ...]) -> tuple[Any, ...]:
    """A validator's answer (items first) with each item's request a struct."""
    return (as_structs(got[0]), *got[1:])


def as_structs(items: list[Any]) -> list[Any]:
    """``items`` with each request a struct: a plain row's URL (:mod:`.plainbody`, the fast
    path's) as the request it stands for (its bytes: tests/engine/test_plain_bodies.py)."""
    return [(ident, pos, request_of(ident, request)) for ident, pos, request in items]


def _blocks(lines: list[str]) -> list[PlainRows]:
    """The block of ``lines`` as the validator gets it: as its lines, and, when each line is
    two cells, as the source's split of a two-column manifest's chunk (its cells and text)."""
    blocks = [PlainRows(2, lines)]
    taken = PlainChunk("".join(line + "\n" for line in lines), True).take(2, len(lines))
    if isinstance(taken, PlainRows) and taken.cells is not None:
        assert list(taken) == list(blocks[0]) and len(taken) == len(lines)
        assert taken[-1] == blocks[0][-1] and taken.lines == lines
        blocks.append(taken)
    return blocks


def _batches(path: Path | str, max_rows: int = 2000, source: int = 0) -> list[RowBatch]:
    """The batches of the manifest ``path`` (its manifest number ``source``)."""
    reader = open_manifest(str(path), source, max_rows)
    try:
        out = []
        while (batch := reader.read_batch()) is not None:
            out.append(batch)
        return out
    finally:
        reader.close()


@pytest.mark.parametrize("header", ["id,url", "url,id"])
@pytest.mark.parametrize("route", [False, True])
def test_plain_blocks_validate_like_row_by_row(tmp_path: Path, header: str, route: bool) -> None:
    """Blocks of plain lines (checked with C-level passes over the block) give the same items and
    rejects as the same rows checked one by one, whether the block passes whole or not."""
    urls = [u for u in TRICKY_URLS if "," not in u and "\n" not in u]
    ids = ["x", " spaced id ", "\u00e9t\u00e9", "a\tb"] + [f"id{i}" for i in range(40)]
    lines: list[str] = []
    for ident in ["", *ids]:
        for url in urls:
            lines.append(f"{ident},{url}" if header == "id,url" else f"{url},{ident}")
    # Blocks that pass whole (only good rows), then the tricky rows, then good ones again.
    good = [f"g{i},https://img.example/{i}.jpg" for i in range(300)]
    if header == "url,id":
        good = [",".join(reversed(g.split(","))) for g in good]
    p = tmp_path / "m.csv"
    p.write_text(header + "\n" + "\n".join(good + lines + good[:50]) + "\n")
    batches = _batches(p, max_rows=100)
    assert all(isinstance(b.rows, PlainRows) for b in batches)
    v = Validator(cwd=str(tmp_path))
    fast_items: list[object] = []
    slow_items: list[object] = []
    fast_rejects: list[object] = []
    slow_rejects: list[object] = []
    for b in batches:
        listed = RowBatch(b.source, b.name, b.kind, b.header, list(b.rows))
        if route:
            fi, fs, fr = v.route(b)
            si, ss, sr = v.general(listed, route=True)
            assert fs == ss
        else:
            fi, fr = v.validate(b)
            si, _, sr = v.general(listed)
        fast_items += as_structs(fi)
        slow_items += si
        fast_rejects += fr
        slow_rejects += sr
    assert fast_items == slow_items
    assert fast_rejects == slow_rejects
    assert len(fast_items) > 350 and len(fast_rejects) > 10
    # The good blocks did pass whole.
    first = batches[0].rows
    assert isinstance(first, PlainRows)
    assert Validator._plain_block(first, header.split(",").index("id"), 0) is not None


def test_plain_rows_are_the_rows(tmp_path: Path) -> None:
    """A block of plain lines reads like the list of rows it stands for."""
    p = tmp_path / "m.csv"
    p.write_text("id,url\n" + "".join(f"i{i},https://x/{i}.jpg\n" for i in range(10)))
    (batch,) = _batches(p)
    rows = batch.rows
    assert isinstance(rows, PlainRows)
    listed = [(i + 2, [f"i{i}", f"https://x/{i}.jpg"]) for i in range(10)]
    assert len(rows) == 10 and list(rows) == listed and rows == listed
    assert rows[0] == listed[0] and rows[-1] == listed[-1] and rows[2:4] == listed[2:4]
    with pytest.raises(IndexError):
        rows[10]


@pytest.mark.parametrize("header", ["id,url", "url,id"])
def test_each_bad_line_fails_its_block(header: str) -> None:
    """The block check splits its work (commas counted in the block and found in each line, a
    regex search for the URLs' heads, one whitespace test over all URLs): a block passes whole
    exactly when every one of its lines passes row by row, for each tricky line alone among
    good ones, and for pairs of lines whose commas add up to one per line."""
    i_id = header.split(",").index("id")

    def line(ident: str, url: str) -> str:
        return f"{ident},{url}" if i_id == 0 else f"{url},{ident}"

    good = [line(f"g{i}", f"https://img.example/{i}.jpg") for i in range(5)]
    urls = [u for u in TRICKY_URLS if "\n" not in u]
    urls += ["https://h/a,b", "https://h/a\x1cb", "https://h/a\x85b", "https://h/a\u3000b"]
    ids = ["x", " spaced ", "a\tb", "", "\u00e9t\u00e9", "a\x1cb"]
    odd = [line(i, u) for i in ids for u in urls]
    odd += ["g", "https://h/x", "a,b,https://h/x", "https://h/x,a,b", ",", ",,"]
    # Commas that add up: a line without one next to a line with two.
    pairs = [["nocomma", line("a", "https://h/x,y")], ["https://h/x", "a,https://h/y,z"]]
    # ... and one whose every comma is followed by a URL (the cells would still alternate).
    pairs.append(["https://h/z" if i_id else "nocomma", line("a", "https://h/x,https://h/y")])
    blocks = [[*good[:2], o, *good[2:]] for o in odd] + [[*good, *p] for p in pairs]
    v = Validator()
    passed = 0
    cells = 0
    for lines in blocks:
        listed = RowBatch(0, "m.csv", "csv", header.split(","), list(PlainRows(2, lines)))
        items, _, rejects = v.general(listed)
        parsed, parsed_rejects = v.validate(listed)  # (rows the csv module parsed)
        assert (as_structs(parsed), parsed_rejects) == (items, rejects), lines
        sizes = set()
        for plain in _blocks(lines):  # (as lines, and as the source's cells)
            cells += plain.cells is not None
            whole = Validator._plain_block(plain, i_id, 0)
            if rejects:
                assert whole is None, lines
            elif whole is None:  # left to the row-by-row path: a scheme in capitals
                assert "HTTPS://" in lines[2] or "Http://" in lines[2], lines
            else:
                assert as_structs(whole) == items, lines
                sizes.add(whole.size)
                passed += 1
        assert len(sizes) <= 1, lines  # (the same size: the same chunks)
    assert passed > 20 and cells > 50  # good URLs with odd but valid ids pass whole


@pytest.mark.parametrize("header", ["id,url", "url,id"])
def test_random_plain_blocks_pass_whole_exactly_when_every_row_does(header: str) -> None:
    """Blocks of random lines built from the characters the block check looks at (commas,
    scheme parts, host characters it refuses, whitespace, NUL): the block passes whole
    exactly when the rows checked one by one all pass (or is left to them for a scheme in
    capitals, which the general path lower-cases, a NUL, or a line holding two URLs), with the
    same items."""
    rng = random.Random(11)
    parts = ["https://", "http://", "h", "/", "?", " ", "\t", "\x00", "a", "HTTP://", ":", ""]
    i_id = header.split(",").index("id")
    good = [f"g{i},https://h/{i}" if i_id == 0 else f"https://h/{i},g{i}" for i in range(3)]
    v = Validator()
    passed = 0
    for _ in range(3000):
        lines = list(good)
        for _ in range(rng.randint(1, 3)):
            cells = ["".join(rng.choices(parts, k=rng.randint(0, 3))) for _ in range(3)]
            lines.insert(rng.randint(0, len(lines)), ",".join(cells[: rng.randint(1, 3)]))
        lines = [line for line in lines if line]  # (a plain block has no blank line)
        listed = RowBatch(0, "m.csv", "csv", header.split(","), list(PlainRows(2, lines)))
        items, _, rejects = v.general(listed)
        for plain in _blocks(lines):  # (as lines, and as the source's cells)
            whole = Validator._plain_block(plain, i_id, 0)
            if rejects:
                assert whole is None, lines
            elif whole is None:  # (or a NUL, or a line holding two URLs: left to the rows)
                odd = ("HTTP://" in s or "\x00" in s or s.count("://") > 1 for s in lines)
                assert any(odd), lines
            else:
                assert as_structs(whole) == items, lines
                passed += 1
    assert passed > 200


def test_whitespace_fast_path_and_its_fallback_agree() -> None:
    """The block's whitespace test: an ASCII block without any ASCII whitespace (a memchr pass
    a character) has none in its URLs; any other block (an id with a space or a tab, non-ASCII
    text) is decided by splitting its URLs. Each whitespace character, in an id or in a URL, in
    an ASCII or a non-ASCII block: the fast path, its fallback and the row-by-row path agree."""
    assert {chr(c) for c in range(128) if chr(c).isspace()} == {*plainblock._ASCII_SPACES, "\n"}
    spaces = [c for c in map(chr, range(0x3001)) if c.isspace() and c != "\n"]
    v = Validator()
    for space in ["", *spaces]:
        for ident, url in [(f"a{space}b", "https://h/x"), ("ab", f"https://h/x{space}y")]:
            for other in ["g", "\u00e9"]:  # (an ASCII block or not)
                lines = [f"{other},https://h/1", f"{ident},{url}", "z,https://h/2"]
                body = "\n".join(lines)
                urls = body.replace(",", "\n").split("\n")[1::2]
                joined = "".join(urls)
                assert plainblock._spaced(body, urls) == (joined.split(None, 1) != [joined])
                batch = RowBatch(0, "m.csv", "csv", ["id", "url"], list(PlainRows(2, lines)))
                items, _, rejects = v.general(batch)
                for plain in _blocks(lines):  # (as lines, and as the source's cells)
                    whole = Validator._plain_block(plain, 0, 0)
                    assert (whole is None) == bool(rejects), (space, ident, url)
                    if whole is not None:
                        assert as_structs(whole) == items


@pytest.mark.parametrize("where", [0, 3, 6])
def test_a_block_with_an_id_no_store_keys_is_left_to_row_checks(where: int) -> None:
    """The block check's longest-id test (``len(max(ids, key=len))``) takes a block whose ids
    a store keys, however long, and leaves one holding an id none does (over MAX_ID_BYTES in
    UTF-8) to the row-by-row check, wherever the id is in the block and in either form of
    it: the same as the ``max(map(len, ids))`` it replaced, inlined here."""
    from fashiontag_pipeline.engine.rules import MAX_ID_SAFE_CHARS, unkeyable

    for long_id in (
        "a" * MAX_ID_SAFE_CHARS,
        "b" * (MAX_ID_SAFE_CHARS + 1),  # (longer than safe, keyable: taken)
        "c" * 2048,
        "d" * 2049,
        "\U0001f600" * 600,  # 600 characters, 2,400 bytes
    ):
        ids = [f"i{i}" for i in range(7)]
        ids[where] = long_id
        lines = [f"{ident},https://x.example/{i}.jpg" for i, ident in enumerate(ids)]
        old = max(map(len, ids)) > MAX_ID_SAFE_CHARS and any(map(unkeyable, ids))
        for block in _blocks(lines):
            got = plainblock.plain_block(block, 0, 0)
            assert (got is None) == old == unkeyable(long_id)
