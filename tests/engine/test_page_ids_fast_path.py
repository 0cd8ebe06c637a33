"""A page's rows checked against its task's ids (:meth:`PageRows._first_of_each_id`): the
usual page takes a fast path with no set built for it; a page it does not fit (an id repeated
in it, one read already, one never sent, one refused) is read row by row, with the same
outcome as before the fast path: the first row of each id sent, ``seen`` holding their ids."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from fashiontag_pipeline.engine.page_rows import PageRows
from fashiontag_pipeline.engine.pages import PageRow


def _rows(*ids: str) -> list[PageRow]:
    return [PageRow(i, msgspec.Raw(b'{"status":"success","n":%d}' % n)) for n, i in enumerate(ids)]


async def _first(
    ids: tuple[str, ...],
    *,
    seen: set[str],
    sent: set[str] | None,
    refused: frozenset[str] = frozenset(),
) -> tuple[list[PageRow], list[PageRow], set[str]]:
    pagers: Any = PageRows()
    pagers._warned_changed = False
    entry: Any = SimpleNamespace(task_id="t1", seen=seen, sent=sent, refused=refused, matcher=None)
    rows = _rows(*ids)
    kept = await pagers._first_of_each_id(entry, rows)
    assert entry.seen is seen  # (updated in place: the task's own set)
    return rows, kept, seen


async def test_the_usual_page_is_kept_whole() -> None:
    rows, kept, seen = await _first(("a", "b", "c"), seen={"z"}, sent={"a", "b", "c", "z", "y"})
    assert kept is rows
    assert seen == {"a", "b", "c", "z"}
    rows, kept, seen = await _first(("a", "b"), seen=set(), sent=None)
    assert kept is rows and seen == {"a", "b"}


async def test_an_id_repeated_in_a_fresh_page(caplog: pytest.LogCaptureFixture) -> None:
    """Every id sent and none read: the fast path adds them, finds fewer than the rows, and
    takes them out again for the row-by-row reading (the first of each is kept)."""
    with caplog.at_level(logging.WARNING):
        rows, kept, seen = await _first(("a", "b", "a", "c"), seen={"z"}, sent={"a", "b", "c", "z"})
    assert kept == [rows[0], rows[1], rows[3]]
    assert seen == {"a", "b", "c", "z"}
    assert "1 results repeated an id already read" in caplog.text
    rows, kept, seen = await _first(("a", "a"), seen=set(), sent=None)
    assert kept == [rows[0]] and seen == {"a"}


async def test_pages_the_fast_path_does_not_fit() -> None:
    sent = {"a", "b", "c", "d"}
    rows, kept, seen = await _first(("a", "b", "c"), seen={"b"}, sent=sent)
    assert kept == [rows[0], rows[2]] and seen == {"a", "b", "c"}
    rows, kept, seen = await _first(("a", "x~elsewhere", "c"), seen=set(), sent=sent)
    assert kept == [rows[0], rows[2]] and seen == {"a", "c"}
    rows, kept, seen = await _first(
        ("a", "b", "c"), seen=set(), sent=sent, refused=frozenset({"b"})
    )
    assert kept == [rows[0], rows[2]] and seen == {"a", "c"}
    rows, kept, seen = await _first(("A", "b"), seen=set(), sent=sent)
    assert [(r.id, r.tagging_result) for r in kept] == [
        ("a", rows[0].tagging_result),
        ("b", rows[1].tagging_result),
    ]
    assert seen == {"a", "b"}
