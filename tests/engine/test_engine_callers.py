"""The engine driven as a library by another program: the ways a caller ends its work (it
closes the engine, then waits for its jobs) and is ended itself (a timeout, a cancel), against
the reference service on loopback. Each case was found by a hunt and failed before its fix.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline import ConfigError, ManifestError
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import (
    EngineConfig,
    FatalRunError,
    RunControl,
    RunSummary,
    run_pipeline,
)
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import Job
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    assert_exactly_once,
    client_config,
    dead_port,
    free_port,
    ids_of,
    job_spec,
    taken_in,
    write_csv,
)
from .proxy import Misbehaviour, misbehaving

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=10.0)


async def test_the_code_after_the_outcome_of_a_closed_engine_runs(tmp_path: Path) -> None:
    """A caller that submits its jobs, closes the engine (no more jobs) and then waits for
    each outcome: the engine's end cancelled the caller's own block, so ``outcome`` never
    returned and every line after it was skipped without a word (a function returning the
    job from inside the block returned None; the ``async with`` swallowed the cancel)."""
    a = write_csv(tmp_path / "a.csv", 300)
    b = write_csv(tmp_path / "b.csv", 200, start=1000)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:

            async def tag_both() -> list[Job] | None:
                engine = Engine(
                    client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
                )
                async with engine:
                    jobs = [
                        await engine.submit(job_spec("a", a, tmp_path / "a")),
                        await engine.submit(job_spec("b", b, tmp_path / "b")),
                    ]
                    engine.close()  # no more jobs: it ends once these are done
                    for job in jobs:
                        await engine.outcome(job)
                    await anyio.sleep(0)  # the caller's own work after the outcomes
                    return jobs
                return None

            with anyio.fail_after(30):
                jobs = await tag_both()
    assert jobs is not None, "the caller's block was cancelled at the engine's end"
    assert [job.row.state for job in jobs] == ["complete", "complete"]
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(300)
    )
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl",
        tmp_path / "b" / "rejects.jsonl",
        {f"p{i}" for i in range(1000, 1200)},
    )


async def test_the_outcome_of_a_job_the_closed_engine_cannot_finish_is_an_error(
    tmp_path: Path,
) -> None:
    """A job the state holds open (its rows taken in while the service was down) that the
    caller waits for without submitting it again: the engine, closed, ends without reading
    its manifest, and the wait said nothing (cancelled with the caller's block). It raises
    now, saying why; submitted to the next engine, the job completes exactly once."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    db = StateDB(tmp_path / "state")
    async with TaggerClient(config=client_config(f"http://127.0.0.1:{dead_port()}")) as client:
        with anyio.move_on_after(0.5):  # the service is down: then the process is gone
            async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as gone:
                await gone.submit(job_spec("a", manifest, tmp_path / "a"))
                await anyio.sleep_forever()
    raised: list[str] = []
    async with (
        running_service(ServiceConfig()) as svc,
        TaggerClient(config=client_config(svc.url)) as client,
    ):
        db = StateDB(tmp_path / "state")
        # (A stop that lands while a create is on its way, as it may on a loaded machine, has
        # the next engine look for that create's task for a request's deadline: not 30 s.)
        with anyio.fail_after(120):
            async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                job = e.job_of_key("a")
                assert job is not None
                e.close()
                with pytest.raises(FatalRunError, match="'a' is not complete") as caught:
                    await e.outcome(job)
                raised.append(str(caught.value))
        assert raised and "it was not submitted" in raised[0]
        db = StateDB(tmp_path / "state")
        with anyio.fail_after(30):
            async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                job = await e.submit(job_spec("a", manifest, tmp_path / "a"))
                await e.outcome(job)
    assert job.row.state == "complete"
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(300)
    )


async def test_a_run_on_a_client_of_the_caller_counts_its_own_retries(tmp_path: Path) -> None:
    """``run_pipeline`` given the caller's own TaggerClient, once while the service is down
    (cancelled by the caller) and again when it is up: the second summary reported the first
    run's retries as its own (a client's counters live as long as the client), and each later
    run on the client every earlier one's. A run's summary counts what that run did."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    port = free_port()
    async with TaggerClient(config=client_config(f"http://127.0.0.1:{port}")) as client:
        # The service is down: every request is retried. Cancelled once one was, its create
        # known refused (not a fixed 1 s, which on a loaded machine may come before any).
        async with anyio.create_task_group() as tg:

            async def cancel_once_retried() -> None:
                state = out.with_name(out.name + ".state")
                with anyio.fail_after(60):
                    while True:
                        _, ahead, unknown = taken_in(state)
                        if client.stats.retries and ahead and not unknown:
                            break
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

            tg.start_soon(cancel_once_retried)
            await run_pipeline([manifest], client=client, out=out, rejects=rej, engine=FAST)
        assert client.stats.retries > 0
        async with running_service(ServiceConfig(), port=port):
            with anyio.fail_after(30):
                summary = await run_pipeline(
                    [manifest], client=client, out=out, rejects=rej, engine=FAST
                )
    assert summary.complete
    assert (summary.retries, summary.rate_limited, summary.ambiguous_writes) == (0, 0, 0)
    assert_exactly_once(out, rej, ids_of(300))


async def test_a_run_cancelled_again_while_it_winds_down_leaves_its_state_free(
    tmp_path: Path,
) -> None:
    """asyncio's own cancel (``task.cancel()``, ``asyncio.timeout``) is not held off by anyio's
    shields: a ``run_pipeline`` task cancelled again while it wound down (a host's shutdown that
    cancels its tasks until they end) had its end cut short, the state never closed: the same
    call in the same process was refused, "state file ... is in use by another run", for as
    long as the process lived, and the client's connections were left open. The end of a run
    is finished whatever cancels it; the same call resumes at once, every row once, none sent
    twice."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig(rate=3000)) as svc:

        def run() -> Coroutine[Any, Any, RunSummary]:
            return run_pipeline([manifest], client=client_config(svc.url), out=out, rejects=rej)

        task = asyncio.ensure_future(run())
        with anyio.fail_after(30):
            while not out.exists() or out.stat().st_size == 0:  # results being written
                await asyncio.sleep(0.01)
            while not task.done():  # cancelled, and again, until it ends
                task.cancel()
                await asyncio.sleep(0.001)
        assert task.cancelled()
        with anyio.fail_after(30):
            summary = await run()
    assert summary.complete and summary.opened == "resumed"
    assert_exactly_once(out, rej, ids_of(n))
    assert svc.store.image_count == n  # no row sent twice


# The first night's connections belong to its loop, closed with them open (the script's
# way, not the client's): the garbage collector closes their sockets, with a ResourceWarning.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_of_the_caller_serves_a_run_in_each_new_event_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A nightly script that makes its ``TaggerClient`` once and runs each night's
    ``run_pipeline`` with ``asyncio.run``: the second night failed at its first request with
    aiohttp's bare "Event loop is closed" (the client's connection pools belonged to the first
    night's loop). A client whose loop is gone makes its pools anew in the running one, and
    closes the old ones: left unclosed, each logged "Unclosed connector" at ERROR on asyncio's
    logger, every night, in the host's logs."""
    started = threading.Event()
    stop = threading.Event()
    url: list[str] = []

    async def serve() -> None:
        async with running_service(ServiceConfig()) as svc:
            url.append(svc.url)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    server.start()
    try:
        assert started.wait(10)
        client = TaggerClient(config=client_config(url[0]))
        for night in range(2):
            manifest = write_csv(tmp_path / f"night{night}.csv", 200, start=1000 * night)
            out, rej = tmp_path / f"out{night}.jsonl", tmp_path / f"rej{night}.jsonl"
            run = run_pipeline([manifest], client=client, out=out, rejects=rej, engine=FAST)
            summary = asyncio.run(asyncio.wait_for(run, 30))
            assert summary.complete
            first = 1000 * night
            assert_exactly_once(out, rej, {f"p{i}" for i in range(first, first + 200)})
        asyncio.run(client.aclose())
        gc.collect()
        assert not [r.message for r in caplog.records if r.name == "asyncio"]
    finally:
        stop.set()
        server.join(10)
        gc.collect()  # (those sockets closed here, their warnings ignored, not in a later test)


async def test_a_state_handed_to_a_refused_run_is_closed(tmp_path: Path) -> None:
    """``run_pipeline(..., state=StateDB(path))`` closes the state it is handed, but not when
    it refused the run before starting it (a manifest that cannot be read, an output that is
    the manifest, stdin named twice): the state stayed open, its lock held, so the same
    call once the manifest was there was refused "state file ... is in use by another run"
    for as long as the process lived. A refused run closes it too."""
    manifest = write_csv(tmp_path / "m.csv", 100)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        refusals: list[tuple[list[str | Path], Path, type[Exception]]] = [
            ([tmp_path / "missing.csv"], out, ManifestError),  # not there yet
            ([manifest], manifest, ConfigError),  # the results path is the manifest
            (["-", "-"], out, ManifestError),  # stdin twice
        ]
        for manifests, results, error in refusals:
            db = StateDB(tmp_path / "state")
            with pytest.raises(error):
                await run_pipeline(
                    manifests,
                    client=client_config(svc.url),
                    out=results,
                    rejects=rej,
                    state=db,
                    engine=FAST,
                )
        db = StateDB(tmp_path / "state")  # (refused while the first was left open)
        with anyio.fail_after(30):
            summary = await run_pipeline(
                [manifest], client=client_config(svc.url), out=out, rejects=rej, state=db
            )
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(100))


async def test_a_run_cancelled_while_it_resumes_leaves_no_stream_unclosed(tmp_path: Path) -> None:
    """A resumed run cancelled while it looked its tasks up again (the service shedding load,
    503, and the caller's timeout expiring) left the three streams between its stages
    unclosed: each logged ``ResourceWarning: Unclosed <MemoryObjectSendStream ...>`` when
    collected, an error in a host's tests run with ``-W error``. They are closed; the same
    call then resumes, every row once, none sent twice."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.2, linger_seconds=0.05, rotate_images=1000, rotate_min_images=200
    )
    async with (
        running_service(ServiceConfig(rate=2000)) as svc,
        misbehaving(svc.url, Misbehaviour(storm_retry_after="0.3")) as proxy,
    ):

        async def run() -> RunSummary:
            return await run_pipeline(
                [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
            )

        async def left_in_flight() -> None:
            # Tasks left in flight: stopped once one is created and its answer committed
            # (not a fixed 0.6 s, which on a loaded machine may come before any create, and
            # the resume below would then have no task to look up).
            while not proxy.created:
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)
            tg.cancel_scope.cancel()

        ended: list[RunSummary] = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(left_in_flight)
                ended.append(await run())
        assert not ended, "the first run ended before it was stopped"
        proxy.rules.storm = 503
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with anyio.move_on_after(0.5) as scope:  # while it looks its tasks up again
                await run()
            assert scope.cancelled_caught
            gc.collect()
        assert not [str(w.message) for w in caught if w.category is ResourceWarning]
        proxy.rules.storm = None
        with anyio.fail_after(60):
            summary = await run()
    assert summary.complete and summary.opened == "resumed"
    assert_exactly_once(out, rej, ids_of(n))
    assert svc.store.image_count == n


def test_a_run_control_of_the_caller_serves_a_run_in_each_new_event_loop(tmp_path: Path) -> None:
    """A nightly script that makes its ``RunControl`` once (its SIGTERM handler calls
    ``control.stop()``) and runs each night's ``run_pipeline`` with ``asyncio.run``, as it does
    its ``TaggerClient``: the second night's run failed as it started, nothing tagged, on
    asyncio's ``RuntimeError: <asyncio.locks.Event ...> is bound to a different event loop`` (the
    control's events belonged to the first night's loop), and every night after it. A control
    serves a run in each loop; its stop still stops the run it is given to, which resumes."""
    started = threading.Event()
    stop = threading.Event()
    url: list[str] = []

    async def serve() -> None:
        async with running_service(ServiceConfig(rate=3000)) as svc:
            url.append(svc.url)
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    server.start()
    try:
        assert started.wait(10)
        control = RunControl()
        for night in range(2):
            manifest = write_csv(tmp_path / f"night{night}.csv", 300, start=1000 * night)
            out, rej = tmp_path / f"out{night}.jsonl", tmp_path / f"rej{night}.jsonl"
            run = run_pipeline(
                [manifest],
                client=client_config(url[0]),
                out=out,
                rejects=rej,
                engine=FAST,
                control=control,
            )
            summary = asyncio.run(asyncio.wait_for(run, 30))
            assert summary.complete
            first = 1000 * night
            assert_exactly_once(out, rej, {f"p{i}" for i in range(first, first + 300)})

        n = 6000
        manifest = write_csv(tmp_path / "night2.csv", n, start=10_000)
        out, rej = tmp_path / "out2.jsonl", tmp_path / "rej2.jsonl"

        async def stopped_night() -> RunSummary:
            async def stop_once_taken_in() -> None:
                while taken_in(tmp_path / "out2.jsonl.state")[0] == 0:
                    await asyncio.sleep(0.01)
                control.stop()  # (the night's SIGTERM)

            stopper = asyncio.ensure_future(stop_once_taken_in())
            try:
                return await run_pipeline(
                    [manifest],
                    client=client_config(url[0]),
                    out=out,
                    rejects=rej,
                    engine=FAST,
                    control=control,
                )
            finally:
                stopper.cancel()

        summary = asyncio.run(asyncio.wait_for(stopped_night(), 30))
        assert summary.interrupted and not summary.complete
        resumed = run_pipeline([manifest], client=client_config(url[0]), out=out, rejects=rej)
        summary = asyncio.run(asyncio.wait_for(resumed, 60))
        assert summary.complete and summary.opened == "resumed"
        assert_exactly_once(out, rej, {f"p{i}" for i in range(10_000, 10_000 + n)})
    finally:
        stop.set()
        server.join(10)


async def test_a_submit_under_way_when_the_engine_is_stopped_ends_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop (the daemon's SIGTERM) that ends the engine while a submit is recording its job:
    the job's completion watch was started on the engine's task group, already finished, and
    ``RuntimeError: This task group is not active`` left the caller (the daemon exited 1 on a
    traceback; the widened daemon fuzz met it once, seed 74). The job stays open in the state,
    unwatched, and the next engine finishes it exactly once. (The interleaving is forced: the
    stop lands as the job's outputs are opened.)"""
    from fashiontag_pipeline.engine import engine as engine_module

    manifest = write_csv(tmp_path / "m.csv", 300)
    real_open_job = engine_module.open_job
    async with (
        running_service(ServiceConfig()) as svc,
        TaggerClient(config=client_config(svc.url)) as client,
    ):
        control = RunControl()
        db = StateDB(tmp_path / "state")
        engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST, control=control)

        async def open_job_as_the_engine_stops(*args: Any, **kwargs: Any) -> Job:
            job = await real_open_job(*args, **kwargs)
            control.stop()
            with anyio.fail_after(10):
                await engine.ended.wait()
            return job

        monkeypatch.setattr(engine_module, "open_job", open_job_as_the_engine_stops)
        with anyio.fail_after(30):
            async with engine:
                await engine.submit(job_spec("a", manifest, tmp_path / "a"))
                await anyio.sleep_forever()
        monkeypatch.setattr(engine_module, "open_job", real_open_job)
        db = StateDB(tmp_path / "state")
        with anyio.fail_after(30):
            async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                job = await e.submit(job_spec("a", manifest, tmp_path / "a"))
                await e.outcome(job)
    assert job.row.state == "complete"
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(300)
    )
