"""Blocks of plain CSV lines with context columns (``id,url,brand,...``) are validated as a
whole (:func:`~fashiontag_pipeline.engine.plainblock.context_block`) exactly as row by row.

The whole-block path must give the same requests as the general path for the lines it
builds, and must leave to the general path every line that path would reject (so that the
line's reject is written with its reason) or build otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from fashiontag_pipeline.engine.plainblock import context_block
from fashiontag_pipeline.engine.plainbody import encode_requests
from fashiontag_pipeline.engine.rows import PlainRows, RowBatch
from fashiontag_pipeline.engine.validate import Validator

from .test_fast_paths import TRICKY_URLS, _batches, answer, as_structs

HEADERS = [
    "id,url,brand",
    "brand,url,id,gender",
    "url,season,id,notes,price",
    "url,id,price",
    "id,notes,url",
]


def _line(header: str, ident: str, url: str, value: str) -> str:
    """A line of ``header``: the id and URL in their columns, ``value`` in every other one."""
    cells = {"id": ident, "url": url}
    return ",".join(cells.get(name, value) for name in header.split(","))


def _layout(header: str) -> tuple[int, int, int, list[tuple[int, str]]]:
    names = header.split(",")
    extras = [(i, n) for i, n in enumerate(names) if n not in ("id", "url", "notes")]
    return len(names), names.index("id"), names.index("url"), extras


@pytest.mark.parametrize("header", HEADERS)
def test_each_bad_line_fails_its_context_block(header: str) -> None:
    """For each tricky line among good ones: the block's lines that pass row by row are built
    whole, with the same requests (encoded alike), and the others are left to the general
    path, whose rejects and requests the validator returns; lines whose commas add up to the
    header's count over two lines (one short, one long) are both left to it."""
    width, i_id, i_url, extras = _layout(header)
    good = [_line(header, f"g{i}", f"https://img.example/{i}.jpg", f"v{i}") for i in range(5)]
    urls = [u for u in TRICKY_URLS if "\n" not in u and "," not in u]
    urls += ["https://h/a\x1cb", "https://h/a\x85b", "https://h/a\u3000b"]
    ids = ["x", " spaced ", "a\tb", "", "\u00e9t\u00e9", "a\x1cb"]
    values = ["", " ", "a b", "x|y", "\u00e9t\u00e9", "0"]
    odd = [_line(header, i, u, v) for i in ids for u in urls for v in values[:2]]
    odd += [_line(header, "id", "https://h/x", v) for v in values]
    odd += [good[0] + ",", good[0].rsplit(",", 1)[0], "", ","]
    pairs = [[good[0] + ",x", good[1].split(",", 1)[1]], [good[0][:-1] + ",", "a,b"]]
    blocks = [[*good[:2], o, *good[2:]] for o in odd] + [[*good, *p] for p in pairs]
    # A line with a bad URL before one with a field too many: their rejects in line order.
    blocks.append([*good[:2], _line(header, "u", "ftp://h/x", "v"), good[2], good[3] + ",x"])
    v = Validator()
    encode = msgspec.json.encode
    whole_blocks = 0
    for lines in blocks:
        plain = PlainRows(2, lines)
        listed = RowBatch(0, "m.csv", "csv", header.split(","), list(plain))
        items, _, rejects = v.general(listed)
        # The validator's answer for the block is the general path's, row for row, whether
        # its rows come as plain lines or parsed (the csv module's, for a quoted manifest).
        assert answer(v.validate(RowBatch(0, "m.csv", "csv", header.split(","), plain))) == (
            items,
            rejects,
        ), lines
        assert answer(v.validate(listed)) == (items, rejects), lines
        built, rest = context_block(plain, width, i_id, i_url, extras, 0)
        left = {pos for pos, _ in rejects}
        assert {2 + k for k in rest} >= left, lines  # every refused line is left to it
        if not rest:
            assert as_structs(built) == items, lines
            sent = encode_requests([i for i, *_ in built], [r for *_, r in built])
            assert sent == encode([r for *_, r in items]), lines
            whole_blocks += 1
        else:  # the others are built whole, as the general path builds them
            assert {2 + k for k in rest} <= {4, 6, 7, 8}, lines  # (the odd line(s), the pair)
            assert as_structs(built) == [item for item in items if item[1] - 2 not in rest], lines
            assert all(
                "HTTPS://" in lines[k] or "Http://" in lines[k] or 2 + k in left for k in rest
            ), lines
    assert whole_blocks > 20  # good URLs with odd but valid ids and values pass whole


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("route", [False, True])
def test_context_manifests_validate_like_row_by_row(
    tmp_path: Path, header: str, route: bool
) -> None:
    """A manifest with context columns read in blocks: the items and rejects of each batch
    are those of the same rows checked one by one, and its good blocks did pass whole."""
    good = [_line(header, f"g{i}", f"https://img.example/{i}.jpg", f"v{i % 3}") for i in range(300)]
    empty = [_line(header, f"e{i}", f"https://img.example/e{i}.jpg", "") for i in range(50)]
    bad = [_line(header, "", "https://h/x", "v"), _line(header, "b", "ftp://h/x", "v")]
    bad += [_line(header, "s", "relative/path.jpg", "v"), _line(header, "t", "https://h/a b", "")]
    p = tmp_path / "m.csv"
    p.write_text(header + "\n" + "\n".join(good + empty + bad + good[:40]) + "\n")
    batches = _batches(p, max_rows=100)
    assert all(isinstance(b.rows, PlainRows) for b in batches)
    v = Validator(cwd=str(tmp_path))
    fast: list[Any] = []
    parsed: list[Any] = []
    slow: list[Any] = []
    for b in batches:
        listed = RowBatch(b.source, b.name, b.kind, b.header, list(b.rows))
        if route:
            fast.append(answer(v.route(b)))
            parsed.append(answer(v.route(listed)))
            slow.append(v.general(listed, route=True))
        else:
            fast.append(answer(v.validate(b)))
            parsed.append(answer(v.validate(listed)))
            items, _, rejects = v.general(listed)
            slow.append((items, rejects))
    assert fast == slow and parsed == slow
    assert sum(len(f[0]) for f in fast) == 300 + 50 + 40
    assert sum(len(f[-1]) for f in fast) == (3 if route else 4)  # (a local path: single mode)
    first = batches[0].rows
    assert isinstance(first, PlainRows)
    assert context_block(first, *_layout(header), 0)[1] == []  # passed whole
    # An empty cell is no value: the request leaves the field out, as the general path does.
    (empty_item,) = [item for f in fast for item in f[0] if item[0] == "e0"]
    assert msgspec.json.decode(msgspec.json.encode(empty_item[2].context)) == {"id": "e0"}
