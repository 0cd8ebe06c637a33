"""A task's sent ids, taken from the lists kept at its chunks' write-ahead
(:mod:`fashiontag_pipeline.engine.state.sent_ids`), are the ids the state holds for it: the
kept lists and the read-back from the state give the same set, task by task; a task with a
chunk not kept reads them all from the state; the lists kept stay bounded."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.pagers import ResultPagers
from fashiontag_pipeline.engine.policy import body_ids, decode_ids, encode_ids
from fashiontag_pipeline.engine.state import StateDB, changes, sent_ids
from fashiontag_pipeline.engine.state.sent_ids import SentIds
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    Outcomes,
    assert_exactly_once,
    client_config,
    ids_of,
    job_spec,
    run_misbehaving,
    write_csv,
)
from .proxy import Misbehaviour
from .test_expiry_readings import ExpiredTaskGone
from .test_long_lived_jobs import FAST


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


async def _after_a_task_gone(
    tmp_path: Path, first: int, second: list[str], config: EngineConfig = FAST
) -> tuple[int, Outcomes, Outcomes]:
    """A long-lived engine (the daemon's) behind a service that answers its first task 410
    (gone) before it is done: job m0 of ``first`` rows (that task's: ``expired`` rejects, its
    chunks deleted from the state with their lists never taken), then job m1 of the ids
    ``second``. (images billed, m0's outcomes, m1's outcomes)."""
    proxy = ExpiredTaskGone()
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            db = StateDB(tmp_path / "state")
            async with TaggerClient(config=client_config(proxy.url)) as client:
                engine = Engine(
                    client=client,
                    db=db,
                    state=db.open_engine(),
                    config=config,
                    namespaced=True,
                    fail_fast=False,
                )
                async with engine:
                    m1 = tmp_path / "m1.csv"
                    rows = [f"{i},https://img.example/{n}.jpg" for n, i in enumerate(second)]
                    m1.write_text("\n".join(["id,url", *rows]) + "\n")
                    for i, manifest in enumerate((write_csv(tmp_path / "m0.csv", first), m1)):
                        job = await engine.submit(job_spec(f"m{i}", manifest, tmp_path / f"o{i}"))
                        with anyio.fail_after(20):
                            await engine.outcome(job)
                    engine.close()
        billed = svc.store.image_count
    assert proxy.gone_answers >= 1
    gone = assert_exactly_once(
        tmp_path / "o0" / "results.jsonl", tmp_path / "o0" / "rejects.jsonl", ids_of(first)
    )
    assert len(gone.rejects) == first
    o = assert_exactly_once(
        tmp_path / "o1" / "results.jsonl", tmp_path / "o1" / "rejects.jsonl", set(second)
    )
    return billed, gone, o


async def test_a_chunk_id_given_again_is_not_taken_for_the_list_of_the_one_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """m0's task answered 410 (gone) before it was done: its chunks leave the state, their
    lists kept, and SQLite gives their ids to the next chunks written (m1's), which the lists
    kept, full (a cap of 4 ids standing for the 50,000: a big catalogue in flight), do not
    take. m1's task's ids must be m1's, not m0's list kept under the same chunk id: before,
    every m1 result was taken for an id never sent, left out, and its row sent (and billed)
    again."""
    monkeypatch.setattr(sent_ids, "KEEP_IDS", 4)
    billed, _, o = await _after_a_task_gone(tmp_path, 4, sorted(ids_of(4)))
    assert not o.rejects and len(o.results) == 4
    assert billed == 8  # (each row of the two jobs sent once)


async def test_a_splits_halves_are_not_taken_for_the_lists_of_chunks_gone(tmp_path: Path) -> None:
    """As above, with the cap as it is: m0's task of three chunks of two rows is gone (410),
    then m1's one chunk holds two ids of one key (``x1``, ``X1``): written ahead whole (its
    list kept under the first id freed), then split, its halves written under the next two
    ids freed, not kept. Each half's task must read its own ids, not m0's lists."""
    two = msgspec.structs.replace(FAST, chunk_size=2)
    billed, _, o = await _after_a_task_gone(tmp_path, 6, ["x1", "X1"], two)
    assert not o.rejects and len(o.results) == 2
    assert billed == 8
