"""A task whose status the service can no longer give: it is left out of the task list and every
``GET .../status`` of it is answered 200 with the spec's failure body, or 409. The other tasks
of the run are polled and read meanwhile; ``run`` stops after ``give_up_after`` naming the
task, and the daemon (which never gives up) goes on with the others. And a task list the
service no longer gives: the tasks' statuses are read instead."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from msgspec.structs import replace

from fashiontag_pipeline.engine import EngineConfig, RunControl, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import TASKS_OF_1000, client_config, read_outcomes, run_through, write_csv
from .proxy import MisbehavingProxy, Misbehaviour

ANSWERS = pytest.mark.parametrize("answer", [200, 409], ids=["200-failure", "409"])


async def _run(
    tmp_path: Path, answer: int, engine: EngineConfig, control: RunControl | None = None
) -> MisbehavingProxy:
    """3,000 rows in three tasks; the first one's status unreadable for ever."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    proxy = MisbehavingProxy("", Misbehaviour(unreadable_status={1}, poll_answer=answer))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            await run_pipeline(
                [manifest],
                client=client_config(proxy.url),
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=engine,
                control=control,
            )
    return proxy


@ANSWERS
async def test_run_reads_the_other_tasks_then_gives_up_naming_the_task(
    tmp_path: Path, answer: int
) -> None:
    engine = replace(TASKS_OF_1000, give_up_after=3.0)
    started = time.monotonic()
    with anyio.fail_after(20), pytest.raises(FatalRunError) as raised:
        await _run(tmp_path, answer, engine)
    assert time.monotonic() - started >= 3.0
    message = str(raised.value)
    assert "status" in message and "--give-up-after" in message, message
    outcomes = read_outcomes(tmp_path / "out.jsonl", tmp_path / "rej.jsonl")
    assert len(outcomes.results) == 2000 and not outcomes.rejects


@ANSWERS
async def test_a_daemon_like_engine_goes_on_with_the_other_tasks(
    tmp_path: Path, answer: int
) -> None:
    """give_up_after and stall_timeout infinite, as in the daemon: the unreadable task is
    waited for, the other two are read."""
    engine = replace(TASKS_OF_1000, give_up_after=float("inf"), stall_timeout=float("inf"))
    control = RunControl()
    out = tmp_path / "out.jsonl"

    async def watch() -> None:
        while not out.exists() or len(out.read_bytes().splitlines()) < 2000:
            await anyio.sleep(0.05)
        control.abort()

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            proxy = await _run(tmp_path, answer, engine, control)
    assert proxy.unreadable_polls >= 2
    assert len(read_outcomes(out, tmp_path / "rej.jsonl").results) == 2000


@ANSWERS
async def test_a_task_list_never_given_has_the_statuses_read_instead(
    tmp_path: Path, answer: int
) -> None:
    """Every ``GET`` of the task list answered with a failure (status still answers): the run
    is tracked by the tasks' statuses and completes, well within ``give_up_after``."""
    proxy = MisbehavingProxy("", Misbehaviour(unreadable_list=True, poll_answer=answer))
    engine = replace(TASKS_OF_1000, give_up_after=3.0)
    summary, _ = await run_through(tmp_path, 3000, proxy, engine, fail_after=20)
    assert summary.complete and proxy.unreadable_polls >= 1


async def test_polls_answered_429_are_said_rate_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The task list and the statuses answered 429 for a while: the warnings say the service
    is rate limiting them, not that it "does not give the task list" or "its status"."""
    rules = Misbehaviour(storm=429, storm_ops={"list", "status"}, storm_retry_after="0")
    proxy = MisbehavingProxy("", rules)

    async def calm_down() -> None:
        while proxy.storm_answers < 16:
            await anyio.sleep(0.02)
        rules.storm = None

    async with anyio.create_task_group() as tg:
        tg.start_soon(calm_down)
        summary, _ = await run_through(tmp_path, 2000, proxy, fail_after=20)
    assert summary.complete
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    said = " ".join(warnings)
    assert "the service is rate limiting the task list (HTTP 429)" in said, warnings
    assert "is rate limiting its status (HTTP 429)" in said, warnings
    assert "does not give" not in said, warnings
