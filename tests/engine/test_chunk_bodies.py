"""Chunk bodies live in ``chunk_bodies`` (written once); state files that kept them in
``chunks.body`` (before that table) are still read and cleaned the same way."""

from __future__ import annotations

from pathlib import Path

from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine.policy import decode_body, encode_body
from fashiontag_pipeline.engine.state import BODY_SQL, StateDB, changes


def _body(ident: str, pos: int) -> bytes:
    request = TaggingRequest(Image(ImageType.URL, f"https://x/{ident}.jpg"), BulkContext(ident))
    return encode_body([pos], [request])


def test_bodies_read_from_either_place_and_dropped_from_both(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "s.state")
    sql = db.db
    # Chunk 1 the old way (body in the chunk row), chunk 2 the new way, both accepted by t1.
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
    rows = sql.execute(
        f"SELECT chunk_id, {BODY_SQL} FROM chunks WHERE task_id=? AND {BODY_SQL} IS NOT NULL"
        " ORDER BY chunk_id",
        ("t1",),
    ).fetchall()
    decoded = [(cid, [(p, r.context.id) for p, r in decode_body(body)]) for cid, body in rows]
    assert decoded == [(1, [(10, "old")]), (2, [(11, "new")])]

    for statement, params in changes.task_drained("t1"):
        sql.execute(statement, params)
    assert sql.execute(f"SELECT count(*) FROM chunks WHERE {BODY_SQL} IS NOT NULL").fetchone() == (
        0,
    )
    assert sql.execute("SELECT count(*) FROM chunk_bodies").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM chunks").fetchone() == (2,)
    db.close()
