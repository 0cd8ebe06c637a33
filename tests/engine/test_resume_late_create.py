"""A run killed while a create was on its way to a service slow to apply it, then resumed: the
resume looks for the create's task long enough to see it applied late (until the client's
request deadline has gone by since it was sent, as the state records), and does not create its
rows again (two tasks of the same rows, each row billed twice); a resume long after the kill
does not wait."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
from aiohttp import web

from fashiontag_pipeline._clock import ServerClock
from fashiontag_pipeline._config import Timeout
from fashiontag_pipeline.engine.resume import START_LOOK_CAP, late_look
from fashiontag_pipeline.engine.state import open_state
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, dead_port, run_args, short_deadline, write_csv
from .proxy import BULK, MisbehavingProxy, Misbehaviour


class SlowCreate(MisbehavingProxy):
    """The proxy in front of a service slow to take writes: the first create is held (no
    answer), and applied by the service ``delay`` seconds after it came."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__(upstream, Misbehaviour())
        self.delay = delay
        self.received = anyio.Event()
        self.applied = anyio.Event()
        self.late: asyncio.Task[None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.received.is_set():
            body = await request.read()
            self.late = self.create_later(request, body, self.delay, self.applied)
            self.received.set()
            await self.applied.wait()  # (no answer: the client is killed meanwhile)
            return web.Response(status=504)
        return await super().handle(request)


async def killed_after_a_create(
    tmp_path: Path, proxy: SlowCreate, timeout: float, state: Path | str | None = None
) -> list[str]:
    """A run of 50 rows through ``proxy`` killed (SIGKILL) once its create came: the args of
    the same command (a client deadline of ``timeout`` s, ``list_lag`` 0.5 s; the state
    ``state``, a file of ``tmp_path`` by default)."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "s.state" if state is None else state
    args = run_args(proxy.url, out, str(manifest), "--state", str(state))
    args += [*short_deadline(tmp_path, timeout), "--linger", "0.1"]
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    with anyio.fail_after(30):
        await proxy.received.wait()
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.aclose()
    return args


async def timed_run(
    args: list[str], bound: float, env: dict[str, str] = ENV
) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """``args`` run to their end (within ``bound`` seconds), and the seconds they took."""
    started = time.monotonic()
    with anyio.fail_after(bound):
        done = await anyio.run_process(args, check=False, env=env)
    return done, time.monotonic() - started


def assert_rows_once(
    resumed: subprocess.CompletedProcess[bytes],
    out: Path,
    tasks: list[list[str]] | None = None,
    *,
    one_task: bool = False,
) -> None:
    """The resume ended (exit 0) with each of the 50 rows once in its outputs; with ``tasks``
    (the ids each task of the service holds), no row in two tasks (each billed once), or
    (``one_task``) all of them in one."""
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(50)})
    if tasks is None:
        return
    if one_task:
        assert sorted(len(ids) for ids in tasks) == [50]
        return
    held = [i for ids in tasks for i in ids]
    assert len(held) == len(set(held)) == 50, f"{len(tasks)} tasks hold {len(held)} rows"


async def killed_and_resumed_once(
    tmp_path: Path,
    proxy: SlowCreate,
    state: Path | str | None = None,
    before_resume: Callable[[], None] | None = None,
) -> float:
    """A run killed after its first create went to ``proxy`` (which applies it late), resumed
    at once with a request deadline of 4 s (``before_resume`` run between): every row tagged
    once, in one task. The seconds the resume took."""
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 4.0, state)
            if before_resume is not None:
                before_resume()
            started = time.monotonic()
            with anyio.fail_after(30):
                resumed = await anyio.run_process(args, check=False, env=ENV)
                await proxy.applied.wait()
            took = time.monotonic() - started
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert_rows_once(resumed, out, tasks)
    return took


async def test_a_create_on_its_way_at_a_kill_and_applied_late_is_not_created_again(
    tmp_path: Path,
) -> None:
    """A run killed (SIGKILL) right after it sent a create, which the service applied 3 s
    later. The resume looked for the create's task (its token in the state, no task id) for
    ``list_lag`` (0.5 s) only, not found it, and created the rows again: two tasks of the same
    rows, each billed twice, one never read. A create still on its way when the run died is
    looked for as long as a request may go unanswered (the client's deadline, 4 s) besides."""
    assert await killed_and_resumed_once(tmp_path, SlowCreate("", 3.0)) < 15


async def test_sigterm_while_a_resume_looks_for_a_create_stops_it(tmp_path: Path) -> None:
    """The look of a resume for a create of unknown fate (here up to a minute: a client
    deadline of 60 s, the create never applied) ends at SIGTERM, as any wait of a resume."""
    proxy = SlowCreate("", 3600.0)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 60.0)
            proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
            try:
                # Stopped once it says it looks (not a fixed 2 s, which on a loaded machine may
                # come while it starts: a stop then ends it with 130 too, and tests nothing).
                assert proc.stderr is not None
                said = b""
                with anyio.fail_after(60):
                    while b"its task is looked for" not in said:
                        said += await proc.stderr.receive()
                assert proc.returncode is None
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(10):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.aclose()
                assert proxy.late is not None
                proxy.late.cancel()
                proxy.applied.set()
        assert len(svc.store.tasks) == 0  # (not created again)
    assert proc.returncode == 130


def _in_state(location: Path | str, sql: str) -> None:
    """One statement run on a state (SQLite or PostgreSQL), committed."""
    db = open_state(location)
    try:
        with db.transaction():
            db.db.execute(sql)
    finally:
        db.close()


async def test_a_resume_long_after_a_kill_does_not_wait_for_the_create_it_sent(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """Each chunk's state row says when it was written ahead (its create sent): a resume looks
    for a create of unknown fate until the client's request deadline has gone by since then
    (and list_lag), not for the whole deadline again. Here the kill came an hour before the
    resume (the next night's cron; the state's times moved back an hour, in the service's clock
    too, as a create written once the run had seen a ``Date`` records it: this run's first
    create records none, and would be looked for the whole deadline): with a deadline of 60 s,
    the resume does not wait a minute for a create that cannot be applied any more."""
    proxy = SlowCreate("", 3600.0)
    out = tmp_path / "out.jsonl"
    state = state_location("late")
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 60.0, state)
            assert proxy.late is not None
            proxy.late.cancel()  # (never applied)
            proxy.applied.set()
            _in_state(
                state,
                "UPDATE chunks SET written_at = written_at - 3600, service_at = written_at - 3600",
            )
            resumed, took = await timed_run(args, 20)
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert_rows_once(resumed, out, tasks, one_task=True)
    assert took < 15


async def test_a_state_of_an_earlier_version_looks_for_a_create_the_whole_deadline(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """A state written before chunks kept their time (no ``written_at`` column; added at the
    open, NULL: unknown): the resume looks for the create for the whole deadline (4 s), and
    finds it applied 3 s after it came, not creating its rows again."""
    state = state_location("old")
    await killed_and_resumed_once(
        tmp_path,
        SlowCreate("", 3.0),
        state,
        lambda: _in_state(state, "ALTER TABLE chunks DROP COLUMN written_at"),
    )


class RefusedThenSlow(SlowCreate):
    """Creates answered 503 for their first ``refusing`` seconds (the run sends the create
    again, with the same token), then one held and applied ``delay`` seconds later."""

    def __init__(self, upstream: str, delay: float, refusing: float) -> None:
        super().__init__(upstream, delay)
        self.refusing = refusing
        self.first: float | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.received.is_set():
            now = time.monotonic()
            self.first = now if self.first is None else self.first
            if now - self.first < self.refusing:
                await request.read()
                return web.Response(status=503, text="busy")
        return await super().handle(request)


async def test_a_create_sent_again_before_the_kill_is_looked_for_from_its_last_send(
    tmp_path: Path,
) -> None:
    """A create refused (503) for 2.5 s, sent again with its token, then held by a service
    that applied it 3 s later, the run killed meanwhile. The time a resume counts from is
    its last send, not its write-ahead: counted from the write-ahead, the look (a deadline of
    4 s, list_lag 0.5 s) ended before the create was applied, and the rows were created again
    (each billed twice)."""
    await killed_and_resumed_once(tmp_path, RefusedThenSlow("", 3.0, 2.5))


class RateLimitedThenSlow(SlowCreate):
    """The first create answered 429 with a Retry-After of ``wait`` seconds (the client sends
    it again itself, after that wait), the next one held and applied ``delay`` seconds later."""

    def __init__(self, upstream: str, delay: float, wait: int) -> None:
        super().__init__(upstream, delay)
        self.wait = wait
        self.limited = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.limited:
            self.limited = True
            await request.read()
            return web.Response(status=429, headers={"Retry-After": str(self.wait)})
        return await super().handle(request)


async def test_a_create_the_client_sent_again_after_a_429_is_looked_for_from_that_send(
    tmp_path: Path,
) -> None:
    """A create answered 429 with a Retry-After of 5 s, sent again by the client after it (a
    retry of the same request, not of the engine), held by a service that applied it 3 s
    later, the run killed meanwhile. The resume counted from the first send (the chunk's
    write-ahead): its look (a deadline of 4 s, list_lag 0.5 s) was over at once, and the rows
    were created again before the late create was applied (each billed twice)."""
    await killed_and_resumed_once(tmp_path, RateLimitedThenSlow("", 3.0, 5))


def test_the_look_lasts_until_the_deadline_has_gone_by_since_the_create_was_sent() -> None:
    """:func:`late_look` (seconds besides list_lag; a deadline of 10 s, list_lag 5 s) over
    chunks as the state gives them: (chunk_id, state, task_id, token, body, written_at,
    service_at), of an older build here (service_at None)."""

    def run(daemon: bool = False, total: float = 10.0) -> Any:
        return cast(
            Any,
            SimpleNamespace(
                client=SimpleNamespace(timeout=Timeout(total=total), server_clock=ServerClock()),
                config=SimpleNamespace(list_lag=5.0),
                jobs=SimpleNamespace(ids=SimpleNamespace(namespaced=daemon)),
            ),
        )

    now = 1_000_000.0

    def pending(written_at: float | None) -> tuple[Any, ...]:
        return (1, "pending", None, "r-t1", b"", written_at, None)

    assert late_look(run(), [pending(None)], now) == 10.0  # (unknown: the whole deadline)
    assert late_look(run(), [pending(now - 3)], now) == 7.0
    assert late_look(run(), [pending(now - 12)], now) == -2.0  # (list_lag less 2 s)
    assert late_look(run(), [pending(now - 3600)], now) == -5.0  # (one look)
    assert late_look(run(), [pending(now + 60)], now) == 10.0  # (the clock set back)
    assert late_look(run(), [pending(now - 3600), pending(now - 1)], now) == 9.0
    # A token of an applied create (an orphan, its task unknown): list_lag, as before.
    orphan = (2, "orphan", None, "r-t2", b"", now - 3600, None)
    assert late_look(run(), [pending(now - 3600), orphan], now) == 0.0
    # Appends (a task id) and chunks with no token are not looked for.
    assert late_look(run(), [(3, "pending", "task-1", None, b"", now, None)], now) == 0.0
    assert late_look(run(daemon=True, total=300.0), [pending(None)], now) == START_LOOK_CAP


#: With ``HOOK_TERM_BEFORE_CREATE`` set, the run SIGTERMs itself as its first create is about
#: to be sent (its chunk written ahead with the create's token), and lets the drain begin.
TERM_HOOK = """
import os, signal
if os.environ.get("HOOK_TERM_BEFORE_CREATE"):
    from fashiontag_pipeline._callctx import WRITES_STOPPED
    from fashiontag_pipeline.engine import writes
    _create = writes.TaskWrites._create
    fired = []
    async def term_then_create(self, *args, **kwargs):
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
            await WRITES_STOPPED.get().wait()
        return await _create(self, *args, **kwargs)
    writes.TaskWrites._create = term_then_create
"""


async def test_a_resume_after_a_stop_that_kept_a_create_from_being_sent_does_not_wait(
    tmp_path: Path,
) -> None:
    """SIGTERM right after a chunk was written ahead with its create's token: the drain kept
    the create from being sent. The resume took it for a create that may have been on its way
    and looked for its task for the whole request deadline (70 s with the defaults; a daemon's
    restart after every deploy, 30 s). A create the run knows it never sent is recorded so:
    the resume looks at the task list once and sends its rows."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(TERM_HOOK)
    pythonpath = os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")])
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    args = run_args("URL", out, str(manifest), "--state", str(tmp_path / "s.state"))
    async with running_service(ServiceConfig()) as svc:
        args[args.index("URL")] = svc.url
        with anyio.fail_after(30):
            stopped = await anyio.run_process(
                args,
                check=False,
                env={**ENV, "PYTHONPATH": pythonpath, "HOOK_TERM_BEFORE_CREATE": "1"},
            )
        assert stopped.returncode != 0, stopped.stderr.decode()[-800:]
        assert not svc.store.tasks, "the create was sent"
        resumed, took = await timed_run(args, 40)
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert_rows_once(resumed, out, tasks, one_task=True)
    assert took < 15


async def test_a_resume_after_the_service_was_down_does_not_wait_for_creates_never_delivered(
    tmp_path: Path,
) -> None:
    """Last night's run gave up (exit 1): the service was down, each create refused at the
    connection. The resume took the create written ahead for one that may have been on its
    way and waited the whole request deadline (70 s with the defaults) before sending its
    rows. A create never delivered (the connection refused), or answered with an error, is
    recorded so: the resume looks at the task list once."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    state = ["--state", str(tmp_path / "s.state"), "--linger", "0.1"]
    dead = f"http://127.0.0.1:{dead_port()}"
    with anyio.fail_after(30):
        first = await anyio.run_process(
            run_args(dead, out, str(manifest), *state, "--give-up-after", "1"),
            check=False,
            env=ENV,
        )
    assert first.returncode == 1, first.stderr.decode()[-800:]
    async with running_service(ServiceConfig()) as svc:
        resumed, took = await timed_run(run_args(svc.url, out, str(manifest), *state), 40)
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert_rows_once(resumed, out, tasks, one_task=True)
    assert took < 15


async def test_a_resume_after_a_refused_key_does_not_wait_for_the_create_refused(
    tmp_path: Path,
) -> None:
    """The first run used a key the service refuses (401: the run stops at once, exit 1); the
    same command with the right key then waited the whole request deadline (70 s) for that
    create, which the service had answered, and so never took."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out = tmp_path / "out.jsonl"
    state = ["--state", str(tmp_path / "s.state"), "--linger", "0.1"]
    async with running_service(ServiceConfig(bulk_api_keys=("right-key",))) as svc:
        args = run_args(svc.url, out, str(manifest), *state)
        with anyio.fail_after(30):
            first = await anyio.run_process(
                args, check=False, env={**ENV, "FASHIONTAG_BULK_API_KEY": "wrong-key"}
            )
        assert first.returncode == 1, first.stderr.decode()[-800:]
        resumed, took = await timed_run(args, 40, {**ENV, "FASHIONTAG_BULK_API_KEY": "right-key"})
    assert_rows_once(resumed, out)
    assert took < 15, f"{took:.0f} s"


async def test_a_resume_on_another_service_once_the_first_is_gone_does_not_wait_for_its_create(
    tmp_path: Path,
) -> None:
    """Killed with a create on its way to a service that is then gone for good; the same
    command given another service's URL goes on there (the first is gone). The create went to
    the first: the new service's task list can never show it, and the resume looked for it
    there for the whole request deadline (60 s here) before sending its rows."""
    async with running_service(ServiceConfig()) as other:
        async with (
            running_service(ServiceConfig()) as first,
            SlowCreate(first.url, delay=600.0).running() as proxy,
        ):
            args = await killed_after_a_create(tmp_path, proxy, timeout=60.0)
            gone = proxy.url
            assert proxy.late is not None
            proxy.late.cancel()  # (never applied: the service goes first)
            proxy.applied.set()  # (the held request is let go, to a client killed)
        args[args.index(gone)] = other.url
        resumed, took = await timed_run(args, 40)
        billed = other.store.image_count
    assert_rows_once(resumed, tmp_path / "out.jsonl")
    assert billed == 50
    assert took < 15, f"{took:.0f} s"
