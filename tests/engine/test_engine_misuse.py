"""The engine driven as a library (``async with Engine(...)``, ``submit``) the ways a program
misuses it: found by a hunt, each a lost or doubled row, an emptied results file, a state no
engine could start on again, or a wait for ever. Each submit that cannot be honoured is
refused with an error and records nothing.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline import ConfigError, StateConflictError, StateError, StateInUseError
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    assert_exactly_once,
    client_config,
    dead_port,
    ids_of,
    job_spec,
    read_outcomes,
    taken_in,
    write_csv,
)

FAST = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.05,
    fsync_seconds=10.0,
    rotate_images=3000,
    read_batch_rows=500,
)


#: Tasks rotate by age only after 5 s: rows written ahead while the service is down stay so.
SLOW_ROTATION = msgspec.structs.replace(FAST, rotate_seconds=5.0)


async def _written_ahead(tmp_path: Path, key: str, manifest: Path) -> None:
    """Job ``key`` (outputs in ``out/``) begun while the service is down: its rows are taken in
    and written ahead, then the process goes (the state in ``state`` keeps the job open)."""
    db = StateDB(tmp_path / "state")
    rows = len(manifest.read_bytes().splitlines()) - 1
    async with TaggerClient(config=client_config(f"http://127.0.0.1:{dead_port()}")) as client:
        engine = Engine(
            client=client, db=db, state=db.open_engine(), config=SLOW_ROTATION, namespaced=True
        )
        # Gone once every row is taken in, and written ahead as far as it goes with its creates
        # refused (not a fixed 2 s, which on a loaded machine may come before the rows are
        # read).
        with anyio.CancelScope() as gone:
            async with engine:
                job = await engine.submit(job_spec(key, manifest, tmp_path / "out"))
                with anyio.fail_after(60):
                    while True:
                        accepted, ahead, unknown = taken_in(tmp_path / "state")
                        if accepted >= rows and ahead and not unknown:
                            break
                        await anyio.sleep(0.02)
                gone.cancel()
                await engine.outcome(job)
    assert job.counters["accepted"] > 0


async def test_the_same_key_submitted_again_while_in_flight_writes_no_row_twice(
    tmp_path: Path,
) -> None:
    """A caller whose wait for a job was cancelled (a timeout) submits the job again with the
    same key, as the docs say a key resumes its job. The engine must not read the manifest a
    second time into the job in flight: either the second submit is refused, or it hands back
    the job in flight. Before: the manifest was read again from its first row, every row
    validated but not yet chunked was sent again (billed twice) and written twice to the
    results, and the job's counters claimed more rows than the manifest holds."""
    n = 6000
    manifest = write_csv(tmp_path / "a.csv", n)
    async with running_service(ServiceConfig(rate=5000)) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    job = await engine.submit(job_spec("a", manifest, tmp_path / "a"))
                    while job.counters["accepted"] < 1500:
                        await anyio.sleep(0.005)
                    with pytest.raises(StateConflictError, match="already in flight"):
                        await engine.submit(job_spec("a", manifest, tmp_path / "a"))
                    await engine.outcome(job)
                    engine.close()
    o = read_outcomes(tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl")
    twice = [i for i, k in collections.Counter(o.ids).items() if k > 1]
    assert not twice, f"{len(twice)} ids have two results lines"
    assert job.counters["accepted"] == n, job.counters
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(n)},
    )


async def test_a_submit_refused_for_a_locked_output_records_no_job(tmp_path: Path) -> None:
    """A second job given the outputs of a job in flight is refused (StateConflictError: the
    file is locked). The refusal happens after the job was recorded in the state, so the next
    engine on that state (the next daemon start, the next program run) resumes the ghost job
    and cuts its "outputs" back to its checkpoint, 0: the first job's complete results file
    is emptied. A refused submit must record nothing (or at least never truncate a file it
    never wrote)."""
    a = write_csv(tmp_path / "a.csv", 2000)
    b = write_csv(tmp_path / "b.csv", 500, start=5000)
    shared = tmp_path / "out"
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    ja = await engine.submit(job_spec("a", a, shared))
                    with pytest.raises(StateConflictError):  # the lock on the outputs
                        await engine.submit(job_spec("b", b, shared))
                    await engine.outcome(ja)
                    engine.close()
        assert_exactly_once(
            shared / "results.jsonl", shared / "rejects.jsonl", {f"p{i}" for i in range(2000)}
        )
        # The next engine on the same state, submitting nothing.
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    engine.close()
    assert_exactly_once(
        shared / "results.jsonl", shared / "rejects.jsonl", {f"p{i}" for i in range(2000)}
    )


async def test_a_submit_refused_for_an_unopenable_output_does_not_brick_the_state(
    tmp_path: Path,
) -> None:
    """A job whose results path cannot be opened (a directory there, a read-only folder) is
    refused by submit, as it should be; but it was recorded first, so every later engine on
    that state fails to start (StateError from ``async with Engine``), for every job, until
    the state is edited by hand."""
    manifest = write_csv(tmp_path / "a.csv", 300)
    (tmp_path / "bad" / "results.jsonl").mkdir(parents=True)
    async with running_service(ServiceConfig()) as svc:
        for attempt in range(2):
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
                with anyio.fail_after(60):
                    async with engine:
                        if attempt == 0:
                            with pytest.raises(StateError, match="cannot open the outputs"):
                                await engine.submit(job_spec("bad", manifest, tmp_path / "bad"))
                        good = await engine.submit(
                            job_spec(f"good{attempt}", manifest, tmp_path / f"g{attempt}")
                        )
                        await engine.outcome(good)
                        engine.close()
            assert engine.complete
    assert_exactly_once(
        tmp_path / "g1" / "results.jsonl",
        tmp_path / "g1" / "rejects.jsonl",
        {f"p{i}" for i in range(300)},
    )


async def test_close_while_a_submit_opens_its_manifest_loses_no_job(tmp_path: Path) -> None:
    """``engine.close()`` (or the end of the ``async with`` block, which closes) while a submit
    is still opening its manifest: the submit passed the "engine is closed" check, the source
    stage ended meanwhile, and the job was then recorded and added to a source that no longer
    reads. The caller's submit was cancelled (no error, no job), the engine said complete
    (``engine.complete`` True, the state marked complete), and the job stayed open in the
    state, never read. Either the submit must fail with an error, or its job must run."""
    manifest = write_csv(tmp_path / "a.csv", 300)
    got: dict[str, object] = {}
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )

            async def submit() -> None:
                try:
                    job = await engine.submit(job_spec("a", manifest, tmp_path / "a"))
                    got["job"] = job
                    await engine.outcome(job)
                except Exception as err:  # a refusal is a fine answer
                    got["error"] = err

            with anyio.fail_after(30):
                async with engine, anyio.create_task_group() as tg:
                    tg.start_soon(submit)
                    await anyio.sleep(0)  # the submit is opening its manifest
                    engine.close()
    left_open = [r.key for r in StateDB(tmp_path / "state").open_jobs()]
    # The submit under way when the engine closed has its job read to the end.
    assert "error" not in got, got
    assert got.get("job") is not None, "the submit neither returned nor failed"
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(300)},
    )
    assert engine.complete and not left_open, left_open


async def test_a_key_resumed_with_other_manifest_content_is_refused_or_tagged(
    tmp_path: Path,
) -> None:
    """A program keys its jobs by feed name ("nightly") and the process dies mid-run; the next
    night's dump is written to the same path and submitted under the same key. ``run`` refuses
    this (manifest fingerprints: exit 2, "other manifests"); ``Engine.submit`` does not look:
    it resumes the old job by row position, skips every row of the new file up to the old
    run's watermarks, and reports the job complete with none of the new ids in its outputs."""

    manifest = tmp_path / "nightly.csv"
    write_csv(manifest, 3000)
    config = SLOW_ROTATION
    await _written_ahead(tmp_path, "nightly", manifest)
    write_csv(manifest, 3000, start=100_000)  # night 2's dump, same path, other ids
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=config, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    with pytest.raises(StateConflictError, match="give new content a new key"):
                        await engine.submit(job_spec("nightly", manifest, tmp_path / "out"))
                    # Under its own key, night 2 is a job of its own.
                    job = await engine.submit(job_spec("nightly-2", manifest, tmp_path / "out2"))
                    await engine.outcome(job)
                    engine.close()
    assert_exactly_once(
        tmp_path / "out2" / "results.jsonl",
        tmp_path / "out2" / "rejects.jsonl",
        {f"p{i}" for i in range(100_000, 103_000)},
    )


async def test_two_jobs_on_an_engine_of_default_ids_are_refused_or_kept_apart(
    tmp_path: Path,
) -> None:
    """``Engine(...)`` defaults to ``namespaced=False`` (ids sent as they are: the one job of
    ``run``). Nothing stops a second submit: pages are then routed to whichever job was added
    last (``Jobs.only``), so job a's results are written into job b's results file, job a
    never settles, and ``engine.outcome(a)`` waits for ever. A second job must be refused
    (an error at submit) or kept apart."""
    a = write_csv(tmp_path / "a.csv", 1000)
    b = write_csv(tmp_path / "b.csv", 1000, start=10_000)
    async with running_service(ServiceConfig(rate=5000)) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST)
            with anyio.fail_after(30):
                async with engine:
                    ja = await engine.submit(job_spec("a", a, tmp_path / "a"))
                    with pytest.raises(StateConflictError, match="namespaced=True"):
                        await engine.submit(job_spec("b", b, tmp_path / "b"))
                    await engine.outcome(ja)
                    # Once a's job is complete, the engine takes the next one.
                    jb = await engine.submit(job_spec("b", b, tmp_path / "b"))
                    await engine.outcome(jb)
                    engine.close()
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl",
        tmp_path / "a" / "rejects.jsonl",
        {f"p{i}" for i in range(1000)},
    )
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl",
        tmp_path / "b" / "rejects.jsonl",
        {f"p{i}" for i in range(10_000, 11_000)},
    )


@pytest.mark.parametrize("consequence", [False, True])
async def test_a_key_refused_for_other_content_keeps_its_outputs_in_the_state(
    tmp_path: Path, consequence: bool
) -> None:
    """The refusal came after the state had taken the refused submit's output paths for the
    old job: the next start resumed it there and cut the new job's results back to the old
    job's checkpoint, or could not start at all."""
    manifest = tmp_path / "nightly.csv"
    write_csv(manifest, 3000)
    config = SLOW_ROTATION
    await _written_ahead(tmp_path, "nightly", manifest)
    write_csv(manifest, 3000, start=100_000)  # night 2: other content at the same path
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=config, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    with pytest.raises(StateConflictError, match="give new content a new key"):
                        await engine.submit(job_spec("nightly", manifest, tmp_path / "new"))
                    job = await engine.submit(job_spec("nightly-2", manifest, tmp_path / "new"))
                    await engine.outcome(job)
                    engine.close()
        if not consequence:
            row = StateDB(tmp_path / "state").find_job("nightly")
            assert row is not None
            # The refused submit must have recorded nothing:
            assert Path(row.results).parent == tmp_path / "out", row.results
        else:
            # The next engine on the state, submitting nothing (the old job is resumed at
            # whatever paths the state now records for it).
            db = StateDB(tmp_path / "state")
            async with TaggerClient(config=client_config(svc.url)) as client:
                engine = Engine(
                    client=client, db=db, state=db.open_engine(), config=config, namespaced=True
                )
                with anyio.fail_after(60):
                    async with engine:
                        engine.close()
    assert_exactly_once(
        tmp_path / "new" / "results.jsonl",
        tmp_path / "new" / "rejects.jsonl",
        {f"p{i}" for i in range(100_000, 103_000)},
    )


async def test_a_job_open_in_the_engine_is_resumed_only_at_its_own_outputs(
    tmp_path: Path,
) -> None:
    """A job the state holds open is opened, with its outputs, when the engine starts: a
    submit of its key naming other outputs would have the state count lines in files that
    job does not write."""
    manifest = write_csv(tmp_path / "m.csv", 2000)
    config = SLOW_ROTATION
    await _written_ahead(tmp_path, "m", manifest)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=config, namespaced=True
            )
            with anyio.fail_after(60):
                async with engine:
                    with pytest.raises(StateConflictError, match="submit it with those outputs"):
                        await engine.submit(job_spec("m", manifest, tmp_path / "elsewhere"))
                    job = await engine.submit(job_spec("m", manifest, tmp_path / "out"))
                    await engine.outcome(job)
                    engine.close()
    assert not (tmp_path / "elsewhere").exists()
    assert_exactly_once(
        tmp_path / "out" / "results.jsonl",
        tmp_path / "out" / "rejects.jsonl",
        {f"p{i}" for i in range(2000)},
    )


async def test_a_second_engine_on_the_state_of_an_engine_in_flight_is_refused(
    tmp_path: Path,
) -> None:
    """Two ``Engine`` objects made on one ``StateDB`` (a program that runs two feeds side by
    side and hands both the state it opened) shared its one SQLite connection from two state
    threads: both stopped with ``cannot start a transaction within a transaction`` or
    ``Cannot operate on a closed database`` (no row tagged), and the end of the one logged a
    traceback. The second engine is refused when it is made, saying what to do, and the first
    runs on: every row once, none sent twice."""
    n = 600
    a = write_csv(tmp_path / "a.csv", n)
    async with running_service(ServiceConfig(rate=4000)) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            first = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
            )
            with anyio.fail_after(30):
                async with first:
                    job = await first.submit(job_spec("a", a, tmp_path / "a"))
                    with pytest.raises(StateConflictError, match="one Engine") as refused:
                        Engine(
                            client=client,
                            db=db,
                            state=db.open_engine(),
                            config=FAST,
                            namespaced=True,
                        )
                    first.close()
                    await first.outcome(job)
    assert str(tmp_path / "state") in str(refused.value)
    assert first.complete
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(n)
    )
    assert svc.store.image_count == n


async def test_an_engine_on_the_state_an_ended_engine_closed_says_to_open_it_again(
    tmp_path: Path,
) -> None:
    """A program that opens its ``StateDB`` once and makes each night's ``Engine`` on it (the
    engine closes its state when it ends) had the second night fail with SQLite's bare
    ``Cannot operate on a closed database``. It says what happened and what to do; the state
    opened again runs the night, every row once."""
    a = write_csv(tmp_path / "a.csv", 200)
    b = write_csv(tmp_path / "b.csv", 200, start=1000)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            with anyio.fail_after(30):
                async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                    await e.outcome(await e.submit(job_spec("a", a, tmp_path / "a")))
            with pytest.raises(StateError, match=r"closed.*open it again"):
                db.open_engine()
            db = StateDB(tmp_path / "state")
            with anyio.fail_after(30):
                async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                    await e.outcome(await e.submit(job_spec("b", b, tmp_path / "b")))
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(200)
    )
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl",
        tmp_path / "b" / "rejects.jsonl",
        {f"p{i}" for i in range(1000, 1200)},
    )


async def test_a_submit_to_an_engine_not_started_is_refused(tmp_path: Path) -> None:
    """``Engine(...)`` made but never entered (``async with`` forgotten): ``submit`` recorded
    the job and opened (and locked) its outputs, and then ``outcome`` and ``wait`` waited for
    ever, nothing being read or sent. Both refuse at once, saying how to start it, nothing
    recorded; the engine entered afterwards runs the job, every row once."""
    a = write_csv(tmp_path / "a.csv", 200)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST)
            with anyio.fail_after(10):
                with pytest.raises(RuntimeError, match="async with"):
                    await engine.submit(job_spec("a", a, tmp_path / "a"))
                with pytest.raises(RuntimeError, match="async with"):
                    await engine.wait()
            assert not (tmp_path / "a").exists()
            with anyio.fail_after(30):
                async with engine:
                    assert engine.job_of_key("a") is None  # (nothing recorded)
                    job = await engine.submit(job_spec("a", a, tmp_path / "a"))
                    engine.close()
                    await engine.outcome(job)
    assert_exactly_once(
        tmp_path / "a" / "results.jsonl", tmp_path / "a" / "rejects.jsonl", ids_of(200)
    )


@pytest.mark.parametrize("output", ["results", "rejects"])
async def test_a_submit_whose_output_is_the_file_stdin_reads_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """A program run as ``python tag.py < products.csv`` that submits ``JobSpec(manifests=["-"],
    results=Path("products.csv"), ...)`` (its own name given as an output by a slip): ``run``
    and ``run_pipeline`` refuse it, but ``Engine.submit`` left stdin out of its same-file check.
    The sink cut the catalogue to 0 bytes as it opened the outputs, before its rows were read:
    the catalogue lost. The submit is refused now (ConfigError naming stdin), nothing cut."""
    catalogue = write_csv(tmp_path / "products.csv", 300)
    before = catalogue.read_bytes()
    outputs = {"results": tmp_path / "results.jsonl", "rejects": tmp_path / "rejects.jsonl"}
    outputs[output] = catalogue
    spec = JobSpec(key="a", manifests=["-"], results=outputs["results"], rejects=outputs["rejects"])
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            with catalogue.open() as stdin:
                monkeypatch.setattr("sys.stdin", stdin)
                with anyio.fail_after(30):
                    async with Engine(
                        client=client, db=db, state=db.open_engine(), config=FAST
                    ) as engine:
                        with pytest.raises(ConfigError, match="stdin"):
                            await engine.submit(spec)
                        assert engine.job_of_key("a") is None  # (nothing recorded)
                        engine.close()
        tasks = len(svc.store.tasks)
    assert catalogue.read_bytes() == before, "the catalogue on stdin was cut"
    assert tasks == 0


async def test_a_second_job_of_stdin_while_one_reads_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program fed a catalogue on a pipe (``export | python tag.py``) that submits a job of
    stdin (``-``) while another job of stdin is in flight (a second key for the same input, a
    loop that submits ``-`` per argument): the second submit read the start of what was left
    of the stream to learn its format, then failed (not a CSV with a header), and those bytes
    were gone from the first job, which completed with a thousand rows fewer and no word of
    them (no reject, ``outcome`` returned). One job reads stdin at a time: the second submit is
    refused before it reads a byte (StateConflictError naming the job that reads it)."""
    n = 20000
    data = write_csv(tmp_path / "catalogue.csv", n).read_bytes()
    read_end, write_end = os.pipe()
    feeder = threading.Thread(target=_feed, args=(write_end, data), daemon=True)
    feeder.start()
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            with open(read_end) as stdin:
                monkeypatch.setattr("sys.stdin", stdin)
                with anyio.fail_after(60):
                    async with Engine(
                        client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
                    ) as engine:
                        first = await engine.submit(_stdin_job(tmp_path, "x"))
                        with pytest.raises(StateConflictError, match=r"stdin .* job 'x'"):
                            await engine.submit(_stdin_job(tmp_path, "y"))
                        assert engine.job_of_key("y") is None  # (nothing recorded)
                        engine.close()
                        await engine.outcome(first)
    feeder.join()
    assert_exactly_once(
        tmp_path / "x" / "results.jsonl", tmp_path / "x" / "rejects.jsonl", ids_of(n)
    )


def _feed(fd: int, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError), open(fd, "wb") as pipe:
        pipe.write(data)


def _stdin_job(tmp_path: Path, key: str) -> JobSpec:
    out = tmp_path / key
    return JobSpec(
        key=key, manifests=["-"], results=out / "results.jsonl", rejects=out / "rejects.jsonl"
    )


@pytest.mark.parametrize("given", ["pipe", "file"])
async def test_a_stdin_submit_refused_after_its_first_read_leaves_stdin_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """A program's submit of stdin refused after it had read stdin's first chunk to learn
    its format (its outputs locked by a job in flight): that chunk was gone, and the
    program's retry (other outputs) read the stream from where the refused one stopped: a
    CSV's header and first rows lost, the rest read as rows of no known columns (on a file
    redirected in, shorter than a read, the retry found stdin empty). The bytes a refused
    submit read are given first to the next reader of stdin: every row is tagged."""
    n = 20000
    other = write_csv(tmp_path / "other.csv", 50)
    catalogue = write_csv(tmp_path / "catalogue.csv", n)
    stdin_fd: int | Path = catalogue
    feeder = None
    if given == "pipe":
        stdin_fd, write_end = os.pipe()
        feeder = threading.Thread(target=_feed, args=(write_end, catalogue.read_bytes()))
        feeder.start()
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            with open(stdin_fd) as stdin:
                monkeypatch.setattr("sys.stdin", stdin)
                with anyio.fail_after(60):
                    async with Engine(
                        client=client, db=db, state=db.open_engine(), config=FAST, namespaced=True
                    ) as engine:
                        busy = _stdin_job(tmp_path, "a")
                        first = await engine.submit(
                            JobSpec(
                                key="a",
                                manifests=[str(other)],
                                results=busy.results,
                                rejects=busy.rejects,
                            )
                        )
                        locked = JobSpec(
                            key="b", manifests=["-"], results=busy.results, rejects=busy.rejects
                        )
                        with pytest.raises(StateInUseError):
                            await engine.submit(locked)
                        assert engine.job_of_key("b") is None  # (nothing recorded)
                        second = await engine.submit(_stdin_job(tmp_path, "b"))
                        engine.close()
                        await engine.outcome(first)
                        await engine.outcome(second)
    if feeder is not None:
        feeder.join()
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl", tmp_path / "b" / "rejects.jsonl", ids_of(n)
    )
