"""A task's sent ids, taken from the lists kept at its chunks' write-ahead
(:mod:`fashiontag_pipeline.engine.state.sent_ids`), are the ids the state holds for it: the
kept lists and the read-back from the state give the same set, task by task; a task with a
chunk not kept reads them all from the state; the lists kept stay bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from fashiontag_pipeline.engine.pagers import ResultPagers
from fashiontag_pipeline.engine.policy import body_ids, decode_ids, encode_ids
from fashiontag_pipeline.engine.state import StateDB, changes, sent_ids
from fashiontag_pipeline.engine.state.sent_ids import SentIds

from .helpers import run_misbehaving
from .proxy import Misbehaviour


def _from_state(db: StateDB, task_id: str) -> set[str] | None:
    chunks = db.sent_chunks(task_id)
    if chunks is None:
        return None
    out: set[str] = set()
    for ids, body in chunks:
        out.update(decode_ids(ids) if ids is not None else body_ids(body or b""))
    return out


async def test_kept_ids_are_the_ids_the_state_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with a task forgotten (its rows sent again: its chunks replaced, resolved) and a
    result under an id never sent: every task's sent ids, taken from the kept lists, equal
    those read back from the state at the same moment; every id has its one outcome."""
    read_back = ResultPagers._sent_ids
    compared: list[tuple[str, set[str] | None, set[str] | None]] = []
    taken: list[bool] = []
    take = SentIds.take

    def spy_take(self: SentIds, chunks: list[tuple[int, str]]) -> object:
        got = take(self, chunks)
        taken.append(got is not None)
        return got

    def spy(self: ResultPagers, task_id: str) -> tuple[set[str] | None, frozenset[str]]:
        expected = _from_state(self.journal.db, task_id)  # type: ignore[arg-type]
        sent, refused = read_back(self, task_id)
        compared.append((task_id, sent, expected))
        return sent, refused

    monkeypatch.setattr(ResultPagers, "_sent_ids", spy)
    monkeypatch.setattr(SentIds, "take", spy_take)
    rules = Misbehaviour(forget_when_done={1}, foreign_id_in_first_page={2})
    summary, _, _ = await run_misbehaving(tmp_path, 3000, rules)
    assert summary.complete and summary.resent > 0
    assert len(compared) >= 3 and all(taken)
    for task_id, sent, expected in compared:
        assert sent == expected, task_id


def test_a_task_with_a_chunk_not_kept_reads_every_id_from_the_state(tmp_path: Path) -> None:
    """Kept lists give a task's ids only when every unresolved chunk of it is kept (a resolved
    one is left out, kept or not); taking drops them; a sweep drops the lists of chunks the
    state no longer holds unresolved."""
    db = StateDB(tmp_path / "s.state")
    kept = SentIds(db.live_chunks)

    def write(task_id: str, ids: list[str], keep: bool = True) -> int:
        chunk = db.insert_chunk(len(ids), 0, b"{}", None, 0, task_id=task_id, ids=encode_ids(ids))
        if keep:
            kept.keep(chunk, ids)
        return chunk

    a, b = write("t1", ["a", "b"]), write("t1", ["c"])
    resolved = write("t1", ["gone"])
    with db.transaction():
        for sql, params in changes.chunk_resolved(resolved):
            db.db.execute(sql, params)
    assert kept.take(db.task_chunks("t1")) == [["a", "b"], ["c"]]
    assert kept.take(db.task_chunks("t1")) is None  # (taken once: then read from the state)
    assert len(kept) == 0 and a != b

    write("t2", ["d"])
    write("t2", ["e"], keep=False)  # (an earlier process's chunk, or a split's half)
    assert kept.take(db.task_chunks("t2")) is None
    assert _from_state(db, "t2") == {"d", "e"}

    left = write("t3", ["f"])
    for i in range(3):
        chunk = write("t4", [f"r{i}"])
        with db.transaction():
            for sql, params in changes.chunk_resolved(chunk):
                db.db.execute(sql, params)
    assert len(kept) == 4
    kept.sweep()
    assert len(kept) == 1 and kept.take([(left, "accepted")]) == [["f"]]
    db.close()


def test_the_lists_kept_stay_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks whose task is never read (resolved, or gone from the state) do not pile up: the
    lists kept stay within about twice the chunks the state holds unresolved."""
    monkeypatch.setattr(sent_ids, "SWEEP_MIN", 8)
    db = StateDB(tmp_path / "s.state")
    kept = SentIds(db.live_chunks)
    for i in range(200):
        chunk = db.insert_chunk(1, i, b"{}", None, 0, task_id=f"t{i}", ids=encode_ids([str(i)]))
        kept.keep(chunk, [str(i)], replaces=None)
        with db.transaction():
            for sql, params in changes.chunk_resolved(chunk):
                db.db.execute(sql, params)
        assert len(kept) <= 8
    db.close()


def test_no_more_than_so_many_ids_are_kept(tmp_path: Path) -> None:
    """Past the cap a chunk's list is not kept (``fashiontag run`` does not bound the rows in
    flight): its task reads every id from the state; lists taken make room again."""
    db = StateDB(tmp_path / "s.state")
    kept = SentIds(db.live_chunks)
    kept.cap = 3

    def write(task_id: str, ids: list[str]) -> int:
        chunk = db.insert_chunk(len(ids), 0, b"{}", None, 0, task_id=task_id, ids=encode_ids(ids))
        kept.keep(chunk, ids)
        return chunk

    write("t1", ["a", "b"])
    write("t2", ["c", "d"])  # (over the cap: not kept)
    write("t3", ["e"])
    assert len(kept) == 2
    assert kept.take(db.task_chunks("t2")) is None
    assert _from_state(db, "t2") == {"c", "d"}
    assert kept.take(db.task_chunks("t1")) == [["a", "b"]]
    write("t4", ["f", "g"])  # (room again)
    assert kept.take(db.task_chunks("t4")) == [["f", "g"]]
    assert kept.take(db.task_chunks("t3")) == [["e"]]
    db.close()
