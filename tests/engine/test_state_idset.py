"""The SQLite state's run-wide dedupe (:mod:`fashiontag_pipeline.engine.state.idset`): ids that
sort after the tree's last one go into it at once, any others wait in ``ids_log`` (and in
memory) until a flush puts them into the tree in key order. Whatever way an id went, a later row
of it is its duplicate, across flushes, rollbacks, a kill -9 and a restart; a run refused at its
start writes nothing; a long-lived engine's complete job leaves no id behind.

The flush threshold is lowered here (``flush_ids``) so that a few dozen ids cross it."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import StateError
from fashiontag_pipeline.engine import EngineConfig, RunControl, run_pipeline
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.engine.state.idruns import batch_bounds
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config

FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.2, rotate_images=1000, rotate_min_images=1000
)

SHUFFLED = [f"{(i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1):016x}" for i in range(60)]


@pytest.fixture
def small_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StateDB, "flush_ids", 7)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDB]:
    db = StateDB(tmp_path / "state")
    try:
        yield db
    finally:
        db.close()


def _log_rows(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("SELECT count(*) FROM ids_log").fetchone()[0])


def _tree(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as raw:
        return dict(raw.execute("SELECT id, pos FROM ids"))


def _runs(path: Path) -> list[dict[str, int]]:
    """Each row of ``id_runs`` ({id: pos}, in order), checked against its columns."""
    runs = []
    with sqlite3.connect(path) as raw:
        for high, low, n, ids, positions in raw.execute("SELECT * FROM id_runs ORDER BY high"):
            keys = json.loads(ids)
            at = array("q", positions)
            assert keys == sorted(keys) and (low, high, n) == (keys[0], keys[-1], len(keys))
            runs.append(dict(zip(keys, at, strict=True)))
    return runs


def _held(path: Path) -> dict[str, int]:
    """The ids of the tree and of the runs (each in one of them only)."""
    held = _tree(path)
    for run in _runs(path):
        assert held.keys().isdisjoint(run)
        held.update(run)
    return held


@pytest.mark.usefixtures("small_flush")
def test_shuffled_ids_keep_their_first_position_across_flushes(state: StateDB) -> None:
    rng = random.Random(7)
    expected: dict[str, int] = {}
    pos = 0
    for _ in range(12):  # batches of 8 ids, some seen before, some repeated within the batch
        keyed = []
        for _ in range(8):
            ident = rng.choice(SHUFFLED[:30])
            pos += 1
            keyed.append((ident, pos))
        with state.transaction():
            got = state.dedupe(keyed)
        firsts = got if got is not None else [p for _, p in keyed]
        for (ident, p), first in zip(keyed, firsts, strict=True):
            expected.setdefault(ident, p)
            assert first == expected[ident], (ident, p)
    assert state.ids_taken() == len(expected)
    assert state.first_positions(list(expected)) == expected
    assert state.first_positions(["never-seen"]) == {}
    prefix = sorted(expected)[0][:1]
    assert state.ids_starting(prefix, 100) == sorted(k for k in expected if k.startswith(prefix))
    assert state.ids_starting("", 3) == sorted(expected)[:3]


@pytest.mark.usefixtures("small_flush")
def test_sorted_ids_go_into_a_run_at_once_and_others_wait(state: StateDB) -> None:
    with state.transaction():
        assert state.dedupe([("a1", 1), ("a2", 2), ("a3", 3)]) is None
    assert _runs(state.path) == [{"a1": 1, "a2": 2, "a3": 3}] and _tree(state.path) == {}
    with state.transaction():  # before the tree's last id: waits in ids_log
        assert state.dedupe([("a0", 4), ("a2", 5)]) == [4, 2]
    assert "a0" not in _tree(state.path) and _log_rows(state.path) == 1
    with state.transaction():  # a duplicate of a waiting id, found in memory
        assert state.dedupe([("a0", 6), ("a4", 7)]) == [4, 7]
    assert state.ids_taken() == 5


def test_a_batchs_bounds_are_its_min_and_max_sorted_or_not() -> None:
    """A batch's lowest id and, when every id sorts after the tree's last, its highest: found
    by sorting when its first id sorts after the tree (a sorted catalogue), by ``min``
    otherwise; the same either way, whatever the order of the ids."""
    rng = random.Random(3)
    for _ in range(500):
        ids = rng.sample(SHUFFLED[:20], rng.randint(1, 8))
        if rng.random() < 0.5:
            ids.sort()
        new = {key: i for i, key in enumerate(ids)}
        tree_max = rng.choice([None, *SHUFFLED[:20]])
        after = tree_max is None or min(ids) > tree_max
        assert batch_bounds(new, tree_max) == (min(ids), sorted(ids) if after else None)


def test_ids_after_the_tree_in_any_order_go_in_at_once(state: StateDB) -> None:
    with state.transaction():
        assert state.dedupe([("a1", 1), ("a3", 2), ("a2", 3)]) is None
    with state.transaction():  # all after the tree's last id, the first not the lowest
        assert state.dedupe([("a9", 4), ("a5", 5)]) is None
    with state.transaction():  # the first after the tree's last id, another not: looked up
        assert state.dedupe([("b", 6), ("a0", 7), ("a5", 8)]) == [6, 7, 5]
    with state.transaction():  # before the tree's last id, in a range it holds none of
        assert state.dedupe([("a6", 9)]) is None
    assert _tree(state.path) == {"a1": 1, "a2": 3, "a3": 2, "a5": 5, "a6": 9, "a9": 4}
    assert _log_rows(state.path) == 1 and state.ids_taken() == 8
    with state.transaction():
        assert state.dedupe([("b", 10), ("a0", 11), ("a9", 12)]) == [6, 7, 4]


def test_a_batch_whose_range_the_tree_holds_no_id_of_goes_in_at_once(state: StateDB) -> None:
    """A daemon sends ``JOB/ID``: job 10's ids sort before job 9's (``"10/" < "9/"``), and the
    jobs in flight take turns. Each job's sorted batches went to ``ids_log`` and memory (every
    batch of job 10 sorts before the tree's last id, job 9's), then into the tree at the next
    flush or job end: the costly path of a shuffled catalogue for sorted ones. A batch none of
    whose range the tree holds goes in at once, wherever that range is."""
    with state.transaction():
        assert state.dedupe([("9/a", 1), ("9/b", 2)]) is None
    with state.transaction():
        assert state.dedupe([("10/a", 3), ("10/b", 4)]) is None
    with state.transaction():
        assert state.dedupe([("9/c", 5), ("9/d", 6)]) is None
    with state.transaction():
        assert state.dedupe([("10/c", 7)]) is None
    assert _log_rows(state.path) == 0
    assert _held(state.path) == {
        "9/a": 1,
        "9/b": 2,
        "10/a": 3,
        "10/b": 4,
        "9/c": 5,
        "9/d": 6,
        "10/c": 7,
    }
    with state.transaction():  # a range that holds ids: they are looked up
        assert state.dedupe([("10/b", 8), ("10/bb", 9)]) == [4, 9]
    with state.transaction():  # the tree's last id is still job 9's
        assert state.dedupe([("9/e", 10), ("9/c", 11)]) == [10, 5]
    assert state.ids_taken() == 9


@pytest.mark.usefixtures("small_flush")
def test_a_rolled_back_batch_takes_no_id_in(state: StateDB) -> None:
    with state.transaction():
        assert state.dedupe([("z1", 1), ("z2", 2)]) is None  # the tree
    with state.transaction():
        assert state.dedupe([("b1", 3), ("b2", 4)]) is None  # waiting (before z2)
    with pytest.raises(RuntimeError), state.transaction():
        assert state.dedupe([("c1", 5), ("c2", 6)]) is None  # waiting: no flush yet
        raise RuntimeError("the batch's transaction fails")
    with pytest.raises(RuntimeError), state.transaction():
        assert state.dedupe([(f"d{i}", 10 + i) for i in range(6)]) is None  # a flush
        raise RuntimeError("the batch's transaction fails")
    assert state.ids_taken() == 4
    assert state.first_positions(["z1", "b1", "b2", "c1", "d0"]) == {"z1": 1, "b1": 3, "b2": 4}
    with state.transaction():  # the failed batches' ids are still new, the others are not
        assert state.dedupe([("c1", 20), ("d0", 21), ("b2", 22), ("z2", 23)]) == [20, 21, 4, 2]
    assert state.ids_taken() == 6


def test_ids_waiting_when_the_process_is_killed_are_there_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from fashiontag_pipeline.engine.state import StateDB\n"
        "db = StateDB(Path(sys.argv[1]))\n"
        "with db.transaction():\n"
        "    db.dedupe([('m5', 1), ('m9', 2)])\n"
        "with db.transaction():\n"
        "    db.dedupe([('m1', 3), ('m7', 4)])\n"  # before m9: waits in ids_log
        "os._exit(0)\n"  # no close: as kill -9 would leave it
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    assert _log_rows(path) == 1 and set(_tree(path)) == {"m5", "m9"}

    before = path.read_bytes()
    db = StateDB(path)  # opened and closed without a batch: nothing written
    db.close()
    assert path.read_bytes() == before and _log_rows(path) == 1

    db = StateDB(path)
    try:
        assert db.ids_taken() == 4
        with db.transaction():
            assert db.dedupe([("m1", 10), ("m2", 11), ("m9", 12)]) == [3, 11, 2]
    finally:
        db.close()
    assert _tree(path) == {"m1": 3, "m2": 11, "m5": 1, "m7": 4, "m9": 2}
    assert _log_rows(path) == 0


@pytest.mark.usefixtures("small_flush")
def test_a_complete_jobs_ids_are_forgotten_waiting_or_not(state: StateDB) -> None:
    job = state.open_job("k1", "m.csv", ["m.csv"], "out", "rej", "jsonl")
    other = state.open_job("k2", "n.csv", ["n.csv"], "out2", "rej2", "jsonl")
    with state.transaction():
        state.dedupe([(f"{job.job}/z", 1), (f"{other.job}/z", 2)])
    with state.transaction():  # before the tree's last id: waits
        state.dedupe([(f"{job.job}/a", 3), (f"{other.job}/a", 4)])
    state.job_complete(job.job, "2026-11-27T00:00:00Z", forget_rows=True)
    assert state.first_positions([f"{job.job}/z", f"{job.job}/a"]) == {}
    assert state.first_positions([f"{other.job}/z", f"{other.job}/a"]) == {
        f"{other.job}/z": 2,
        f"{other.job}/a": 4,
    }
    with state.transaction():  # after the forget, the tree's last id is the other job's
        assert state.dedupe([(f"{other.job}/zz", 5), (f"{other.job}/a", 6)]) == [5, 4]


def test_ids_holding_a_nul_are_bound_one_by_one(state: StateDB) -> None:
    with state.transaction():
        state.dedupe([("b\x00x", 1), ("c", 2)])
    with state.transaction():  # "b" must not be taken for "b\x00x" (json_each stops at NUL)
        assert state.dedupe([("b", 3), ("a\x00", 4), ("b\x00x", 5)]) == [3, 4, 1]
    assert state.first_positions(["b\x00x", "a\x00", "b"]) == {"b\x00x": 1, "a\x00": 4, "b": 3}


async def test_a_run_of_shuffled_ids_with_duplicates_stopped_and_resumed_tags_each_id_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids in no order (hashes), a twentieth of the rows repeating an earlier id, flushed every
    500 ids: stopped partway and run again, every id is tagged once and every repeat is a
    duplicate reject, whichever way its first row's id went."""
    monkeypatch.setattr(StateDB, "flush_ids", 500)
    rng = random.Random(11)
    unique = [f"{(i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1):016x}" for i in range(1, 6001)]
    rows = [(ident, i) for i, ident in enumerate(unique)]
    for k in range(300):
        at = rng.randrange(1000, len(rows))
        rows.insert(at, (rng.choice(unique[: at // 2]), 10_000 + k))
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "id,url\n" + "".join(f"{ident},https://img.example/{n}.jpg\n" for ident, n in rows)
    )
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state"
    async with running_service(ServiceConfig(rate=8000.0)) as svc:
        client = client_config(svc.url)
        control = RunControl()
        async with anyio.create_task_group() as tg:

            async def stop_when_results_appear() -> None:
                with anyio.fail_after(60):
                    while not out.exists() or out.stat().st_size == 0:
                        await anyio.sleep(0.02)
                control.stop()

            tg.start_soon(stop_when_results_appear)
            first = await run_pipeline(
                [manifest],
                client=client,
                out=out,
                rejects=rej,
                state=state,
                engine=FAST,
                control=control,
            )
        second = await run_pipeline(
            [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
    assert second.complete, (first, second)
    o = assert_exactly_once(out, rej, set(unique), duplicates=300)
    assert len(o.results) == 6000
    repeats = {i + 2 for i, (_, n) in enumerate(rows) if n >= 10_000}  # (line 1: the header)
    assert {r["line"] for r in o.rejects if r["reason"].startswith("duplicate id")} == repeats


def test_ids_cut_short_are_looked_up_without_reading_every_waiting_id(state: StateDB) -> None:
    """A service that cuts long ids (to 64 characters) has each result's id looked up among
    the run's ids (:meth:`ids_starting`). With shuffled ids waiting (tens of thousands between
    flushes), each look-up read every waiting id: a 1,000-row page took seconds of the state
    thread (every commit of the run waits on it), a 1M-row run most of an hour more."""
    ids = [f"{(i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1):016x}/" + "x" * 60 for i in range(40_000)]
    with state.transaction():
        state.dedupe([("8", 0)])  # in the middle of every batch's range: each batch waits
    for start in range(0, len(ids), 2000):
        with state.transaction():
            state.dedupe([(key, n + 1) for n, key in enumerate(ids[start : start + 2000], start)])
    assert len(state._pending) == len(ids)
    started = time.perf_counter()
    for key in ids[:2000]:
        assert state.ids_starting(key[:64], 2) == [key]
    assert time.perf_counter() - started < 1.0
    assert state.ids_starting(ids[5][:16], 2) == [ids[5]]
    assert state.ids_starting("", 3) == sorted(ids)[:3]


def test_a_damaged_ids_log_row_is_a_state_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state"
    StateDB(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO ids_log (batch) VALUES (?)", (b"\x00not json",))
    with pytest.raises(StateError, match=f"state file {path}.*ids_log row 1"):
        StateDB(path)
    StateDB(path.with_name("other")).close()  # (the lock of the first was released)
    with pytest.raises(StateError):
        StateDB(path)  # and again: its lock is free
