"""A real tagging service behaving in ways nobody staged.

Each test runs the reference service behind the misbehaving proxy (:mod:`.proxy`) or a fake in
front of it, and checks the promises: every row exactly once in results or rejects, no row
billed twice, an honest exit, a bounded run, no key sent where it does not belong.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline import Timeout
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.engine.run import default_state_path
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    read_outcomes,
    run_misbehaving,
    run_through,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour, misbehaving

#: Tasks of 3,000 rows (a create then PUTs of 1,000), polled fast.
LONG_TASKS = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=3000,
    rotate_min_images=3000,
    give_up_after=5.0,
)


@pytest.mark.parametrize(
    "methods", [{"PUT"}, {"POST"}, {"POST", "PUT"}], ids=["put", "post", "both"]
)
async def test_a_write_answered_204_no_content_is_not_sent_again(
    tmp_path: Path, methods: set[str]
) -> None:
    """A service applies every append (PUT), or create, and answers it ``204 No Content``
    with no body, a common REST answer for a write that succeeded. The engine took the 2xx as
    a refusal of the whole write ("not applied") and sent its rows again to a new task: every
    appended row was billed twice (its first copy's results then read as foreign ids and
    left out); a create answered so stopped the run as "refused"."""
    rules = Misbehaviour(no_content_writes=methods)
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    # One task holds every row: none was written to a second one.
    assert len(proxy.created) == 1, proxy.created


async def test_a_create_answered_204_finds_its_task_at_once_without_a_retry(
    tmp_path: Path,
) -> None:
    """Every create is applied and answered ``204 No Content``. Each counted as a failed
    request against the retry budget (a retry in the summary, a streak towards
    ``give_up_after``) and waited its backoff before the engine looked its task up by token:
    an applied write is a success; its task is looked up at once."""
    rules = Misbehaviour(no_content_writes={"POST"})
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, TASKS_OF_1000)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert len(proxy.created) == 3, proxy.created
    assert summary.retries == 0
    # Its rows are in the task: submitted (as those of an append answered 204), and not
    # written to it again (a PUT of rows the create applied: duplicates the service refuses
    # or, worse, takes).
    assert summary.submitted == 3000
    assert proxy.puts == 0


async def test_a_create_answered_204_is_looked_for_not_created_again(tmp_path: Path) -> None:
    """Every create is applied and answered ``204 No Content``, and the task list shows a new
    task only 1.5 s later (longer than ``list_lag``). The engine took the task not listed
    within ``list_lag`` for a create not applied and created the chunk again: a second task
    with the same rows, each billed twice, though the 2xx said the first create was applied.
    The task is looked for until it is listed."""
    rules = Misbehaviour(no_content_writes={"POST"}, list_lag=1.5)
    engine = msgspec.structs.replace(TASKS_OF_1000, list_lag=0.2, give_up_after=30.0)
    summary, proxy, o = await run_misbehaving(tmp_path, 2000, rules, engine)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert len(proxy.created) == 2, proxy.created
    assert summary.submitted == 2000


@pytest.mark.parametrize(
    ("rules", "counter"),
    [
        (Misbehaviour(huge_ops={"create"}, huge_bytes=20 << 20, list_lag=1.5), "huge_answers"),
        (Misbehaviour(cut_ops={"create"}, list_lag=1.5), "cut_answers"),
    ],
    ids=["too-long", "cut"],
)
async def test_a_create_answered_200_unreadable_is_looked_for_not_created_again(
    tmp_path: Path, rules: Misbehaviour, counter: str
) -> None:
    """The first create is applied and answered ``200``, with a body longer than
    ``max_answer_bytes`` (refused unread) or whose connection drops halfway through it (a
    gateway restarting mid-answer), and the task list shows a new task only 1.5 s later
    (longer than ``list_lag``). The answer was taken for one of unknown fate: the task not
    listed within ``list_lag`` was created again, its rows billed twice, though the 200 said
    the create was applied. It is looked for until listed, as a create answered 204."""
    engine = msgspec.structs.replace(TASKS_OF_1000, list_lag=0.2, give_up_after=30.0)
    summary, proxy, o = await run_misbehaving(tmp_path, 2000, rules, engine)
    assert getattr(proxy, counter) == 1
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2000 and not o.rejects
    assert len(proxy.created) == 2, proxy.created


async def test_a_create_answered_204_whose_task_is_never_listed_stops_the_run(
    tmp_path: Path,
) -> None:
    """Every create is applied and answered ``204 No Content`` and the task list never shows
    the new task. Its id cannot be learnt: the run stops (state saved) once ``give_up_after``
    has gone by, its rows created once, not created again and again (each time billed)."""
    rules = Misbehaviour(no_content_writes={"POST"}, list_lag=3600.0)
    engine = msgspec.structs.replace(TASKS_OF_1000, list_lag=0.2, give_up_after=1.5)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    started = time.monotonic()
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(svc.url, rules) as proxy,
    ):
        with pytest.raises(FatalRunError, match=r"applied .* never listed"):
            await run_pipeline(
                [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
            )
    assert len(proxy.created) == 1, proxy.created
    assert time.monotonic() - started < 30
    assert default_state_path(out).exists()


async def test_a_redirect_to_another_host_is_not_sent_the_key(tmp_path: Path) -> None:
    """A front end answers every request ``307 Temporary Redirect`` to another host (a moved
    service, a misconfigured balancer, an open redirect). aiohttp follows redirects and drops
    only ``Authorization`` and cookies across origins: the engine sent its bulk ``x-api-key``
    to whatever host the answer named (in clear text if that is ``http://``), a secret that
    carries management rights over the search database. A key goes only to the configured
    base URL's origin; the run may stop, but the other host never sees it."""
    seen: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append(request.headers.get("x-api-key", ""))
        return web.json_response({"status": "failure", "error": "nothing here"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", elsewhere)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    other = f"http://127.0.0.1:{runner.addresses[0][1]}"
    manifest = write_csv(tmp_path / "m.csv", 50)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    try:
        async with (
            running_service(ServiceConfig()) as svc,
            misbehaving(svc.url, Misbehaviour(redirect_to=other)) as proxy,
        ):
            with anyio.fail_after(30):
                try:
                    summary = await run_pipeline(
                        [manifest],
                        client=client_config(proxy.url),
                        out=out,
                        rejects=rej,
                        engine=TASKS_OF_1000,
                    )
                except Exception:  # a run that stops is fine here
                    summary = None
    finally:
        await runner.cleanup()
    leaked = [k for k in seen if k]
    assert not leaked, f"{len(leaked)} requests to {other} carried the x-api-key header"
    o = read_outcomes(out, rej)
    assert summary is None or not summary.complete or len(o.results) + len(o.rejects) == 50


async def test_results_offsets_counted_from_one_bill_no_row_twice(tmp_path: Path) -> None:
    """A service counts results offsets from 1 (offset 0 taken as 1): each page starts one
    row early, so the page at offset 900 of a 1,000-row task ends one row short of its end.
    Every page is full, so the engine asked for nothing past ``count.total`` and sent the
    task's last row again to a new task: one row per task billed twice. The spec says
    results are stored in the order they were requested, so the rows missing after the last
    page are asked for past the end before they are sent again."""
    rules = Misbehaviour(one_based_offsets=True)
    summary, _, o = await run_misbehaving(tmp_path, 3000, rules)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0


class WireProxy(MisbehavingProxy):
    """The misbehaving proxy with faults of the wire on top: an answer that trickles its body
    a byte at a time for ever (a slow-loris server), a chunked body cut short, every
    connection closed after its answer. ``when(request, n)`` says which answers (``n`` counts
    the answers to the same method and path kind) get ``fault``."""

    def __init__(self, upstream: str, fault: str, when: Any) -> None:
        super().__init__(upstream, Misbehaviour())
        self.fault = fault
        self.when = when
        self.faulted = 0
        self.seen: dict[tuple[str, str], int] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        path = request.path
        kind = (
            "list"
            if path == BULK and request.method == "GET"
            else "status"
            if path.endswith("/status")
            else "page"
            if request.method == "GET"
            else request.method
        )
        key = (request.method, kind)
        self.seen[key] = n = self.seen.get(key, 0) + 1
        if self.fault == "close":
            answer.force_close()
            return answer
        if not isinstance(answer, web.Response) or not self.when(request, kind, n):
            return answer
        self.faulted += 1
        body = answer.body if isinstance(answer.body, bytes) else b""
        out = web.StreamResponse(status=answer.status, headers={"Content-Type": "application/json"})
        if self.fault == "cut":
            out.enable_chunked_encoding()
            await out.prepare(request)
            await out.write(body[: len(body) // 2])
            assert request.transport is not None
            request.transport.close()
            return out
        # trickle: a Content-Length that is honest, a byte every 50 ms, for ever
        out.content_length = len(body)
        await out.prepare(request)
        for i in range(len(body)):
            await out.write(body[i : i + 1])
            await anyio.sleep(0.05)
        return out


async def run_on_wire(
    tmp_path: Path, n: int, fault: str, when: Any, engine: EngineConfig = TASKS_OF_1000
) -> tuple[Any, WireProxy, Any]:
    proxy = WireProxy("", fault, when)
    summary, outcomes = await run_through(
        tmp_path, n, proxy, engine, timeout=Timeout(connect=1.0, total=1.0)
    )
    return summary, proxy, outcomes


@pytest.mark.parametrize(
    ("fault", "when"),
    [
        ("trickle", lambda r, kind, n: kind == "page" and n % 3 == 1),
        ("trickle", lambda r, kind, n: kind in ("list", "status") and n % 3 == 1),
        ("trickle", lambda r, kind, n: kind in ("POST", "PUT") and n == 1),
        ("cut", lambda r, kind, n: kind == "page" and n % 3 == 1),
        ("cut", lambda r, kind, n: kind in ("POST", "PUT") and n == 1),
        ("close", None),
    ],
    ids=["trickle-pages", "trickle-polls", "trickle-writes", "cut-pages", "cut-writes", "close"],
)
async def test_faults_of_the_wire_lose_nothing_and_end(
    tmp_path: Path, fault: str, when: Any
) -> None:
    """Answers that trickle a byte at a time past the request deadline (a slow-loris server),
    chunked bodies cut short, connections closed after every answer: every row ends once,
    none is billed twice, the run ends in bounded time."""
    summary, proxy, o = await run_on_wire(tmp_path, 3000, fault, when, LONG_TASKS)
    assert fault == "close" or proxy.faulted
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0
    assert len(proxy.created) == 1


class IdMapper:
    """A front end that gives the service's tasks ids of its own: ids that need escaping in a
    URL path (``/``, ``?``, ``%``, ``#``, a space, non-ASCII) and that differ from each other
    only in letter case. Requests are translated back (the id taken from the raw, escaped
    path), answers' ``taskId`` fields rewritten."""

    TAIL = "/x?y=1&z%2F#frag é"

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.to_ours: dict[str, str] = {}
        self.to_theirs: dict[str, str] = {}
        self.bad_paths: list[str] = []
        self.url = ""

    def ours(self, theirs: str) -> str:
        if theirs not in self.to_ours:
            n = len(self.to_ours) + 1
            base = "".join(c.upper() if n >> i & 1 else c for i, c in enumerate("taskid"))
            mine = base + self.TAIL
            self.to_ours[theirs] = mine
            self.to_theirs[mine] = theirs
        return self.to_ours[theirs]

    def rewrite(self, node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: self.ours(v) if k == "taskId" and isinstance(v, str) else self.rewrite(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [self.rewrite(v) for v in node]
        return node

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0]
        path = BULK
        tail = ""
        if raw.startswith(BULK + "/"):
            rest = raw[len(BULK) + 1 :]
            escaped, _, tail = rest.partition("/")
            mine = unquote(escaped)
            theirs = self.to_theirs.get(mine)
            if theirs is None:
                self.bad_paths.append(raw)
                return web.json_response(
                    {"status": "failure", "error": "task not found"}, status=404
                )
            path = f"{BULK}/{theirs}" + (f"/{tail}" if tail else "")
        elif raw != BULK:
            path = raw
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("x-api-key", "content-type", "accept-language")
        }
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + path,
                params=dict(request.query),
                data=await request.read() or None,
                headers=headers,
            ) as up,
        ):
            status, payload = up.status, await up.read()
        try:
            data = json.loads(payload)
        except ValueError:
            return web.Response(status=status, body=payload)
        return web.json_response(self.rewrite(data), status=status)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[IdMapper]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield self
        finally:
            await runner.cleanup()


async def test_task_ids_that_need_escaping_and_differ_only_in_case(tmp_path: Path) -> None:
    """A service whose task ids hold ``/``, ``?``, ``%``, ``#``, spaces and non-ASCII, and
    whose ids differ from each other only in letter case: each task is addressed by its own
    id, every row ends once."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc, IdMapper(svc.url).running() as front:
        with anyio.fail_after(60):
            summary = await run_pipeline(
                [manifest],
                client=client_config(front.url),
                out=out,
                rejects=rej,
                engine=TASKS_OF_1000,
            )
    o = assert_exactly_once(out, rej, ids_of(4000))
    assert not front.bad_paths
    assert summary.complete and summary.resent == 0 and len(o.results) == 4000
    assert len(front.to_ours) == 4
    assert {r["taskId"] for r in o.results} == set(front.to_theirs)


class PagesProxy(MisbehavingProxy):
    """The misbehaving proxy with results pages served its own way:

    * ``shuffle``: every read gives the task's results in another order (offset paging then
      skips some rows and repeats others);
    * ``oversize``: a page holds ``extra`` results more than the size asked;
    * ``not_ready_for``: for this many seconds after a task is first seen done, its pages are
      refused with 400 "not ready" (a service whose status runs ahead of its results store).
    """

    def __init__(
        self,
        upstream: str,
        *,
        shuffle: bool = False,
        extra: int = 0,
        not_ready_for: float = 0.0,
        flap_for: float = 0.0,
    ) -> None:
        super().__init__(upstream, Misbehaviour())
        self.shuffle = shuffle
        self.extra = extra
        self.not_ready_for = not_ready_for
        self.done_seen: dict[str, float] = {}
        self.reads = 0
        self.refused_not_ready = 0
        #: A done task's results as upstream holds them, read once: each page read used to
        #: read every page upstream again (3,000 rows: ~1,200 upstream reads), which took the
        #: shuffle test past its 60 s on a loaded machine.
        self.rows_of: dict[str, list[Any]] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        is_page = (
            request.method == "GET" and path.startswith(BULK + "/") and not path.endswith("/status")
        )
        if not is_page:
            answer = await super().handle(request)
            if isinstance(answer, web.Response) and isinstance(answer.body, bytes):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    data = json.loads(answer.body)
                    tasks = data["data"]["tasks"] if path == BULK else [data["data"]]
                    for t in tasks:
                        if t.get("taskStatus") == "TASK_DONE":
                            self.done_seen.setdefault(t["taskId"], time.monotonic())
            return answer
        task_id = path[len(BULK) + 1 :]
        seen = self.done_seen.get(task_id)
        if self.not_ready_for and (seen is None or time.monotonic() - seen < self.not_ready_for):
            self.refused_not_ready += 1
            return web.json_response(
                {"status": "failure", "error": "results of the task are not ready"}, status=400
            )
        if not (self.shuffle or self.extra):
            return await super().handle(request)
        if task_id not in self.rows_of:
            key = request.headers.get("x-api-key", "")
            self.rows_of[task_id] = await self.upstream_rows(task_id, key)
        rows = list(self.rows_of[task_id])
        self.reads += 1
        if self.shuffle:
            random.Random(self.reads).shuffle(rows)
        offset, size = int(request.query["offset"]), int(request.query["size"])
        page = rows[offset : offset + size + self.extra]
        body = {
            "status": "success",
            "data": {
                "taskInfo": {"totalCount": len(rows), "offset": offset, "size": size},
                "results": page,
            },
        }
        return web.json_response(body)


async def run_paged(tmp_path: Path, n: int, proxy: PagesProxy) -> tuple[Any, Any]:
    return await run_through(tmp_path, n, proxy, TASKS_OF_1000)


async def test_pages_holding_more_than_the_size_asked(tmp_path: Path) -> None:
    """A service whose pages hold 37 results more than asked: each row written once, none
    sent again."""
    summary, o = await run_paged(tmp_path, 3000, PagesProxy("", extra=37))
    assert summary.complete and len(o.results) == 3000 and summary.resent == 0


async def test_results_in_another_order_on_every_read(tmp_path: Path) -> None:
    """A service that gives a task's results in another order on every read (offset paging
    then skips rows and repeats others): every row ends once, and the rows a read missed are
    read again rather than sent again (1,429 of 3,000 were sent, and billed, twice; a read of
    every page finds about 63% of a task's rows, four find about 98%)."""
    summary, o = await run_paged(tmp_path, 3000, PagesProxy("", shuffle=True))
    assert summary.complete and len(o.results) == 3000
    assert summary.resent <= 200


async def test_pages_refused_400_not_ready_for_a_while_after_done(tmp_path: Path) -> None:
    """A service whose status says done a few seconds before its results can be read, and
    refuses the pages meanwhile with 400 "not ready" (the spec shows no status code for it):
    the rows of those pages must not be sent (and billed) again."""
    proxy = PagesProxy("", not_ready_for=2.0)
    summary, o = await run_paged(tmp_path, 3000, proxy)
    assert proxy.refused_not_ready
    assert summary.complete and len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0


class ListProxy(MisbehavingProxy):
    """The misbehaving proxy whose task list ignores ``offset``/``size`` (every task on
    every page) and shows other tenants' tasks beside ours (done, with counts of their own),
    and whose tasks step back from done to processing: for ``flap_for`` seconds after a task
    is first shown done, every other poll shows it processing again and its pages are 409."""

    def __init__(self, upstream: str, flap_for: float = 0.0) -> None:
        super().__init__(upstream, Misbehaviour())
        self.flap_for = flap_for
        self.done_at: dict[str, float] = {}
        self.polls = 0
        self.flapped = 0

    def _flapping(self, task_id: str) -> bool:
        at = self.done_at.get(task_id)
        return at is not None and time.monotonic() - at < self.flap_for

    def _step_back(self, task: dict[str, Any]) -> None:
        tid = task["taskId"]
        if task.get("taskStatus") != "TASK_DONE":
            return
        # The first look at a task done always steps it back (on a loaded machine the looks
        # within ``flap_for`` may all fall on odd polls, and the test exercised nothing).
        first = tid not in self.done_at
        self.done_at.setdefault(tid, time.monotonic())
        if first or (self._flapping(tid) and self.polls % 2 == 0):
            self.flapped += 1
            task["taskStatus"] = "TASK_PROCESSING"
            count = task["count"]
            count.update(done=count["total"] // 2, processing=count["total"] - count["total"] // 2)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if request.method == "GET" and path.startswith(BULK + "/") and not path.endswith("/status"):
            if self._flapping(path[len(BULK) + 1 :]) and self.polls % 2 == 0:
                return web.json_response(
                    {"status": "failure", "error": "task is processing"}, status=409
                )
            return await super().handle(request)
        if request.method == "GET" and (path == BULK or path.endswith("/status")):
            self.polls += 1
            assert self._session is not None
            async with self._session.get(
                self.upstream + path, headers={"x-api-key": request.headers["x-api-key"]}
            ) as up:
                status, data = up.status, json.loads(await up.read())
            if status != 200:
                return web.json_response(data, status=status)
            if path == BULK:
                for t in data["data"]["tasks"]:
                    self._step_back(t)
                stranger = {
                    "taskId": f"someone-else-{self.polls % 7}",
                    "count": {"total": 5000, "done": 5000, "processing": 0, "failure": 0},
                    "description": "fashiontag run someone-else-t1",
                    "taskStatus": "TASK_DONE",
                    "taskExpireAt": "2026-01-01T00:00:00.000Z",
                    "resultExpiredAt": "2099-01-01T00:00:00.000Z",
                    "createDate": "2026-01-01T00:00:00.000Z",
                }
                data["data"]["tasks"].append(stranger)
                data["data"]["taskInfo"] = {"totalCount": 10**6, "offset": 0, "size": 10**6}
            else:
                self._step_back(data["data"])
            return web.json_response(data)
        return await super().handle(request)


async def test_a_list_of_every_tenant_that_ignores_paging_and_tasks_that_step_back(
    tmp_path: Path,
) -> None:
    """The task list ignores ``offset``/``size`` and claims a million tasks, shows other
    tenants' tasks, and our tasks step back from done to processing (pages 409) now and then
    for a second after they are first done: every row once, nothing sent again, the run ends."""
    proxy = ListProxy("", flap_for=1.0)
    summary, o = await run_through(tmp_path, 3000, proxy, TASKS_OF_1000)
    assert proxy.flapped
    assert summary.complete and summary.resent == 0 and len(o.results) == 3000


class ShapedFailures(MisbehavingProxy):
    """The misbehaving proxy whose write answers list refused rows in a shape of their own:
    ``strings`` (``"p7: image URL could not be fetched"``), ``flat`` (``{"id": ...,
    "errorMessage": ...}``) or ``message`` (``{"request": ..., "message": ...}``)."""

    def __init__(self, upstream: str, rules: Misbehaviour, shape: str) -> None:
        super().__init__(upstream, rules)
        self.shape = shape

    def _reword_failures(self, sent: bytes, status: int, payload: bytes) -> tuple[int, bytes]:
        status, payload = super()._reword_failures(sent, status, payload)
        data = json.loads(payload)
        failures = data.get("failureList") or []
        shaped: list[Any] = []
        for f in failures:
            ident = f["request"]["context"]["id"]
            if self.shape == "strings":
                shaped.append(f"{ident}: {f['errorMessage']}")
            elif self.shape == "flat":
                shaped.append({"id": ident, "errorMessage": f["errorMessage"]})
            else:
                shaped.append({"request": f["request"], "message": f["errorMessage"]})
        data["failureList"] = shaped
        return status, json.dumps(data).encode()


@pytest.mark.parametrize("shape", ["strings", "flat", "message"])
async def test_refused_rows_listed_in_a_shape_of_the_services_own(
    tmp_path: Path, shape: str
) -> None:
    """A service refuses a few rows of its creates and appends (202, the others taken) and
    lists them in its ``failureList`` in a shape other than the spec's: every row still ends
    once (the refused ones as rejects), the run completes in bounded time, and no tagged row
    is sent again."""
    refused = {"p5", "p1500", "p2999"}
    proxy = ShapedFailures("", Misbehaviour(always_refused=refused), shape)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0
    assert {r["id"] for r in o.rejects} == refused
    assert len(o.results) == 3000 - len(refused)
