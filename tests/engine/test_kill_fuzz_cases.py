"""Cases a kill -9 fuzz of ``fashiontag run`` found (random kills, faults and misbehaving
answers); each test failed before its fix and holds its case exactly, with no timing."""

from __future__ import annotations

import collections
import os
import signal
import textwrap
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline.engine import FatalRunError, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service import app as service_app

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    read_outcomes,
    run_args,
    write_csv,
)
from .proxy import Misbehaviour, misbehaving


async def test_a_create_answered_with_the_id_of_a_task_still_being_adopted(
    tmp_path: Path,
) -> None:
    """The first create is applied and answered 204 (no id: the engine looks for its task in
    the list, which shows it a moment later); the second create is applied to that same task
    and answered with its id (a service that merges creates). The second answer arrives
    first, so the id is not yet the run's; then the list shows the task under the first
    create's token and the engine adopts it as well: two of the run's tasks under one id.
    The tracker then takes the task for forgotten (its description is the other token's),
    sends its rows again and reads its results too: ids written twice, others never, and the
    run may report complete (exit 0). The run must stop at the adoption, as
    it does when such an answer comes second, and its resume end with every id exactly once."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    rules = Misbehaviour(merge_creates={2}, no_content_writes={"POST"}, list_lag=1.0)
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, rules) as proxy:
            with (
                anyio.fail_after(60),
                pytest.raises(FatalRunError, match="given to this run before"),
            ):
                await run_pipeline(
                    [manifest], client=client_config(proxy.url), out=out, rejects=rej,
                    engine=TASKS_OF_1000,
                )  # fmt: skip
        assert proxy.merged == [proxy.created[0]]
        ids = read_outcomes(out, rej).ids
        twice = [i for i, c in collections.Counter(ids).items() if c > 1]
        assert not twice, f"{len(twice)} ids written twice"
        # The same command against a service that gives each task its own id finishes.
        with anyio.fail_after(60):
            again = await run_pipeline(
                [manifest], client=client_config(svc.url), out=out, rejects=rej,
                engine=TASKS_OF_1000,
            )  # fmt: skip
        assert again.complete
    assert_exactly_once(out, rej, ids_of(n))


#: Loaded by the engine at start (``sitecustomize``): with ``HOOK_KILL_AT_PAST_END`` set, the
#: engine SIGKILLs itself when, a task's last page committed, rows of it are still without a
#: line and the page past its count is about to be asked for them.
HOOK = textwrap.dedent(
    """
    import os, signal
    if os.environ.get("HOOK_KILL_AT_PAST_END"):
        from fashiontag_pipeline.engine import pagers
        _past_end = pagers.ResultPagers._past_end
        async def past_end(self, entry):
            sent, seen = entry.sent, entry.seen
            if sent is not None and seen is not None and sent - seen:
                os.kill(os.getpid(), signal.SIGKILL)
            await _past_end(self, entry)
        pagers.ResultPagers._past_end = past_end
    """
)


async def test_kill_9_before_the_page_past_the_count_then_resume_bills_no_row_twice(
    tmp_path: Path,
) -> None:
    """A service whose result offsets count from 1 answers each page one row early, so a
    task's last row comes only from one page past its count, which the engine asks for once
    the last page is committed. Killed (SIGKILL) between that commit and that page, the resume
    found the task read to its count and sent its last row again: a second task, the image
    billed twice, although the row was in a task whose results were there to read."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    n = 1000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    pythonpath = os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(one_based_offsets=True)) as proxy:
            args = run_args(proxy.url, out, str(manifest), "--linger", "0.2")
            with anyio.fail_after(60):
                killed = await anyio.run_process(
                    args,
                    check=False,
                    env={**ENV, "PYTHONPATH": pythonpath, "HOOK_KILL_AT_PAST_END": "1"},
                )
            assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-400:]
            assert svc.store.image_count == n
            with anyio.fail_after(60):
                resumed = await anyio.run_process(args, check=False, env=ENV)
            assert resumed.returncode == 0, resumed.stderr.decode()[-400:]
        billed = svc.store.image_count
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert billed == n, f"{billed - n} images billed twice"


async def test_a_later_bad_row_with_a_duplicate_id_is_a_duplicate_id_reject(
    tmp_path: Path,
) -> None:
    """An id repeated in the manifest: the first row gets the outcome, each later row is one
    ``duplicate id`` reject (README, docs/engine.md). A later row that is also invalid (an
    ``ftp://`` URL) was rejected for its URL instead: the id then had a result and a reject
    of its own, two outcomes for whoever counts them (the fuzz's check, assert_exactly_once)."""
    manifest = write_csv(tmp_path / "m.csv", 20, extra=["p3,ftp://nope/x.jpg,acme,TOP"])
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        with anyio.fail_after(30):
            summary = await run_pipeline(
                [manifest], client=client_config(svc.url), out=out, rejects=rej,
                engine=TASKS_OF_1000,
            )  # fmt: skip
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(20), duplicates=1)


async def test_rows_of_a_merged_create_count_that_send_toward_max_sends(tmp_path: Path) -> None:
    """The second create is applied to the first task and answered with its id (a service
    that merges creates): the run stops, state saved. Its rows were taken (billed) by the
    service, yet the resume sent them again with the send count they had before, as for a
    create whose fate is unknown: with ``max_sends = 1`` each of them was billed twice, and
    with forgotten tasks after it ``max_sends + 1`` times in all (kill -9 fuzz rfz2, seed
    100014). A send the service is known to have taken counts toward ``max_sends``."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(TASKS_OF_1000, max_sends=1)
    async with running_service(ServiceConfig()) as svc:
        store = svc.app[service_app.STATE].store
        async with misbehaving(svc.url, Misbehaviour(merge_creates={2})) as proxy:
            with (
                anyio.fail_after(60),
                pytest.raises(FatalRunError, match="given to this run before"),
            ):
                await run_pipeline(
                    [manifest], client=client_config(proxy.url), out=out, rejects=rej,
                    engine=engine,
                )  # fmt: skip
        assert proxy.merged == [proxy.created[0]]
        with anyio.fail_after(60):
            again = await run_pipeline(
                [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=engine
            )  # fmt: skip
        assert again.complete
        billed = collections.Counter(i for t in store.tasks.values() for i in t.ids)
    assert_exactly_once(out, rej, ids_of(n))
    over = sorted(i for i, c in billed.items() if c > engine.max_sends)
    assert not over, f"{len(over)} ids billed more than max_sends = 1 times, e.g. {over[:3]}"


async def test_two_creates_answered_with_one_new_id_at_the_same_moment_stop_the_run() -> None:
    """The full suite, in parallel workers, once found the merged-create test above finishing
    without the stop: the two creates' answers (one id) were checked at the same moment, each
    check asked the state whether the id was known (a thread hop), neither found it, and both
    chunks were attached to one task (their results read as one task's). The check and the
    claim of a new id are now one step on the event loop. Driven here on the writer's check
    itself, with a state that answers slowly, since the interleaving cannot be forced over
    HTTP."""
    from types import SimpleNamespace

    from fashiontag_pipeline.engine.batcher import TaskWriter

    commits: list[dict[str, object]] = []

    class SlowJournal:
        db = SimpleNamespace(task_known=lambda task_id: False)

        async def run(self, fn: object, *args: object) -> object:
            await anyio.sleep(0.05)  # the state thread, busy
            assert callable(fn)
            return fn(*args)

        async def commit(self, **kwargs: object) -> None:
            commits.append(kwargs)

    writer = object.__new__(TaskWriter)  # only what the check uses: its tasks, book, journal
    writer.tasks = {}
    writer.book = SimpleNamespace(entries={})  # type: ignore[assignment]
    writer._checking = set()
    writer.journal = SlowJournal()  # type: ignore[assignment]

    async def create_answered(chunk_id: int) -> None:
        await writer._check_new_id("T1", SimpleNamespace(chunk_id=chunk_id))  # type: ignore[arg-type]
        writer.tasks["T1"] = SimpleNamespace(chunk_id=chunk_id)  # type: ignore[assignment]

    with pytest.RaisesGroup(pytest.RaisesExc(FatalRunError, match="given to this run before")):
        async with anyio.create_task_group() as tg:
            tg.start_soon(create_answered, 1)
            tg.start_soon(create_answered, 2)
    assert len(commits) == 1, commits  # the second chunk is recorded as the task's orphan
