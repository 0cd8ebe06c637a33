"""An ``Engine`` opened on a state whose open job was begun by an engine of the other
``namespaced`` setting (ids sent as ``JOB/ID`` by one, as they are by the other). Found by a
hunt; failed before its fix."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import StateConflictError
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, job_marks, job_spec, write_csv

FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.05, fsync_seconds=0.05, rotate_images=500
)


async def _engine_run(
    state: Path, url: str, manifest: Path, outdir: Path, namespaced: bool, *, stop: bool
) -> None:
    """Job ``a`` on an engine of ``namespaced``; ``stop``: gone (as a kill) once the state
    counts results lines written, the job left open."""
    db = StateDB(state)
    async with TaggerClient(config=client_config(url)) as client:
        engine = Engine(
            client=client, db=db, state=db.open_engine(), config=FAST, namespaced=namespaced
        )
        with anyio.fail_after(60), anyio.CancelScope() as gone:
            async with engine:
                job = await engine.submit(job_spec("a", manifest, outdir))
                if stop:
                    while job_marks(state)[1] <= 0:
                        await anyio.sleep(0.02)
                    gone.cancel()
                engine.close()
                await engine.outcome(job)


@pytest.mark.parametrize("first", [True, False], ids=["namespaced-then-not", "not-then-namespaced"])
async def test_an_engine_of_the_other_id_setting_is_refused_saying_so(
    tmp_path: Path, first: bool
) -> None:
    """A program that runs its job with ``Engine(..., namespaced=True)`` and, after a crash,
    starts again with ``Engine(...)`` (the default, False), or the other way round: refused
    with "does not end ... with a line of this run: rewritten since or lost its last bytes ...
    start over with --restart", which billed every row again; the state and the files were
    fine. The refusal now names the setting the state was made with, nothing touched, and the
    engine of that setting finishes the job, each row once."""
    manifest = write_csv(tmp_path / "a.csv", 5000)
    state = tmp_path / "state"
    out = tmp_path / "out"
    async with running_service(ServiceConfig(rate=2000)) as svc:
        await _engine_run(state, svc.url, manifest, out, first, stop=True)
        marks = job_marks(state)
        size = (out / "results.jsonl").stat().st_size
        db = StateDB(state)
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=FAST, namespaced=not first
            )
            with pytest.raises(StateConflictError) as refused, anyio.fail_after(30):
                async with engine:
                    await engine.submit(job_spec("a", manifest, out))
        said = str(refused.value)
        assert f"namespaced={first}" in said and "--restart" not in said, said
        assert job_marks(state) == marks
        assert (out / "results.jsonl").stat().st_size >= size
        await _engine_run(state, svc.url, manifest, out, first, stop=False)
    assert_exactly_once(out / "results.jsonl", out / "rejects.jsonl", ids_of(5000))
