"""Differential test of the JSONL reading and validation fast paths against their references.

Generated JSONL manifests: objects with the read keys in any case and spelling (``ID``,
``Brand``, a key escaped as ``\\u0069d``, the Kelvin sign that lower-cases to ``k``, both
spellings of the product name, a key twice), unknown keys, ``image``, ``context``,
``detection`` and ``age`` keys, values of every JSON type (ids as numbers, nested objects,
lists, null, empty and odd strings, every kind of image; numbers as ids and context values,
written as a database exports them, ``-0``, ``1e3``, ``19.90`` among them), and lines that
are no object (not JSON, an array, a number, blank, CRLF ends) are read in pieces cut anywhere
(a tiny ``READ_SIZE``) and in batches of any size:

* the rows read are each line decoded on its own, as the row by row reading does;
* each batch's :meth:`Validator.route` and :meth:`Validator.validate` (the block path over a
  :class:`~.rows.JsonRows` block) give exactly :meth:`Validator.general` (every row through
  the full rules): the same items in the same order, the same rejects (reasons, lines), the
  same requests byte for byte, also for a resume that starts inside the batch;
* a :class:`~.policy.Measured` batch's size is at least the text size of its requests.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fashiontag_pipeline.engine import manifest_bytes
from fashiontag_pipeline.engine.rows import JsonRows
from fashiontag_pipeline.engine.state import position
from fashiontag_pipeline.engine.validate import Validator

from .test_fast_paths import _batches
from .test_fast_paths_differential import IMAGES, ODD_CELLS, _check_batch, _listed

SOURCE = 3
CONTEXT = [
    "gender",
    "brand",
    "currency",
    "price",
    "keywords",
    "productContentName",
    "product_content_name",
    "season",
]
#: Keys as written: the read keys, their other spellings (each read as the key or a clash),
#: keys no rule reads.
KEYS = st.one_of(
    st.sampled_from(["id", "url", *CONTEXT] * 3),
    st.sampled_from(["image", "context", "detection", "age"]),
    st.sampled_from(["ID", "Url", "URL", "Brand", "SEASON", "productcontentname", "Id"]),
    st.sampled_from(["\\u0069d", "\\u0049D", "\\u212aeywords", "\u212aeywords", "br\\u0061nd"]),
    st.sampled_from(["notes", "sku", "", "id ", "x\u2028y", "\u00e9"]),
)
good_ids = st.integers(0, 40).map(lambda i: f"g{i}")
good_urls = st.integers(0, 40).map(lambda i: f"https://img.example/{i}.jpg")
texts = st.one_of(
    st.just(""), st.sampled_from(["m", "EUR", "k\u014db\u014d", "a b"]), st.sampled_from(ODD_CELLS)
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(allow_nan=False), texts
)
values = st.one_of(
    *[texts] * 4,
    scalars,
    st.lists(st.one_of(texts, st.integers(0, 3)), max_size=2),
    st.dictionaries(st.sampled_from(["id", "url", "brand", "type", "content"]), texts, max_size=2),
)


class Raw(str):
    """A value written as it is (a number literal json.dumps never writes)."""


#: Numbers, as a database's JSON export writes them (and literals it might).
numbers = st.one_of(
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["-0", "1e3", "1.0", "19.90", "-0.0", "0", "1E2", "-0 ", "123456789" * 9]).map(
        Raw
    ),
)
images = st.fixed_dictionaries(
    {"type": st.sampled_from(["url", "base64", "URL", 3]), "content": st.sampled_from(IMAGES)}
)


@st.composite
def objects(draw: st.DrawFn) -> str:
    """One JSON object as written (so that a key may be given twice or escaped)."""
    keys = ["id", "url"] if draw(st.integers(0, 3)) else []
    keys += draw(st.lists(st.sampled_from(CONTEXT), unique=True, max_size=3))
    keys += draw(st.lists(KEYS, max_size=2))
    keys = draw(st.permutations(keys))
    members = []
    for key in keys:
        name = key.lower()
        if name == "id":
            value: Any = draw(st.one_of(*[good_ids] * 6, numbers, values))
        elif name == "url":
            value = draw(st.one_of(*[good_urls] * 6, st.sampled_from(IMAGES), values))
        elif name == "image":
            value = draw(st.one_of(images, values))
        elif name == "context":
            value = draw(
                st.one_of(
                    st.dictionaries(st.sampled_from(["id", "brand", "Brand", "age"]), texts),
                    values,
                )
            )
        elif name == "detection":
            value = draw(st.one_of(st.sampled_from(["TOP", "top|hat", ["TOP"], ["nope"]]), values))
        elif key in CONTEXT or name == "age":
            value = draw(st.one_of(*[texts] * 4, numbers, values, st.lists(numbers, max_size=2)))
        else:
            value = draw(values)
        written = json.dumps(key) if "\\u" not in key else f'"{key}"'
        dumped = (
            value if isinstance(value, Raw) else json.dumps(value, ensure_ascii=draw(st.booleans()))
        )
        members.append(f"{written}: {dumped}")
    sep = draw(st.sampled_from([", ", ","]))
    return "{" + sep.join(members) + "}"


lines = st.one_of(
    *[objects()] * 8,
    st.sampled_from(
        ["", " ", "\u3000", "nope", '{"id": "a"', "[1, 2]", "3", '"x"', "null", '{"id": "a"} x']
    ),
    st.sampled_from(['{"id":"a","url":"https://h/1","id":"b"}', '{"id": "a"},{"id": "b"}']),
)


@st.composite
def manifests(draw: st.DrawFn) -> str:
    first = draw(objects())
    body = draw(st.lists(lines, max_size=40))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = "".join(line + end for line in [first, *body])
    if draw(st.booleans()):
        text = text.rstrip("\r\n")  # no last line end
    return text


def _decoded_lines(text: str) -> list[tuple[int, Any]]:
    """Each non-blank line decoded on its own (the row by row reading)."""
    out: list[tuple[int, Any]] = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((n, msgspec.json.decode(line)))
        except msgspec.DecodeError as err:
            out.append((n, f"not valid JSON: {err}"))
    return out


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    text=manifests(),
    max_rows=st.one_of(st.integers(1, 12), st.just(2000)),
    read_size=st.one_of(st.integers(2, 60), st.just(1 << 20)),
    cut=st.integers(0, 1000),
)
def test_jsonl_fast_paths_are_the_line_decoder_and_the_general_rules(
    text: str, max_rows: int, read_size: int, cut: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest_bytes, "READ_SIZE", read_size)
        path = Path(tmp) / "m.jsonl"
        path.write_text(text, encoding="utf-8", newline="")
        batches = _batches(path, max_rows, SOURCE)
        assert [row for b in batches for row in b.rows] == _decoded_lines(text)
        for batch in batches:
            if not batch.rows:
                continue
            numbers = [line for line, _ in batch.rows]
            skip_upto = position(SOURCE, numbers[cut % len(numbers)]) - (cut % 2)
            _check_batch(batch, tmp, skip_upto)


def test_a_catalogue_export_takes_the_block_path(tmp_path: Path) -> None:
    """The rows of an export (the same keys in every row, one no rule reads) come as one
    decoded block, and their block gives the general path's items and rejects."""
    rows = [
        {"id": f"s{i}", "url": f"https://h/{i}.jpg", "brand": "acme", "season": "", "notes": i}
        for i in range(50)
    ]
    rows[7]["id"] = 7.0  # a float: its reject says why
    rows[9]["url"] = "HTTPS://h/9.jpg"  # (sent lower-cased, by the general rules)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (batch,) = _batches(path, 2000, SOURCE)
    assert isinstance(batch.rows, JsonRows)
    listed = _listed(batch)
    items, singles, rejects = Validator().route(batch)
    assert (items, singles, rejects) == Validator().general(listed, route=True)
    assert len(items) == 49 and [r.line for _, r in rejects] == [8]
    assert items[8][2].image.content == "https://h/9.jpg"
    assert items[0][2].context.brand == "acme" and items[0][2].context.season is None


@pytest.mark.parametrize("bad", [[], False, 0, None, ""])
def test_rows_spelling_the_product_name_each_way(tmp_path: Path, bad: Any) -> None:
    """Rows of two key orders, one writing productContentName and one product_content_name
    (two exports appended), each row its product name: a value that is no string is the
    reject of its row only, whichever spelling it has."""
    rows: list[dict[str, Any]] = []
    for i in range(12):
        key = "productContentName" if i % 2 else "product_content_name"
        rows.append({"id": f"s{i}", "url": f"https://h/{i}.jpg", key: f"name {i}"})
    rows[3]["productContentName"] = bad
    rows[4]["product_content_name"] = bad
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (batch,) = _batches(path, 2000, SOURCE)
    assert isinstance(batch.rows, JsonRows)
    listed = _listed(batch)
    routed = Validator().route(batch)
    assert routed == Validator().general(listed, route=True)
    names = {i: r.context.product_content_name for i, _, r in routed[0]}
    assert names["s0"] == "name 0" and names["s1"] == "name 1"
    if isinstance(bad, str) or bad is None:
        assert names["s3"] is None and names["s4"] is None
    elif type(bad) is int:  # (a number: its text)
        assert names["s3"] == "0" and names["s4"] == "0"
    else:
        assert [r.line for _, r in routed[2]] == [4, 5]
