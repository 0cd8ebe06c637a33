"""A job the state records complete, submitted again to a long-lived ``Engine`` (a program's
nightly loop, an Airflow task retried after it had finished): it is answered from the state,
at the outputs its outcomes are in. Found by a hunt; failed before its fix.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import StateConflictError, StateError
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, job_spec, write_csv

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=10.0)


@pytest.mark.parametrize("fail_fast", [True, False], ids=["run-like", "daemon-like"])
async def test_a_completed_job_submitted_with_other_outputs_is_refused_naming_its_own(
    tmp_path: Path, fail_fast: bool
) -> None:
    """Job ``a`` complete in ``night1/``, submitted again under the same key with
    ``night2/`` as its outputs: the state's record of its outputs was moved to ``night2/``
    (empty files made there), and the submit raised a StateError saying committed lines were
    "lost by the machine" and to "start over with --restart"; with ``fail_fast=False`` the job
    came back failed, "outputs lost", its outcomes whole in ``night1/``. Refused now
    (StateConflictError naming ``night1/``'s files), nothing made or recorded: the engine goes
    on, and the job at its own outputs (or at files moved there) is answered from the state."""
    manifest = write_csv(tmp_path / "a.csv", 400)
    other = write_csv(tmp_path / "b.csv", 300, start=5000)
    first, second = tmp_path / "night1", tmp_path / "night2"
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=FAST,
                namespaced=True,
                fail_fast=fail_fast,
            )
            with anyio.fail_after(60):
                async with engine:
                    submit = engine.submit
                    done = await engine.outcome(await submit(job_spec("a", manifest, first)))
                    images = svc.store.image_count
                    with pytest.raises(StateConflictError) as refused:
                        await engine.submit(job_spec("a", manifest, second))
                    assert str(first / "results.jsonl") in str(refused.value)
                    assert not second.exists()  # nothing made there
                    again = await engine.outcome(await submit(job_spec("a", manifest, first)))
                    assert again.failure is None
                    assert again.counters["settled"] == again.counters["accepted"] == 400
                    # Its files moved by the program once it was complete: answered there.
                    moved = tmp_path / "archive"
                    first.rename(moved)
                    there = await engine.outcome(await submit(job_spec("a", manifest, moved)))
                    assert there.failure is None and there.results.path == moved / "results.jsonl"
                    b = await engine.outcome(await submit(job_spec("b", other, second)))
                    engine.close()
    assert done.failure is None and b.failure is None
    assert svc.store.image_count == images + 300  # job a's rows never sent again
    assert_exactly_once(moved / "results.jsonl", moved / "rejects.jsonl", ids_of(400))
    assert_exactly_once(
        second / "results.jsonl", second / "rejects.jsonl", {f"p{i}" for i in range(5000, 5300)}
    )


@pytest.mark.parametrize("fail_fast", [True, False], ids=["run-like", "daemon-like"])
async def test_a_completed_job_submitted_again_never_cuts_what_another_job_wrote_since(
    tmp_path: Path, fail_fast: bool
) -> None:
    """Job ``a`` (300 rows) complete in ``out/``, then job ``b`` (500 rows) given the same
    outputs (one folder a program writes each job to), then ``a`` submitted again (a retried
    task): answered from the state, its outputs were cut back to its own checkpoints, so
    ``b``'s results file was cut mid-line at ``a``'s byte count, most of ``b``'s rows gone
    and ``a`` reported complete. A complete job's outputs are only looked at: ``b``'s files
    are left whole, and ``a`` says its lines are not there (a StateError; with
    ``fail_fast=False`` the job's failure)."""
    a = write_csv(tmp_path / "a.csv", 300)
    b = write_csv(tmp_path / "b.csv", 500, start=5000)
    out = tmp_path / "out"
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=FAST,
                namespaced=True,
                fail_fast=fail_fast,
            )
            with anyio.fail_after(60):
                async with engine:
                    submit = engine.submit
                    await engine.outcome(await submit(job_spec("a", a, out)))
                    done_b = await engine.outcome(await submit(job_spec("b", b, out)))
                    written = (out / "results.jsonl").read_bytes()
                    images = svc.store.image_count
                    if fail_fast:
                        with pytest.raises(StateError, match=r"results\.jsonl"):
                            await submit(job_spec("a", a, out))
                    else:
                        again = await engine.outcome(await submit(job_spec("a", a, out)))
                        assert again.failure is not None and "results.jsonl" in again.failure
                    engine.close()
    assert done_b.failure is None
    assert svc.store.image_count == images  # nothing sent again
    assert (out / "results.jsonl").read_bytes() == written
    assert_exactly_once(
        out / "results.jsonl", out / "rejects.jsonl", {f"p{i}" for i in range(5000, 5500)}
    )


async def test_an_engine_entered_again_after_it_ended_says_it_runs_once(tmp_path: Path) -> None:
    """A nightly loop that made its ``Engine`` once and entered ``async with engine:`` each
    night: the second night stopped on a bare ``StateError: the state is closed`` (the engine
    closes its state as it ends), naming neither the engine nor what to do. It is a
    RuntimeError saying an Engine runs once and to make a new one on the state opened again,
    nothing read or sent; that engine runs the night, every row once."""
    a = write_csv(tmp_path / "a.csv", 200)
    b = write_csv(tmp_path / "b.csv", 200, start=1000)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(client=client, db=db, state=db.open_engine(), config=FAST)
            with anyio.fail_after(30):
                async with engine:
                    await engine.outcome(await engine.submit(job_spec("a", a, tmp_path / "a")))
                    engine.close()
                images = svc.store.image_count
                with pytest.raises(RuntimeError, match=r"runs once.*new Engine"):
                    async with engine:
                        await engine.submit(job_spec("b", b, tmp_path / "b"))
                assert svc.store.image_count == images
                assert not (tmp_path / "b").exists()
                db = StateDB(tmp_path / "state")
                async with Engine(client=client, db=db, state=db.open_engine(), config=FAST) as e:
                    await e.outcome(await e.submit(job_spec("b", b, tmp_path / "b")))
    assert_exactly_once(
        tmp_path / "b" / "results.jsonl",
        tmp_path / "b" / "rejects.jsonl",
        {f"p{i}" for i in range(1000, 1200)},
    )
