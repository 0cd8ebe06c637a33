"""JSONL manifests exported from a database (PostgreSQL ``row_to_json``, Snowflake ``COPY INTO
... TYPE=JSON``, pandas ``to_json(orient="records", lines=True)``) write numeric columns as JSON
numbers: an integer id is its decimal text, a number in a context field its text; a float or
``-0`` as an id, a boolean anywhere, stay rejects. The block path and the row by row rules
agree; a ``row_to_json`` dump runs through ``fashiontag run``, killed and resumed, every row
tagged once under its id as text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.engine.jsonnums import minus_zero
from fashiontag_pipeline.engine.rows import JsonRows
from fashiontag_pipeline.engine.validate import Validator
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, kill_when, read_outcomes, run_args
from .test_fast_paths import _batches
from .test_fast_paths_differential import _listed

BIG = 123456789012345678901234567890123456789


def _route(path: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """The block path's items, singles and rejects of ``path`` (one batch), checked against
    the row by row rules."""
    (batch,) = _batches(path, 2000, 0)
    routed = Validator().route(batch)
    assert routed == Validator().general(_listed(batch), route=True)
    return routed


def test_numbers_as_ids_and_context_values(tmp_path: Path) -> None:
    lines = [
        '{"id": 12345, "url": "https://h/1.jpg", "price": 19.99, "brand": "Acme"}',
        f'{{"id": {BIG}, "url": "https://h/2.jpg", "price": 19.90, "season": 2024}}',
        '{"id": -0, "url": "https://h/3.jpg"}',
        '{"id": 1e3, "url": "https://h/4.jpg"}',
        '{"id": 1.0, "url": "https://h/5.jpg"}',
        '{"id": true, "url": "https://h/6.jpg"}',
        '{"id": null, "url": "https://h/7.jpg"}',
        '{"id": "12345", "url": "https://h/8.jpg"}',
        '{"id": 7, "url": "https://h/9.jpg", "brand": false}',
        '{"id": 8, "url": "https://h/10.jpg", "gender": [1]}',
        '{"id": 9, "url": "https://h/11.jpg", "age": 30, "keywords": "a -0, b"}',
        '{"id": 10, "url": "https://h/12.jpg", "age": [20, "30s"], "price": 0}',
        '{"id": "s", "url": "https://h/13.jpg", "brand": "x"}',
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    items, singles, rejects = _route(path)
    assert not singles
    assert [i for i, _, _ in items] == ["12345", str(BIG), "12345", "9", "10", "s"]
    got = {ident: request.context for ident, _, request in reversed(items)}
    assert got["12345"].price == "19.99" and got["12345"].brand == "Acme"
    assert got[str(BIG)].price == "19.9" and got[str(BIG)].season == "2024"
    assert got["9"].age == ["30"] and got["9"].keywords == "a -0, b"
    assert got["10"].age == ["20", "30s"] and got["10"].price == "0"
    reasons = {r.line: (r.id, r.reason) for _, r in rejects}
    for line in (3, 4, 5):
        assert reasons[line][0] is None
        assert reasons[line][1].startswith("id must be a string or an integer, not the number")
    assert "-0" in reasons[3][1] and "1000.0" in reasons[4][1]
    assert reasons[6] == (None, "id must be a string or an integer")
    assert reasons[7] == (None, "id is missing")
    assert reasons[9] == ("7", "brand must be a string or a number")
    assert reasons[10] == ("8", "gender must be a string or a number")
    # (the duplicate of 12345 is found later, by the run: see the end-to-end test)
    assert sorted(reasons) == [3, 4, 5, 6, 7, 9, 10]


def test_an_all_number_export_is_built_as_a_block(tmp_path: Path) -> None:
    """A ``row_to_json`` dump (every row's id and price numbers) gives the row by row rules'
    items, in line order, with a bad row among them its reject only."""
    rows: list[dict[str, Any]] = [
        {"id": 1000 + i, "url": f"https://h/{i}.jpg", "price": i / 4, "brand": "acme"}
        for i in range(60)
    ]
    rows[5]["id"] = 5.5
    rows[6]["price"] = True
    rows[7]["id"] = "HUGE"  # (2,000 digits: kept exact)
    text = "".join(json.dumps(r) + "\n" for r in rows).replace('"HUGE"', "1" + "0" * 2000)
    path = tmp_path / "m.jsonl"
    path.write_text(text, encoding="utf-8")
    (batch,) = _batches(path, 2000, 0)
    assert isinstance(batch.rows, JsonRows)
    items, _, rejects = _route(path)
    ids = [i for i, _, _ in items]
    assert ids[:7] == ["1000", "1001", "1002", "1003", "1004", "1" + "0" * 2000, "1008"]
    assert items[1][2].context.price == "0.25" and items[0][2].context.price == "0.0"
    assert [r.line for _, r in rejects] == [6, 7]


def test_a_context_object_repeating_the_id_as_text(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"id": 5, "url": "https://h/1.jpg", "context": {"id": "5", "price": 2}}\n'
        '{"id": 6, "url": "https://h/2.jpg", "price": 3, "context": {"price": "3"}}\n'
    )
    items, _, rejects = _route(path)
    assert not rejects
    assert [(i, r.context.price) for i, _, r in items] == [("5", "2"), ("6", "3")]


@pytest.mark.parametrize("broken", [False, True], ids=["block", "line-by-line"])
def test_a_minus_zero_id_is_no_zero(tmp_path: Path, broken: bool) -> None:
    """``-0`` (PostgreSQL's float8 -0, which msgspec reads as the integer 0) as an id is a
    reject, in a block decoded whole or line by line (a line that is no JSON in it); ``0`` is
    the id ``"0"``, a ``-0`` elsewhere in its row notwithstanding."""
    lines = [
        '{"id": -0, "url": "https://h/1.jpg"}',
        '{"id":-0,"url":"https://h/2.jpg","sku":"a-0"}',
        '{"id": 0, "url": "https://h/3.jpg", "price": -0, "k": "-0"}',
        '{"id": "x-0", "url": "https://h/4.jpg", "season": "-0"}',
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines + (["{broken"] if broken else [])) + "\n")
    (batch,) = _batches(path, 2000, 0)
    assert isinstance(batch.rows, JsonRows) != broken
    items, _, rejects = _route(path)
    assert [(i, r.context.season) for i, _, r in items] == [("0", None), ("x-0", "-0")]
    reasons = [(r.line, r.id, r.reason.split(" (")[0]) for _, r in rejects]
    why = "id must be a string or an integer, not the number -0.0"
    assert reasons[:2] == [(1, None, why), (2, None, why)]
    assert len(reasons) == 2 + broken


N = 2400


def _row_to_json(n: int = N) -> bytes:
    """A ``row_to_json`` dump: ids and prices as numbers; id 7 again as a string (a
    duplicate, as CSV would see it), a float id (a reject)."""
    lines = [
        json.dumps({"id": i, "url": f"https://img.example/{i}.jpg", "price": i + 0.5})
        for i in range(n)
    ]
    lines.insert(900, '{"id": "7", "url": "https://img.example/again.jpg", "price": "1"}')
    lines.insert(1500, '{"id": 3.5, "url": "https://img.example/f.jpg"}')
    return ("\n".join(lines) + "\n").encode()


def _config(tmp_path: Path) -> str:
    path = tmp_path / "c.toml"
    path.write_text(
        "[client.timeout]\ntotal = 3.0\n\n[engine]\nlist_lag = 0.5\nread_batch_rows = 500\n"
        "chunk_size = 500\n"
    )
    return str(path)


def _check(out: Path) -> None:
    o = assert_exactly_once(
        out, out.with_suffix(".rej"), {str(i) for i in range(N)} | {None}, duplicates=1
    )
    reasons = {r["line"]: (r["id"], r["reason"]) for r in o.rejects}
    assert reasons[901][0] == "7" and reasons[901][1].startswith("duplicate id (first seen at")
    assert reasons[1501][0] is None


@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
async def test_a_row_to_json_dump_killed_and_resumed(tmp_path: Path, stdin: bool) -> None:
    data = _row_to_json()
    m = tmp_path / "m.jsonl"
    m.write_bytes(data)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=800.0)) as svc:
        where = "-" if stdin else str(m)
        args = run_args(svc.url, out, where, "--config", _config(tmp_path), "--state", str(state))
        with m.open("rb") as given:
            proc = await anyio.open_process(
                args, stdin=given if stdin else None, stderr=subprocess.DEVNULL, env=ENV
            )
            await kill_when(proc, lambda: out.exists() and out.stat().st_size > 50_000)
        with m.open("rb") as given, anyio.fail_after(120):
            done = await anyio.run_process(
                [*args, "--resume"] if stdin else args,
                stdin=given if stdin else None,
                check=False,
                env=ENV,
            )
    assert done.returncode == 0, done.stderr.decode()[-800:]
    _check(out)
    results = read_outcomes(out, out.with_suffix(".rej")).results
    assert all(isinstance(r["id"], str) for r in results)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"id": -0, "k": "a: -0, b"}', '{"id": -0.0, "k": "a: -0, b"}'),
        ('{"id":-0,"x":[-0 ,1]}\n{"id":\t-0}', '{"id":-0.0,"x":[-0.0 ,1]}\n{"id":\t-0.0}'),
        ('{"url": "https://h/2024-05-01/x-0/a.jpg", "p": -0.5}', None),
        ('{"k": "\\"-0", "n": -05}', None),
    ],
)
def test_a_minus_zero_literal_is_read_as_a_float(text: str, expected: str | None) -> None:
    """msgspec reads ``-0`` as the integer 0: a row whose id is 0 is read again with the literal
    (never the text of a string, nor ``-0.5``) as ``-0.0``, so that a ``-0`` id is a reject,
    not the id ``0``."""
    assert minus_zero(text) == (text if expected is None else expected)
