"""A long-lived engine (the daemon's, the library's ``async with Engine(...)``) takes jobs for
weeks: what one job leaves behind once it is complete must be nothing but its record, and a
job must complete without waiting for the next one.

Against the reference service on loopback (behind the misbehaving proxy of :mod:`.proxy`
where a real service's answers are needed).
"""

from __future__ import annotations

import gc
import sqlite3
import tracemalloc
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine import intake as intake_module
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.engine.reuse import hook as hook_module
from fashiontag_pipeline.engine.reuse import open_reuse
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, write_csv
from .proxy import Misbehaviour, misbehaving

FAST = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.05,
    fsync_seconds=10.0,
    rotate_seconds=1.0,
    max_sends=2,
    read_again_window=3.0,  # (a row never returned is sent again 3 s after, not 30)
)


def _spec(tmp: Path, name: str, manifest: Path) -> JobSpec:
    return JobSpec(
        key=name,
        manifests=[str(manifest)],
        results=tmp / name / "results.jsonl",
        rejects=tmp / name / "rejects.jsonl",
    )


async def _jobs_one_after_another(
    tmp: Path, rules: Misbehaviour, jobs: int, rows: int, *, wait: float = 20.0
) -> Engine:
    """A namespaced engine (as the daemon's) behind ``rules``, taking ``jobs`` manifests of
    ``rows`` rows one after the other, each waited for (at most ``wait`` seconds)."""
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        db = StateDB(tmp / "state")
        async with TaggerClient(config=client_config(proxy.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=FAST,
                namespaced=True,
                fail_fast=False,
            )
            async with engine:
                for i in range(jobs):
                    manifest = write_csv(tmp / f"m{i}.csv", rows)
                    job = await engine.submit(_spec(tmp, f"m{i}", manifest))
                    with anyio.fail_after(wait):
                        await engine.outcome(job)
                engine.close()
    return engine


@pytest.mark.parametrize(
    "rules",
    [
        # A create applied with its answer lost; the retry's rows refused as duplicates in
        # other words: the chunk is of unknown fate (an orphan), settled from the results.
        Misbehaviour(lose_first_create_answer=True, duplicate_wording="context.id already exists:"),
        # A row the service takes and never returns: sent max_sends times, then a reject.
        Misbehaviour(never_returned={"p3"}),
    ],
    ids=["orphan-settled", "unreturned"],
)
async def test_a_complete_job_leaves_no_chunk_body_in_the_state(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """A state that lives for weeks grows with the rows in flight, not with every chunk ever
    sent (``changes.task_drained``): once every job is complete and the engine closed, no
    chunk body (the rows' full requests, ~150 bytes a row) is left in the state. A chunk that
    was settled any other way than "accepted" (an orphan whose rows all came back, rows sent
    again and then rejected as never returned) is ``resolved`` and keeps its body for ever:
    the daemon's state file grows with every such chunk for months."""
    engine = await _jobs_one_after_another(tmp_path, rules, jobs=3, rows=300)
    assert engine.complete
    for i in range(3):
        assert_exactly_once(
            tmp_path / f"m{i}" / "results.jsonl",
            tmp_path / f"m{i}" / "rejects.jsonl",
            ids_of(300),
        )
    sql = sqlite3.connect(tmp_path / "state")
    try:
        leftover = sql.execute(
            "SELECT c.chunk_id, c.state, t.state, length(b.body) FROM chunk_bodies b"
            " JOIN chunks c USING (chunk_id) LEFT JOIN tasks t USING (task_id)"
        ).fetchall()
    finally:
        sql.close()
    assert leftover == [], f"chunk bodies kept after every job completed: {leftover}"


async def test_a_job_with_a_row_refused_whole_completes_without_another_job(
    tmp_path: Path,
) -> None:
    """One row of a job makes the service refuse every write that carries it (400, the row
    not named): the chunk is split until that row is found. In a long-lived engine the job's
    input is read and the writer idle by then, so the parts go to a task nobody seals: the
    job waits (its rows sent, never polled) until another job's rows wake the writer; a
    daemon with a quiet inbox never finishes that manifest. rotate_seconds is 1 s: the task
    should be sealed within a second or two and the job done well within 15 s."""
    rules = Misbehaviour(refuse_whole_with={"p3"})
    engine = await _jobs_one_after_another(tmp_path, rules, jobs=1, rows=250, wait=15.0)
    assert engine.complete
    o = assert_exactly_once(
        tmp_path / "m0" / "results.jsonl", tmp_path / "m0" / "rejects.jsonl", ids_of(250)
    )
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p3", "server-validation")]


# (220 jobs: 45-55 s at a load of 13, 67-149 s beside CPU burners; the suite's limit is 120 s)
@pytest.mark.timeout(300)
async def test_memory_the_intake_keeps_does_not_grow_with_every_job(tmp_path: Path) -> None:
    """The intake kept, for the engine's whole life, a mark per job ever read ("its stdin,
    if any, was read before this manifest"): a daemon taking a thousand manifests a day grew
    by that much every day. What the intake's code holds once every job is complete is the
    same after 20 jobs as after 220 (a set of 220 ints is ~8 KiB of table alone)."""
    manifests = [write_csv(tmp_path / f"m{i}.csv", 2, start=i) for i in range(220)]

    def held() -> int:
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, intake_module.__file__)]
        )
        return sum(stat.size for stat in snap.statistics("filename"))

    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            tracemalloc.start(1)
            try:
                async with engine:
                    sizes = []
                    for first in range(0, 220, 20):
                        jobs = [
                            await engine.submit(_spec(tmp_path, f"m{i}", manifests[i]))
                            for i in range(first, first + 20)
                        ]
                        with anyio.fail_after(30):
                            for job in jobs:
                                await engine.outcome(job)
                        sizes.append(held())
                    engine.close()
            finally:
                tracemalloc.stop()
    assert sizes[-1] - sizes[0] < 2048, f"held by the intake after each 20 jobs: {sizes}"


# (220 jobs: 45-55 s at a load of 13, 67-149 s beside CPU burners; the suite's limit is 120 s)
@pytest.mark.timeout(300)
async def test_memory_the_reuse_hook_keeps_does_not_grow_with_every_job(tmp_path: Path) -> None:
    """A daemon with ``--reuse`` holds one result-store hook for its whole life, which kept a
    mark per job ever read (the watermark from which its rows may be answered from the store)
    and never dropped one: the daemon's memory grew with every manifest it ever took. What
    the hook's code holds once every job is complete is the same after 20 jobs as after 220."""
    manifests = [write_csv(tmp_path / f"m{i}.csv", 2, start=i) for i in range(220)]
    config = msgspec.structs.replace(FAST, reuse=str(tmp_path / "store.sqlite"))

    def held() -> int:
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, hook_module.__file__)]
        )
        return sum(stat.size for stat in snap.statistics("filename"))

    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        state = db.open_engine()
        reuse = open_reuse(config, language="en", db=db.db, resumed=True, state="state")
        assert reuse is not None
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=state, config=config, namespaced=True, reuse=reuse
            )
            tracemalloc.start(1)
            try:
                async with engine:
                    sizes = []
                    for first in range(0, 220, 20):
                        jobs = [
                            await engine.submit(_spec(tmp_path, f"m{i}", manifests[i]))
                            for i in range(first, first + 20)
                        ]
                        with anyio.fail_after(30):
                            for job in jobs:
                                await engine.outcome(job)
                        sizes.append(held())
                    engine.close()
            finally:
                tracemalloc.stop()
                reuse.close_store()
    assert sizes[-1] - sizes[0] < 2048, f"held by the reuse hook after each 20 jobs: {sizes}"


async def test_memory_the_journal_keeps_does_not_grow_with_every_refused_write(
    tmp_path: Path,
) -> None:
    """The journal keeps, for each chunk written ahead, where each open job's rejects stood
    then (so that a task's read looks for the service's refusals from there), and forgot it
    only when the chunk's task was read. A chunk the service refused whole is split and never
    read (its halves are), a chunk sent again after its task was lost is read no more: a
    daemon whose manifests each carried a row the service refuses whole grew by a mark
    (a dict per open job) with every one, for its whole life. Once every job is complete the
    journal keeps no mark and no chunk's id list, after 8 such jobs as after 24 (before the
    fix: 8, 16, 24 of each)."""
    rules = Misbehaviour(refuse_whole_with={"p3"})
    manifests = [write_csv(tmp_path / f"m{i}.csv", 5) for i in range(24)]

    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(proxy.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            journal = engine.journal
            async with engine:
                kept = []
                for first in range(0, 24, 8):
                    jobs = [
                        await engine.submit(_spec(tmp_path, f"m{i}", manifests[i]))
                        for i in range(first, first + 8)
                    ]
                    with anyio.fail_after(30):
                        for job in jobs:
                            await engine.outcome(job)
                    # (the marks and id lists kept, counted rather than weighed: tracemalloc's
                    # sum over the state's code moved by ~17 KB between looks under load,
                    # objects of a write in flight, in two runs of three)
                    kept.append((len(journal.reject_marks), len(journal.sent_ids)))
                engine.close()
    for i in range(24):
        o = assert_exactly_once(
            tmp_path / f"m{i}" / "results.jsonl", tmp_path / f"m{i}" / "rejects.jsonl", ids_of(5)
        )
        assert [(r["id"], r["stage"]) for r in o.rejects] == [("p3", "server-validation")]
    assert kept == [(0, 0)] * 3, f"(marks, id lists) kept after each 8 jobs: {kept}"
