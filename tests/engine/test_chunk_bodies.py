"""Chunk bodies live in ``chunk_bodies`` (written once); state files that kept them in
``chunks.body`` (before that table) are still read and cleaned the same way; a drained task's
accepted chunks leave the state with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fashiontag_pipeline._bodies import bulk_body
from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine.policy import body_ids, decode_body, decode_chunk, encode_body
from fashiontag_pipeline.engine.state import BODY_SQL, StateDB, changes


def _body(ident: str, pos: int) -> bytes:
    request = TaggingRequest(Image(ImageType.URL, f"https://x/{ident}.jpg"), BulkContext(ident))
    return encode_body([pos], [request])[0]


def _chunk_with_body_in_row(sql: Any, chunk_id: int, state: str, ident: str, pos: int) -> None:
    """A chunk of task t1 as versions before ``chunk_bodies`` wrote it: its body in its row."""
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos, body)"
        " VALUES (?, ?, 't1', 1, ?, ?)",
        (chunk_id, state, pos, _body(ident, pos)),
    )


def _chunk_with_body_apart(sql: Any, chunk_id: int, state: str, ident: str, pos: int) -> None:
    """A chunk of task t1 with its body in ``chunk_bodies`` and no ids beside it."""
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos) VALUES (?, ?, 't1', 1, ?)",
        (chunk_id, state, pos),
    )
    sql.execute(
        "INSERT INTO chunk_bodies (chunk_id, body) VALUES (?, ?)", (chunk_id, _body(ident, pos))
    )


def test_bodies_read_from_either_place_and_dropped_from_both(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "s.state")
    sql = db.db
    # Chunk 1 the old way (body in the chunk row), chunk 2 the new way, both accepted by t1;
    # chunk 3 of unknown fate (an orphan of t1: settled later, so it stays).
    _chunk_with_body_in_row(sql, 1, "accepted", "old", 10)
    _chunk_with_body_apart(sql, 2, "accepted", "new", 11)
    _chunk_with_body_apart(sql, 3, "orphan", "orphan", 12)
    rows = sql.execute(
        f"SELECT chunk_id, {BODY_SQL} FROM chunks WHERE task_id=? AND {BODY_SQL} IS NOT NULL"
        " ORDER BY chunk_id",
        ("t1",),
    ).fetchall()
    decoded = [(cid, [(p, r.context.id) for p, r in decode_body(body)]) for cid, body in rows]
    assert decoded == [(1, [(10, "old")]), (2, [(11, "new")]), (3, [(12, "orphan")])]

    for statement, params in changes.task_drained("t1"):
        sql.execute(statement, params)
    assert sql.execute("SELECT chunk_id FROM chunk_bodies").fetchall() == [(3,)]
    assert sql.execute("SELECT chunk_id, state FROM chunks").fetchall() == [(3, "orphan")]
    db.close()


def test_a_chunk_is_encoded_once_for_the_state_and_the_write() -> None:
    """The stored body decodes to its rows, an old-format body too, and the bulk write built
    from the encoded requests is byte for byte the one built from the request objects."""
    import msgspec

    requests = [
        TaggingRequest(Image(ImageType.URL, f"https://x/{i}.jpg"), BulkContext(f"id{i}"))
        for i in range(3)
    ]
    body, encoded = encode_body([7, 8, 9], requests)
    assert [(p, r.context.id) for p, r in decode_body(body)] == [(7, "id0"), (8, "id1"), (9, "id2")]
    old = msgspec.json.encode([[7, requests[0]]])
    assert [(p, r.context.id) for p, r in decode_body(old)] == [(7, "id0")]
    assert encoded.size == 3
    for description in (None, "fashiontag run t-1"):
        spliced = bulk_body(encoded, description, None, None, False)
        plain = bulk_body(requests, description, None, None, False)
        assert spliced == plain


def test_a_body_counts_the_sends_before_it() -> None:
    """New rows carry no count; rows sent again carry theirs, and every reader of a body (rows,
    ids, sends) reads either kind, and the format of older versions."""
    request = TaggingRequest(Image(ImageType.URL, "https://x/a.jpg"), BulkContext("a"))
    new, _ = encode_body([7], [request])
    again, _ = encode_body([7], [request], sends=3)
    assert b'"g"' not in new
    assert (decode_chunk(new)[0], decode_chunk(again)[0]) == (0, 3)
    assert decode_body(new) == decode_body(again) == [(7, request)]
    assert body_ids(again) == ["a"]
    old = msgspec.json.encode([[7, request]])
    assert decode_chunk(old) == (0, [(7, request)]) and decode_body(old) == [(7, request)]


def test_a_tasks_sent_ids_come_from_id_lists_or_bodies_of_older_files(tmp_path: Path) -> None:
    """A chunk written now keeps its ids beside its body (read without the body); a chunk of
    an older file (body in ``chunks``, or in ``chunk_bodies`` with no ids) gives its body;
    a resolved chunk is left out (its rows have their outcomes, or went to another chunk: a
    result for one of them is no line); a task with another chunk that has neither left has
    no known sent ids."""
    from fashiontag_pipeline.engine.policy import decode_ids, encode_ids

    db = StateDB(tmp_path / "s.state")
    ids = encode_ids(["fresh"])
    chunk = db.insert_chunk(1, 10, _body("fresh", 10), None, 0, task_id="t1", ids=ids)
    sql = db.db
    _chunk_with_body_in_row(sql, 50, "accepted", "old", 11)
    _chunk_with_body_apart(sql, 51, "orphan", "older", 12)
    got = db.sent_chunks("t1")
    assert got is not None
    by_kind = sorted(
        ("ids", decode_ids(i)) if i is not None else ("body", body_ids(b or b"")) for i, b in got
    )
    assert by_kind == [("body", ["old"]), ("body", ["older"]), ("ids", ["fresh"])]
    assert db.sent_chunks("none") == []

    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos)"
        " VALUES (52, 'resolved', 't1', 1, 13)"
    )
    again = db.sent_chunks("t1")
    assert again is not None and sorted(again, key=repr) == sorted(got, key=repr)
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos)"
        " VALUES (53, 'accepted', 't1', 1, 14)"
    )
    assert db.sent_chunks("t1") is None
    assert chunk not in (50, 51, 52, 53)
    db.close()


def test_a_state_file_from_before_chunk_ids_gets_the_column(tmp_path: Path) -> None:
    """An older file gets the column (last, NULL in its chunks); a new file has it before the
    body, where SQLite reads it without walking the body's overflow pages."""
    import sqlite3

    fresh = StateDB(tmp_path / "new.state")
    columns = [row[1] for row in fresh.db.execute("PRAGMA table_info(chunk_bodies)")]
    assert columns == ["chunk_id", "ids", "body"]
    fresh.close()
    path = tmp_path / "old.state"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE chunk_bodies (chunk_id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    old.execute("INSERT INTO chunk_bodies VALUES (7, x'00')")
    old.commit()
    old.close()
    db = StateDB(path)
    columns = [row[1] for row in db.db.execute("PRAGMA table_info(chunk_bodies)")]
    assert columns == ["chunk_id", "body", "ids"]
    assert db.db.execute("SELECT chunk_id, ids FROM chunk_bodies").fetchall() == [(7, None)]
    db.close()
