"""Chunk bodies live in ``chunk_bodies`` (written once); state files that kept them in
``chunks.body`` (before that table) are still read and cleaned the same way; a drained task's
accepted chunks leave the state with it."""

from __future__ import annotations

from pathlib import Path

import msgspec

from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine.policy import body_ids, decode_body, decode_chunk, encode_body
from fashiontag_pipeline.engine.state import BODY_SQL, StateDB, changes


def _body(ident: str, pos: int) -> bytes:
    request = TaggingRequest(Image(ImageType.URL, f"https://x/{ident}.jpg"), BulkContext(ident))
    return encode_body([pos], [request])[0]


def test_bodies_read_from_either_place_and_dropped_from_both(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "s.state")
    sql = db.db
    # Chunk 1 the old way (body in the chunk row), chunk 2 the new way, both accepted by t1;
    # chunk 3 of unknown fate (an orphan of t1: settled later, so it stays).
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos, body)"
        " VALUES (1, 'accepted', 't1', 1, 10, ?)",
        (_body("old", 10),),
    )
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos)"
        " VALUES (2, 'accepted', 't1', 1, 11)"
    )
    sql.execute("INSERT INTO chunk_bodies VALUES (2, ?)", (_body("new", 11),))
    sql.execute(
        "INSERT INTO chunks (chunk_id, state, task_id, n, last_pos)"
        " VALUES (3, 'orphan', 't1', 1, 12)"
    )
    sql.execute("INSERT INTO chunk_bodies VALUES (3, ?)", (_body("orphan", 12),))
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

    from fashiontag_pipeline import TaggerClient

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
        spliced = TaggerClient._bulk_body(encoded, description, None, None, False)
        plain = TaggerClient._bulk_body(requests, description, None, None, False)
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
