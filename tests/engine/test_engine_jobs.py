"""The long-lived engine: several jobs over time, one session, one rotation, one state.

Against the reference service on loopback: jobs submitted at different moments share tasks;
equal ids in two jobs never collide inside a task and each job's outputs carry its own ids,
exactly once; a small job submitted behind a big one is done long before it; a state written
by the previous version (no jobs table) resumes as the job ``run``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import msgspec

from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline._config import Timeout
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, taken_in, write_csv

FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=10.0, rotate_images=3000
)


def _spec(tmp: Path, name: str, manifest: Path) -> JobSpec:
    return JobSpec(
        key=name,
        manifests=[str(manifest)],
        results=tmp / name / "results.jsonl",
        rejects=tmp / name / "rejects.jsonl",
    )


async def test_jobs_with_equal_ids_share_tasks_and_keep_their_own_outputs(tmp_path: Path) -> None:
    # a is read in 40 batches: b, submitted right after it, is read in between.
    a = write_csv(tmp_path / "a.csv", 20_000)
    b = write_csv(tmp_path / "b.csv", 1200, extra=["p5,https://img.example/x.jpg,acme,TOP"])
    c = write_csv(tmp_path / "c.csv", 300, start=100)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        state = db.open_engine()
        async with TaggerClient(config=client_config(svc.url)) as client:
            config = msgspec.structs.replace(FAST, read_batch_rows=500, rotate_images=10_000)
            engine = Engine(client=client, db=db, state=state, config=config, namespaced=True)
            async with engine:
                ja = await engine.submit(_spec(tmp_path, "a", a))
                jb = await engine.submit(_spec(tmp_path, "b", b))
                await engine.outcome(ja)
                jc = await engine.submit(_spec(tmp_path, "c", c))
                await engine.outcome(jb)
                await engine.outcome(jc)
                engine.close()
            db.close()  # closed by the engine already: a no-op
        records = list(svc.store.tasks.values())
    # A long-lived engine forgets a complete job's ids: its state grows with the rows in
    # flight, not with every row it ever took.
    leftover = sqlite3.connect(tmp_path / "state").execute("SELECT count(*) FROM ids").fetchone()
    assert leftover == (0,)
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(20_000)},
    )
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl",
        tmp_path / "b" / "rejects.jsonl",
        {f"p{i}" for i in range(1200)},
        duplicates=1,
    )
    assert_exactly_once(
        tmp_path / "c" / "results.jsonl",
        tmp_path / "c" / "rejects.jsonl",
        {f"p{i}" for i in range(100, 400)},
    )
    # Counters per job equal its outputs.
    assert ja.counters["accepted"] == ja.counters["settled"] == 20_000
    assert ja.counters["tasks"] >= 1 and ja.counters["pages"] >= 200
    assert jb.counters["rejected"] == 1 and jb.counters["settled"] == 1200
    # Rows of a and b shared a task: both namespaces appear in one task's ids.
    shared = [
        r
        for r in records
        if any(i.startswith(f"{ja.id}/") for i in r.ids)
        and any(i.startswith(f"{jb.id}/") for i in r.ids)
    ]
    assert shared, "rows of two jobs never shared a task"
    assert all(len(r.ids) == len(set(r.ids)) for r in records)


async def test_a_small_job_behind_a_big_one_is_done_first(tmp_path: Path) -> None:
    """Fair interleaving: with a bound on rows in flight, a 300-row job submitted after a
    30,000-row one reaches the service within a few batches and completes long before it."""
    big = write_csv(tmp_path / "big.csv", 30_000)
    small = write_csv(tmp_path / "small.csv", 300)
    config = EngineConfig(
        poll_min=0.02,
        poll_max=0.2,
        linger_seconds=0.05,
        fsync_seconds=10.0,
        read_batch_rows=500,
    )
    service = ServiceConfig(rate=6000.0)
    async with running_service(service) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=config,
                namespaced=True,
                max_pending_rows=3000,
            )
            async with engine:
                jbig = await engine.submit(_spec(tmp_path, "big", big))
                while jbig.counters["settled"] < 3000:
                    await anyio.sleep(0.05)
                jsmall = await engine.submit(_spec(tmp_path, "small", small))
                await engine.outcome(jsmall)
                await engine.outcome(jbig)
                engine.close()
            db.close()  # closed by the engine already: a no-op
        accepted = [i for r in sorted(svc.store.tasks.values(), key=lambda r: r.seq) for i in r.ids]
    # The service tags in acceptance order: count the big job's rows it took before the
    # small job's first one (all 30,000 of them without the bound).
    first_small = next(n for n, i in enumerate(accepted) if i.startswith(f"{jsmall.id}/"))
    assert first_small < 12_000, first_small
    assert_exactly_once(
        tmp_path / "small" / "results.jsonl",
        tmp_path / "small" / "rejects.jsonl",
        {f"p{i}" for i in range(300)},
    )
    assert_exactly_once(
        tmp_path / "big" / "results.jsonl",
        tmp_path / "big" / "rejects.jsonl",
        {f"p{i}" for i in range(30_000)},
    )


def test_a_state_of_the_previous_version_becomes_the_job_run(tmp_path: Path) -> None:
    """A state file written before jobs existed (watermarks and counters in ``meta``)."""
    path = tmp_path / "old.state"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('run_token', 'abc'), ('validated', '17'), ('chunked', '9'),"
        " ('results_ckpt', '120'), ('rejects_ckpt', '7'), ('manifests', '[\"m.csv\"]'),"
        " ('n_accepted', '10'), ('n_settled', '4'), ('task_seq', '2');"
    )
    db.commit()
    db.close()
    state = StateDB(path)
    try:
        row = state.find_job("run")
        assert row is not None
        assert (row.validated, row.chunked, row.results_ckpt, row.rejects_ckpt) == (17, 9, 120, 7)
        assert row.counters["accepted"] == 10 and row.counters["settled"] == 4
        assert row.sources == [(0, "m.csv")]
        assert state.meta("validated") is None  # moved, not copied
    finally:
        state.close()


async def test_a_job_submitted_again_after_it_completed_is_answered_from_the_state(
    tmp_path: Path,
) -> None:
    """A daemon that crashed after a job completed but before it wrote the summary submits the
    job again on restart: it is complete, nothing is read or sent, and its counts are kept."""
    manifest = write_csv(tmp_path / "a.csv", 500)
    async with running_service(ServiceConfig()) as svc:
        for attempt in range(2):
            db = StateDB(tmp_path / "state")
            async with TaggerClient(config=client_config(svc.url)) as client:
                engine = Engine(
                    client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
                )
                async with engine:
                    job = await engine.submit(_spec(tmp_path, "a", manifest))
                    await engine.outcome(job)
                    engine.close()
                db.close()
            assert job.counters["settled"] == job.counters["accepted"] == 500
            if attempt == 0:
                tasks_after_first = len(svc.store.tasks)
        assert len(svc.store.tasks) == tasks_after_first
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(500)},
    )


async def test_a_manifest_that_breaks_while_read_fails_its_job_alone(tmp_path: Path) -> None:
    """Without fail_fast (the daemon), a manifest whose gzip breaks partway fails its own job
    (with the reason; the rows read before the break still get their outcome) while the
    other job completes."""
    import gzip

    good = write_csv(tmp_path / "good.csv", 800)
    rows = "\n".join(["id,url"] + [f"b{i},https://img.example/b{i}.jpg" for i in range(60_000)])
    packed = gzip.compress(rows.encode())
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(packed[: len(packed) * 2 // 3])
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=FAST,
                namespaced=True,
                fail_fast=False,
            )
            async with engine:
                jb = await engine.submit(_spec(tmp_path, "broken", broken))
                jg = await engine.submit(_spec(tmp_path, "good", good))
                await engine.outcome(jb)
                await engine.outcome(jg)
                engine.close()
        # Submitted again (a daemon killed after the job completed, before its summary): the
        # state answers, failure and rows read included.
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=FAST,
                namespaced=True,
                fail_fast=False,
            )
            async with engine:
                again = await engine.submit(_spec(tmp_path, "broken", broken))
                await engine.outcome(again)
                engine.close()
    assert jb.failure is not None and "broken.csv.gz" in jb.failure
    assert jb.counters["accepted"] == jb.counters["settled"]
    assert 0 < jb.rows_read < 60_000
    assert again.failure == jb.failure and again.rows_read == jb.rows_read
    assert_exactly_once(
        tmp_path / "good" / "results.jsonl",
        tmp_path / "good" / "rejects.jsonl",
        {f"p{i}" for i in range(800)},
    )


async def test_the_fairness_bound_never_blocks_a_resume(tmp_path: Path) -> None:
    """Rows taken in while the service was down, then a kill: on restart they count as in
    flight but are only sent once read again. The bound waited for them forever; it now waits
    only while something under way can bring rows to an outcome."""
    from .helpers import dead_port

    manifest = write_csv(tmp_path / "a.csv", 30_000)
    spec = _spec(tmp_path, "a", manifest)
    config = msgspec.structs.replace(FAST, rotate_seconds=5.0)
    db = StateDB(tmp_path / "state")
    # (Creates cut short by the kill are looked for at the restart for the request deadline
    # after they were sent: short here.)
    short = Timeout(total=3.0)
    dead = f"http://127.0.0.1:{dead_port()}"
    async with TaggerClient(config=client_config(dead, timeout=short)) as client:
        engine = Engine(
            client=client,
            db=db,
            state=db.open_engine(),
            config=config,
            namespaced=True,
            fail_fast=False,
            max_pending_rows=5000,
        )
        # The service is down: the process is gone once the bound is reached, the rows in the
        # state (not a fixed 2 s, which on a loaded machine may come before they are read).
        with anyio.CancelScope() as gone:
            async with engine:
                job = await engine.submit(spec)
                with anyio.fail_after(60):
                    while True:
                        accepted, _, unknown = taken_in(tmp_path / "state")
                        if engine.rows_pending() >= 5000 and accepted >= 5000 and not unknown:
                            break
                        await anyio.sleep(0.02)
                gone.cancel()
                await engine.outcome(job)
    assert engine.rows_pending() >= 5000
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url, timeout=short)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=config,
                namespaced=True,
                fail_fast=False,
                max_pending_rows=5000,
            )
            async with engine:
                job = await engine.submit(spec)
                with anyio.fail_after(60):
                    await engine.outcome(job)
                engine.close()
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(30_000)},
    )


async def test_an_id_the_service_refuses_as_too_long_is_a_reject_not_a_loop(
    tmp_path: Path,
) -> None:
    """With its ``JOB/`` prefix a 1,023-character id is longer than the reference service takes;
    the service echoes it shortened (with an ellipsis) in ``failureList``. The row was counted
    as accepted, never returned, and sent again for ever; it is now its reject."""
    long_id = "x" * 1023
    manifest = write_csv(
        tmp_path / "a.csv", 5, extra=[f"{long_id},https://img.example/l.jpg,a,TOP"]
    )
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            async with engine:
                job = await engine.submit(_spec(tmp_path, "a", manifest))
                with anyio.fail_after(30):
                    await engine.outcome(job)
                engine.close()
    o = assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(5)} | {long_id},
    )
    (reject,) = o.rejects
    assert reject["id"] == long_id and "1024" in reject["reason"]


async def test_outcome_after_close_returns_the_job(tmp_path: Path) -> None:
    """``close()`` then ``await engine.outcome(job)`` inside the block: the job is returned
    (and so is an outcome asked again of a job already complete), not a CancelledError from
    the engine's own end that skips the caller's code after the wait."""
    a = write_csv(tmp_path / "a.csv", 300)
    b = write_csv(tmp_path / "b.csv", 200, start=1000)
    async with (
        running_service(ServiceConfig()) as svc,
        TaggerClient(config=client_config(svc.url)) as client,
    ):
        for attempt in range(3):
            db = StateDB(tmp_path / f"state{attempt}")
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            returned: list[str] = []
            with anyio.fail_after(20):
                async with engine:
                    ja = await engine.submit(_spec(tmp_path / str(attempt), "a", a))
                    jb = await engine.submit(_spec(tmp_path / str(attempt), "b", b))
                    await engine.outcome(ja)
                    engine.close()
                    returned.append((await engine.outcome(jb)).row.key)
                    returned.append((await engine.outcome(ja)).row.key)
            assert returned == ["b", "a"], f"attempt {attempt}: {returned}"
            assert engine.complete
