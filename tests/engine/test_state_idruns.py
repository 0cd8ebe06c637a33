"""The SQLite state's runs of ids (:mod:`fashiontag_pipeline.engine.state.idruns`): a batch
whose ids all sort after every id held is one ``id_runs`` row, not a B-tree row an id. Every
promise of the run-wide dedupe holds for ids in runs: a later row of such an id (in the same
manifest, another manifest, after a resume) is found with its first row's position, and so it
is by ``first_positions``, ``ids_starting`` (ids a service cut), a complete job's forget and
``ids_taken``; a batch in no order meets the runs' ranges. A file holding runs carries their
version (4), which builds before them refuse, whatever else marks the file in between.

Each test here failed on a build that mishandles its promise (the lookups, forget, ``ids_taken``,
the range check or a version trap left out, one at a time)."""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine import EngineConfig, RunControl, run_pipeline
from fashiontag_pipeline.engine.state import (
    POS_SHIFT,
    STATE_FILE_BASE,
    STATE_FILE_VERSION,
    KeyedColumns,
    StateDB,
    idruns,
)
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, client_config, dead_port, run_args

FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.2, rotate_images=1000, rotate_min_images=1000
)
#: The newest SQLite layout the build before runs reads (2026-11-28, ``9d8b4e5``).
BEFORE_RUNS_READS = 3


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDB]:
    db = StateDB(tmp_path / "state")
    try:
        yield db
    finally:
        db.close()


def _runs(path: Path) -> list[dict[str, int]]:
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT ids, positions FROM id_runs ORDER BY high").fetchall()
    return [dict(zip(json.loads(ids), array("q", pos), strict=True)) for ids, pos in rows]


def _tree(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as raw:
        return dict(raw.execute("SELECT id, pos FROM ids"))


def _version(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("PRAGMA user_version").fetchone()[0])


def _batch(ids: list[str], start: int) -> list[tuple[str, int]]:
    return [(key, start + n) for n, key in enumerate(ids)]


def test_lookups_read_the_ids_of_runs(state: StateDB) -> None:
    """``first_positions``, ``ids_starting`` and ``ids_taken`` of ids held in runs only (a
    service that cut ids finds them by their start; one across two runs, limits kept)."""
    with state.transaction():
        assert state.dedupe(_batch(["k01", "k02", "k03\x00x"], 1)) is None
    with state.transaction():
        assert state.dedupe(_batch(["k04", "k10", "k11"], 10)) is None
    assert [list(run) for run in _runs(state.path)] == [
        ["k01", "k02", "k03\x00x"],
        ["k04", "k10", "k11"],
    ]
    assert _tree(state.path) == {}
    assert state.ids_taken() == 6
    wanted = ["k11", "k03\x00x", "nope", "k01", "k0", "k04"]
    assert state.first_positions(wanted) == {"k11": 12, "k03\x00x": 3, "k01": 1, "k04": 10}
    assert state.ids_starting("k0", 10) == ["k01", "k02", "k03\x00x", "k04"]
    assert state.ids_starting("k0", 2) == ["k01", "k02"]
    assert state.ids_starting("k03", 2) == ["k03\x00x", "k04"][:1]
    assert state.ids_starting("k1", 5) == ["k10", "k11"]
    assert state.ids_starting("", 4) == ["k01", "k02", "k03\x00x", "k04"]
    assert state.ids_starting("z", 4) == []


def test_a_later_row_of_an_id_in_a_run_is_its_duplicate_whatever_its_batch(
    state: StateDB,
) -> None:
    """A catalogue sorted, then not (a dump appended to, another manifest of the run): the
    runs a batch in no order meets are moved into the tree, where it is looked up; the
    others stay runs. Each id's first row wins across all of it, and across a reopen."""
    with state.transaction():
        assert state.dedupe(_batch(["a1", "a2", "a3"], 1)) is None
    with state.transaction():  # repeats within a run's batch: its first row's position
        assert state.dedupe(_batch(["b1", "b2", "b1"], 4)) == [4, 5, 4]
    with state.transaction():
        assert state.dedupe(_batch(["c1", "c2"], 7)) is None
    assert len(_runs(state.path)) == 3
    with state.transaction():  # in no order, across the first two runs' ranges
        assert state.dedupe(_batch(["b2", "a0", "a2", "b9"], 20)) == [5, 21, 2, 23]
    assert _runs(state.path) == [{"c1": 7, "c2": 8}]
    with state.transaction():  # after the last run: a new one, the repeat found in the old
        assert state.dedupe(_batch(["d1", "c2", "d2"], 30)) == [30, 8, 32]
    with state.transaction():
        assert state.dedupe(_batch(["d2", "d3"], 40)) == [32, 41]
    assert state.ids_taken() == 12
    path = state.path
    state.close()
    again = StateDB(path)
    try:
        assert again.ids_taken() == 12
        with again.transaction():
            got = again.dedupe(_batch(["c1", "d1", "e1", "a0", "b1", "d3"], 50))
        assert got == [7, 30, 52, 21, 4, 41]
    finally:
        again.close()


def test_a_batch_after_the_runs_but_for_a_repeat_is_a_run_and_the_repeat_its_duplicate(
    state: StateDB,
) -> None:
    """A sorted catalogue's batch holding a repeat of an earlier batch's id: its other ids
    make a run (the runs kept), the repeat is found in the run that holds it."""
    first = [f"s{i:03d}" for i in range(16)]
    with state.transaction():
        assert state.dedupe(_batch(first, 0)) is None
    second = [f"s{i:03d}" for i in range(16, 30)]
    with state.transaction():
        got = state.dedupe(_batch([*second[:5], "s007", *second[5:]], 100))
    assert got == [100, 101, 102, 103, 104, 7, *range(106, 115)]
    assert [len(run) for run in _runs(state.path)] == [16, 14] and _tree(state.path) == {}
    third = [f"t{i:02d}" for i in range(21)]  # a repeat of each run, a new id among them
    with state.transaction():
        got = state.dedupe(_batch([third[0], "s003", third[1], "s020", "s007a", *third[2:]], 200))
    assert got == [200, 3, 202, 104, 204, *range(205, 224)]
    assert [len(run) for run in _runs(state.path)] == [16, 14, 21] and state.ids_taken() == 52
    assert state.first_positions(["s007a", "s020", "t00"]) == {
        "s007a": 204,
        "s020": 104,
        "t00": 200,
    }


def test_a_shuffled_batch_after_every_id_held_goes_to_the_tree(state: StateDB) -> None:
    """A shuffled catalogue's first batch sorts after every id held (none), in no order: as a
    run, the next batch would move it into the tree again (a cost today's path never paid)."""
    with state.transaction():
        assert state.dedupe(_batch(["f3", "f1", "f2"], 1)) is None
    assert _runs(state.path) == [] and _tree(state.path) == {"f1": 2, "f2": 3, "f3": 1}
    assert _version(state.path) == STATE_FILE_BASE


def test_a_rolled_back_run_takes_no_id_in_and_leaves_the_version(state: StateDB) -> None:
    with state.transaction():
        state.dedupe(_batch(["m1", "m2"], 1))
    with pytest.raises(RuntimeError), state.transaction():
        state.dedupe(_batch(["n1", "n2"], 3))
        raise RuntimeError("the batch's transaction fails")
    assert len(_runs(state.path)) == 1
    with state.transaction():  # n1 is new (no run of it), m1 is not; m0 meets the run
        assert state.dedupe(_batch(["m0", "n1", "m1"], 5)) == [5, 6, 1]
    assert state.first_positions(["n1", "n2", "m2"]) == {"n1": 6, "m2": 2}


def test_a_complete_jobs_ids_are_forgotten_from_runs(state: StateDB) -> None:
    """A long-lived engine's complete job (``JOB/ID``) leaves no id in a run: its runs are
    deleted, and a run holding another job's ids too (one batch across both) keeps those."""
    job = state.open_job("k1", "m.csv", ["m.csv"], "out", "rej", "jsonl").job
    other = state.open_job("k2", "n.csv", ["n.csv"], "out2", "rej2", "jsonl").job
    assert job < other
    with state.transaction():
        state.dedupe(_batch([f"{job}/a", f"{job}/b"], 1))
    with state.transaction():  # one run across both jobs
        state.dedupe(_batch([f"{job}/c", f"{other}/a"], 3))
    with state.transaction():
        state.dedupe(_batch([f"{other}/b", f"{other}/c"], 5))
    assert len(_runs(state.path)) == 3
    state.job_complete(job, "2026-11-28T00:00:00Z", forget_rows=True)
    mine = [f"{job}/a", f"{job}/b", f"{job}/c"]
    theirs = [f"{other}/a", f"{other}/b", f"{other}/c"]
    assert state.first_positions(mine) == {}
    assert state.first_positions(theirs) == dict(zip(theirs, [4, 5, 6], strict=True))
    assert state.ids_starting(f"{job}/", 5) == []
    assert state.ids_taken() == 3
    with state.transaction():  # the job's ids are new again; the other's are not
        assert state.dedupe(_batch([f"{job}/a", f"{other}/c"], 10)) == [10, 6]
    state.job_complete(other, "2026-11-28T00:00:00Z", forget_rows=True)
    assert state.ids_taken() == 1 and _runs(state.path) == []


def test_a_file_holding_runs_carries_their_version_whatever_marks_it(state: StateDB) -> None:
    """The commit that makes the first run marks the file 4 (a build of 3 refuses it); a
    long id's reject marked in the same commit, or a run completed with a job left open,
    keeps it 4; a file whose runs are gone is lowered (3: it may hold a long id's reject;
    2 once emptied by a completed run's reclaim)."""
    path = state.path
    assert _version(path) == STATE_FILE_BASE
    with pytest.raises(RuntimeError), state.transaction():
        state.dedupe(_batch(["a1", "a2"], 1))
        raise RuntimeError("rolled back")
    assert _version(path) == STATE_FILE_BASE
    with state.transaction():
        state.dedupe(_batch(["a1", "a2"], 1))
    assert _version(path) == STATE_FILE_VERSION > BEFORE_RUNS_READS
    with state.transaction():  # in no order: the run is dissolved
        state.dedupe(_batch(["a0", "a3"], 3))
    assert _runs(path) == [] and _version(path) == 3
    with state.transaction():
        state.dedupe(_batch(["b1", "b2"], 5))
        sql, args = state.long_ids_mark()  # (as the intake applies it: after the dedupe)
        state.db.execute(sql, args)
    assert _version(path) == STATE_FILE_VERSION
    with state.transaction():  # a later batch's mark alone
        state.db.execute(*state.long_ids_mark())
    assert _version(path) == STATE_FILE_VERSION


def test_a_completed_run_holding_runs_keeps_their_version_until_they_are_reclaimed(
    state: StateDB,
) -> None:
    """``mark_complete`` takes a long id's mark off; runs left by a job still open (a
    library caller's, a daemon's) keep the file 4 until ``reclaim`` deletes them."""
    path = state.path
    with state.transaction():
        state.dedupe(_batch(["b1", "b2"], 5))
    open_job = state.open_job("k1", "m.csv", ["m.csv"], "out", "rej", "jsonl").job
    state.mark_complete("2026-11-28T00:00:00Z")  # a job left open: its runs stay
    assert len(_runs(path)) == 1 and _version(path) == STATE_FILE_VERSION
    state.job_complete(open_job, "2026-11-28T00:00:01Z")
    state.mark_complete("2026-11-28T00:00:02Z")
    assert _runs(path) == [] and _tree(path) == {} and _version(path) == STATE_FILE_BASE


def _sorted_with_repeats(path: Path, n: int, repeats: int, seed: int) -> tuple[set[str], int]:
    """A catalogue of ``n`` ids in order, ``repeats`` rows repeating an earlier id (the
    second row of a product, a dump appended to)."""
    rng = random.Random(seed)
    unique = [f"sku-{i:09d}" for i in range(n)]
    rows = [(ident, i) for i, ident in enumerate(unique)]
    for k in range(repeats):
        at = rng.randrange(1000, len(rows))
        rows.insert(at, (rng.choice(unique[: at // 2]), n + k))
    path.write_text(
        "id,url\n" + "".join(f"{ident},https://img.example/{m}.jpg\n" for ident, m in rows)
    )
    return set(unique), repeats


async def test_a_sorted_run_with_repeats_stopped_and_resumed_tags_each_id_once(
    tmp_path: Path,
) -> None:
    """Sorted ids (runs), a twentieth of the rows repeating an earlier id (a batch that
    meets runs): stopped partway and run again, every id is tagged once and every repeat is
    a duplicate reject."""
    manifest = tmp_path / "m.csv"
    ids, repeats = _sorted_with_repeats(manifest, 6000, 300, 5)
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
    assert_exactly_once(out, rej, ids, duplicates=repeats)
    assert _version(state) == STATE_FILE_BASE  # (completed: its runs reclaimed)


def _as_head_wrote_it(path: Path) -> None:
    """The layout of the build before runs (``9d8b4e5``): every id in ``ids`` (its sorted
    batches went into the tree), no ``id_runs`` table, version 2."""
    runs = _runs(path)
    with sqlite3.connect(path) as raw:
        for run in runs:
            raw.executemany("INSERT INTO ids VALUES (?, ?)", run.items())
        raw.execute("DROP TABLE id_runs")
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {STATE_FILE_BASE}")


async def test_a_state_of_the_build_before_runs_is_resumed_exactly_once(tmp_path: Path) -> None:
    """A run stopped (the service down) leaves runs, a state the build before them refuses;
    the same state as that build writes it (ids in the tree, no ``id_runs``) is resumed by
    this one: every id tagged once, every repeat (before and after the stop) a duplicate."""
    manifest = tmp_path / "m.csv"
    ids, repeats = _sorted_with_repeats(manifest, 5000, 200, 9)
    out, state = tmp_path / "out.jsonl", tmp_path / "nightly.state"
    dead = f"http://127.0.0.1:{dead_port()}"
    args = run_args(dead, out, "--state", str(state), "--give-up-after", "1", str(manifest))
    stopped = await anyio.run_process(args, check=False, env=ENV)
    assert stopped.returncode == 1, stopped.stderr.decode()[-3000:]
    assert _runs(state) and _version(state) > BEFORE_RUNS_READS
    _as_head_wrote_it(state)
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), str(manifest))
        resumed = await anyio.run_process(args, check=False, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids, duplicates=repeats)


def test_a_runs_positions_are_little_endian_int64s_as_array_packed_them() -> None:
    """The packing (``struct.pack`` since round 12) writes the bytes ``array("q")`` wrote,
    so that files of either build read the same positions: small, past 32 bits (a later
    manifest's: ``source << POS_SHIFT``) and the largest."""
    positions = {"a": 0, "b": 7, "c": (3 << POS_SHIFT) | 12345, "d": (1 << 63) - 1}
    packed = idruns._packed(positions.values())
    expected = array("q", positions.values())
    if sys.byteorder == "big":
        expected.byteswap()
    assert packed == expected.tobytes()
    assert list(idruns._unpacked(packed)) == list(positions.values())


def test_a_block_keyed_as_columns_dedupes_as_its_pairs(tmp_path: Path) -> None:
    """A validator block's ids and positions handed over as columns (``KeyedColumns``) are
    the same rows as the list of pairs: the same first positions, repeats and duplicates."""
    ids = ["k-3", "k-1", "k-3", "k-2", "k-1"]
    positions = range(10, 15)
    pairs = list(zip(ids, positions, strict=True))
    columns = KeyedColumns(ids, positions)
    assert list(columns) == pairs and len(columns) == 5
    assert columns[2] == pairs[2] and columns[-1] == pairs[-1] and columns[1:3] == pairs[1:3]
    results = []
    for n, keyed in enumerate((pairs, columns)):
        db = StateDB(tmp_path / f"state-{n}")
        try:
            results.append((db.dedupe(keyed), db.dedupe(_batch(["k-2", "k-9"], 20))))
        finally:
            db.close()
    assert results[0] == results[1] == ([10, 11, 10, 13, 11], [13, 21])
