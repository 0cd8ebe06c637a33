"""Counting outcomes must not depend on how a server formats its JSON, and a row that carries
no tagging result object is no outcome; the SQLite results sink cuts back to its checkpoint."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import msgspec
import pytest

from fashiontag_pipeline._exceptions import StateConflictError, StateError
from fashiontag_pipeline._responses import parse_error_body
from fashiontag_pipeline.engine import outfiles
from fashiontag_pipeline.engine.pages import (
    PageRow,
    count_outcomes,
    decode_page,
    screen,
    success_flags,
)
from fashiontag_pipeline.engine.sinks import RejectSink, SqliteResultSink, open_result_sink


def _row(raw: bytes) -> PageRow:
    return PageRow("x", msgspec.Raw(raw))


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b'{"status":"success","data":{}}', 1),
        (b'{ "status" : "success" , "data" : {} }', 1),
        (b'{\n  "status": "success",\n  "data": {}\n}', 1),
        (b'{"status":"failure","error":{"code":803,"message":"x"}}', 0),
        (b'{"status": "fail", "error": {"code": 803}}', 0),
        (b'{"data":{},"status":"success"}', 1),  # status last
        (b'{"data": {}, "status" : "failure" }\n', 0),
        (b'{"data":{},"status":"success","x":1}', 1),  # status between keys: decoded
        (b'{"status":"failure","data":{"k":{"status":"success"}}}', 0),
        (b'{"data":{"status":"failure"},"status":"success"}', 1),  # a nested status is not it
        (b'{"error":{"code":803},"data":{"status":"success"},"status":"failure"}', 0),
    ],
)
def test_count_outcomes_reads_the_top_level_status_whatever_the_spacing(
    raw: bytes, ok: int
) -> None:
    assert count_outcomes([_row(raw)]) == (ok, 1 - ok)


SHAPES = [
    b'{"status":"success","data":{}}',
    b'{ "status" : "success" , "data" : {} }',
    b'{"status":"failure","error":{"code":803,"message":"x"}}',
    b'{"data":{},"status":"success"}',
    b'{"data": {}, "status" : "failure" }\n',
    b'{"data":{},"status":"success","x":1}',
    b'{"data":{"status":"failure"},"status":"success"}',
    b'{"error":{"code":803},"data":{"status":"success"},"status":"failure"}',
    # Status first and last (a repeated key): the first one counts, as for a row alone.
    b'{"status":"failure","data":{},"status":"success"}',
    b'{"status":"success","data":{"pad":"' + b"x" * 200 + b'"}}',
    b'{"data":{"pad":"' + b"x" * 200 + b'"},"status":"success"}',
]


@pytest.mark.parametrize("first", range(len(SHAPES)))
def test_a_page_is_counted_as_its_rows_are_one_by_one(first: int) -> None:
    """A page is classified in one pass when every row says success the same way; any page
    (mixed shapes, failures, key orders) counts exactly what its rows count alone."""
    alone = [count_outcomes([_row(raw)])[0] for raw in SHAPES]
    for second in range(len(SHAPES)):
        for n in (1, 3):
            page = [SHAPES[first]] * n + [SHAPES[second]] * n
            expected = (alone[first] + alone[second]) * n
            assert count_outcomes([_row(r) for r in page]) == (expected, 2 * n - expected)
            flags = success_flags([_row(r) for r in page])
            assert flags == [bool(alone[first])] * n + [bool(alone[second])] * n


def test_a_pretty_printed_page_gives_one_line_results() -> None:
    body = (
        b'{\r\n "status": "success",\r\n "data": {"results": [\r\n  {"id": "a",\r\n'
        b'   "taggingResult": {\r\n    "status": "success",\n    "data": {"k": "x\\ny"}\r\n'
        b"   }}]}}"
    )
    rows = decode_page(body)
    assert [r.id for r in rows] == ["a"]
    raw = bytes(rows[0].tagging_result)
    assert b"\n" not in raw and b"\r" not in raw
    assert msgspec.json.decode(raw) == {"status": "success", "data": {"k": "x\ny"}}
    assert count_outcomes(rows) == (1, 0)
    compact = b'{"status":"success","data":{"results":[{"id":"a","taggingResult":{"s":1}}]}}'
    assert bytes(decode_page(compact)[0].tagging_result) == b'{"s":1}'


def test_a_page_escaping_half_a_surrogate_pair_is_read_with_the_replacement_character() -> None:
    """Half a surrogate pair (``\\ud83d``: a string cut by UTF-16 code units across an emoji)
    in an id or a result is read as U+FFFD, the page's other escapes as they were: the results
    line is written with ``\\ufffd``, readable by any JSON reader. Before, msgspec refused the
    page and its 100 rows were sent again."""
    body = (
        rb'{"status":"success","data":{"results":['
        rb'{"id":"sku-\ud83d","taggingResult":{"status":"success","n":"\udc00x\ud83d\ude00"}},'
        rb'{"id":"a\\ud800\u00e9\/","taggingResult":{"status":"success","n":"\\\udfff"}}]}}'
    )
    rows = decode_page(body)
    assert [r.id for r in rows] == ["sku-\ufffd", "a\\ud800\u00e9/"]
    assert msgspec.json.decode(bytes(rows[0].tagging_result))["n"] == "\ufffdx\U0001f600"
    assert msgspec.json.decode(bytes(rows[1].tagging_result))["n"] == "\\\ufffd"


def test_rows_without_a_tagging_result_object_are_screened_out() -> None:
    """``null``, a string, a number and no result at all are no outcome: :func:`screen` leaves
    them out (the pagers send their rows again), keeps every object as it is (one whose status
    is no string is a failure), and says whether all it kept are successes."""
    body = (
        b'{"status":"success","data":{"results":['
        b'{"id":"a","taggingResult":{"status":"success","data":{}}},'
        b'{"id":"b","taggingResult":null},'
        b'{"id":"c","taggingResult":"tagged"},'
        b'{"id":"d","taggingResult":7},'
        b'{"id":"e","taggingResult":{"data":{},"status":3,"x":1}},'
        b'{"id":"f"},'
        b'{"id":"g","taggingResult":{"data":{},"error":{"code":803}}},'
        b'{"id":"h","taggingResult":{"data":{},"status":"failure"}}]}}'
    )
    rows = decode_page(body)
    kept, all_success = screen(rows)
    assert [r.id for r in kept] == ["a", "e", "g", "h"] and not all_success
    assert success_flags(rows) == [True] + [False] * 7  # never raises, whatever a row holds
    assert count_outcomes(kept) == (1, 3)
    good = [r for r in rows if r.id == "a"] * 3
    assert screen(good) == (good, True)
    assert screen([]) == ([], True)


def test_the_unpacked_prefix_finds_a_page_all_successes_as_the_rows_say() -> None:
    """The usual page is found all successes from each result's first bytes (unpacked, not
    matched): a result shorter than them (``{}``, ``null``, none), one that differs in a byte
    or with spacing, and one whose ``success`` sits in a nested key are each classified by
    the rows' other readings, wherever on the page they are."""
    exact = _row(b'{"status":"success","data":{}}')
    others = [
        (_row(b"{}"), 0),
        (_row(b"null"), 0),
        (_row(b""), 0),
        (_row(b'{"status":"success"}'), 1),
        (_row(b'{"status":"successful"}'), 0),
        (_row(b'{"status":"failure","data":{"status":"success"}}'), 0),
        (_row(b'{"data":{"status":"success"},"status":"failure"}'), 0),
        (_row(b'{ "status" : "success", "data":{}}'), 1),
        (_row(b'{"data":{},"status":"success"}'), 1),
    ]
    assert count_outcomes([exact] * 3) == (3, 0)
    assert screen([exact] * 3)[1]
    for row, ok in others:
        for at in (0, 1, 2):
            rows = [exact, exact]
            rows.insert(at, row)
            assert count_outcomes(rows) == (2 + ok, 1 - ok), (row, at)
            assert success_flags(rows)[at] is bool(ok), (row, at)


def _sqlite_rows(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT id FROM results ORDER BY rowid")]


def _page(*ids: str) -> list[PageRow]:
    raw = msgspec.Raw(b'{"status":"success","data":{"objects":[]}}')
    return [PageRow(i, raw) for i in ids]


def test_the_sqlite_sink_cuts_back_to_its_checkpoint(tmp_path: Path) -> None:
    """The checkpoint is the last rowid: a resume deletes exactly the rows written after the
    one the state recorded, and a checkpoint of 0 (a new run) empties the table."""
    path = tmp_path / "r.db"
    sink = SqliteResultSink(path)
    sink.write_page("t1", _page("a", "b"))
    committed = sink.checkpoint()
    sink.write_page("t1", _page("c"))  # written, then the run died before the state commit
    sink.close()
    sink = SqliteResultSink(path)
    sink.truncate(committed)
    assert _sqlite_rows(path) == ["a", "b"]
    sink.write_page("t1", _page("c", "d"))
    assert _sqlite_rows(path) == ["a", "b", "c", "d"] and sink.checkpoint() > committed
    sink.truncate(0)
    assert _sqlite_rows(path) == [] and sink.checkpoint() == 0
    sink.close()


def test_a_new_sqlite_results_file_has_16_kib_pages_and_an_older_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    """A new results file is made with 16 KiB pages (a quarter of the page writes of 4 KiB
    for ~1.6 KB results); a file made with SQLite's 4 KiB pages (an earlier version's) keeps
    them, its rows and its rowid checkpoints: resumed, cut back, written on."""
    new = tmp_path / "new.db"
    sink = SqliteResultSink(new)
    sink.write_page("t1", _page("a"))
    sink.close()
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:
        db.execute("PRAGMA page_size = 4096")
        db.execute("VACUUM")
    sink = SqliteResultSink(old)
    sink.write_page("t1", _page("a", "b"))
    committed = sink.checkpoint()
    sink.write_page("t1", _page("c"))
    sink.close()
    sink = SqliteResultSink(old)
    sink.truncate(committed)
    sink.write_page("t1", _page("d"))
    sink.close()
    sizes = {}
    for path in (new, old):
        with sqlite3.connect(path) as db:
            sizes[path.name] = db.execute("PRAGMA page_size").fetchone()[0]
    assert sizes == {"new.db": 16384, "old.db": 4096}
    assert _sqlite_rows(new) == ["a"] and _sqlite_rows(old) == ["a", "b", "d"]


def test_a_result_in_latin_1_is_no_crash_of_the_sqlite_sink(tmp_path: Path) -> None:
    """A tagging result written in ISO-8859-1 (a name with the byte E9: msgspec passes it on
    as raw JSON) is written with its columns unread, as any result it cannot read; msgspec's
    UnicodeDecodeError stopped the state thread."""
    sink = SqliteResultSink(tmp_path / "r.db")
    sink.write_page("t1", [_row(b'{"status":"success","data":{"n":"caf\xe9"}}')])
    assert _sqlite_rows(tmp_path / "r.db") == ["x"]
    sink.close()
    assert parse_error_body(b'{"status":"failure","error":"caf\xe9"}')[1].startswith("{")


def test_an_older_sqlite_results_file_is_resumed_as_it_was_and_emptied_by_a_new_run(
    tmp_path: Path,
) -> None:
    """A file from before rowid checkpoints (user_version 0) holds counts the rowids do not
    match: a resume keeps its rows, even at a checkpoint of 0 (that version recorded 0 for a
    session that committed only rejects); a new run (no result committed) empties it."""
    path = tmp_path / "r.db"
    sink = SqliteResultSink(path)
    sink.write_page("t1", _page("a", "b", "c"))
    sink.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 0")
    sink = SqliteResultSink(path)
    sink.truncate(1)  # a count of that version's last session, not a rowid
    assert _sqlite_rows(path) == ["a", "b", "c"]
    sink.truncate(0)  # results committed before: a resume
    assert _sqlite_rows(path) == ["a", "b", "c"]
    sink.truncate(0, results_committed=False)  # a new run
    assert _sqlite_rows(path) == []
    sink.close()


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_an_output_knows_when_it_is_no_longer_at_its_path(tmp_path: Path, kind: str) -> None:
    """Removed, renamed, replaced by another file or its folder replaced by a file: removed.
    Reached through a symlink, or merely flushed: not."""
    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / ("r.db" if kind == "sqlite" else "r.jsonl")
    link = tmp_path / "link"
    os.symlink(path, link)
    linked = open_result_sink(link, kind)
    assert not linked.removed()
    linked.close()
    sink = open_result_sink(path, kind)
    sink.write_page("t1", _page("a"))
    sink.flush(True)
    assert not sink.removed()
    os.rename(path, tmp_path / "moved")
    assert sink.removed()
    os.rename(tmp_path / "moved", path)
    assert not sink.removed()
    (tmp_path / "other").write_bytes(b"x")
    os.replace(tmp_path / "other", path)  # another file renamed over it
    assert sink.removed()
    sink.close()
    sink = open_result_sink(path, kind)
    shutil.rmtree(folder)
    folder.write_bytes(b"a file where the folder was")
    assert sink.removed()
    sink.close()


def test_an_output_cut_short_is_told_from_a_size_a_file_system_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSONL output truncated under its writer is cut short; a size that says so once
    (attributes a network or FUSE file system cached before the last writes) and not when
    looked at again is not. Lines written after a truncation go to the file's new end."""
    monkeypatch.setattr(outfiles, "SIZE_RECHECK", 0.0)
    path = tmp_path / "r.jsonl"
    sink = open_result_sink(path, "jsonl")
    sink.write_page("t1", _page("a"))
    sink.flush(True)
    real = os.fstat
    stale = [1]

    def cached(fd: int) -> os.stat_result:
        st = real(fd)
        if stale and fd == sink._fh.fileno():  # type: ignore[attr-defined]
            stale.pop()
            return os.stat_result((*st[:6], 0, *st[7:]))  # st_size 0, once
        return st

    monkeypatch.setattr(outfiles.os, "fstat", cached)
    assert not sink.removed() and not stale
    monkeypatch.setattr(outfiles.os, "fstat", real)
    os.truncate(path, 0)  # logrotate's copytruncate
    assert sink.removed()
    sink.write_page("t1", _page("b"))
    assert path.read_bytes().startswith(b'{"id":"b"')  # no hole of NUL bytes
    sink.close()


def test_a_sqlite_results_file_missing_committed_rows_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    sink = SqliteResultSink(path)
    sink.write_page("t1", _page("a", "b"))
    committed = sink.checkpoint()
    sink.close()
    path.unlink()
    sink = SqliteResultSink(path)
    with pytest.raises(StateError, match="committed rows are missing"):
        sink.truncate(committed)
    sink.close()


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_an_output_is_written_by_one_run_at_a_time(tmp_path: Path, kind: str) -> None:
    """Two runs given the same --out (and each its own --state) would cut back and append
    over each other's lines: the second is refused while the first has the file open."""
    path = tmp_path / ("r.db" if kind == "sqlite" else "r.jsonl")
    first = open_result_sink(path, kind)
    with pytest.raises(StateConflictError, match="being written by another run"):
        open_result_sink(path, kind)
    with pytest.raises(StateConflictError):
        RejectSink(path) if kind == "jsonl" else open_result_sink(path, kind)
    first.close()
    open_result_sink(path, kind).close()


@pytest.mark.parametrize("name", ["out?x.db", "out#1.db", "out%3F.db"])
def test_a_sqlite_results_file_named_with_uri_characters_is_read_where_it_is(
    tmp_path: Path, name: str
) -> None:
    """A resume reads the row at its SQLite results file's checkpoint through a read-only
    URI: a name holding ``?`` or ``#`` was cut there (``out?x.db`` opened ``out``, made in
    read-write mode as a stray empty file, and the row went unchecked)."""
    from fashiontag_pipeline.engine.sqlite_sink import committed_row_id

    path = tmp_path / name
    sink = SqliteResultSink(path)
    sink.write_page("t1", _page("a", "b"))
    sink.close()
    assert committed_row_id(path, 0) == (True, "a", "t1", False)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(name)) == []
