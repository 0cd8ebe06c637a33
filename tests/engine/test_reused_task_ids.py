"""Task ids a service gives again: once a task's results have expired (the service purged it),
a service may issue its id to a new task (the spec says only that the create issues it)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import anyio
import msgspec
from aiohttp import web

from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import TASKS_OF_1000, assert_exactly_once, client_config, ids_of, write_csv
from .proxy import BULK

#: Seconds a done task's results are kept (the service's result TTL in these tests): long
#: enough to read a task's 10 pages on a loaded machine (0.5 failed about half the runs there).
RESULT_TTL = 2.0


class IdAfterPurge:
    """A front end of the reference service whose second create is held until the first
    task has been read and its results have expired, then answered with that task's id: the
    service purged the old task and gave its id to the new one. Every request naming that id
    reaches the new task from then on, and the list no longer shows the old one."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""
        #: Upstream task ids, in create order.
        self.created: list[str] = []
        #: Old id -> the new upstream task it names now.
        self.alias: dict[str, str] = {}
        self.creates = 0
        self.first_read = anyio.Event()
        self._pages = 0
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        path, body = request.path, await request.read()
        named = path[len(BULK) + 1 :].split("/")[0] if path.startswith(BULK + "/") else None
        if named in self.alias:
            path = path.replace(named, self.alias[named], 1)
        reuse = False
        if request.method == "POST" and path == BULK:
            self.creates += 1
            if self.creates == 2:
                reuse = True
                await self.first_read.wait()
                await anyio.sleep(RESULT_TTL + 0.3)  # its results expired, the task purged
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("x-api-key", "content-type")
        }
        async with self._session.request(
            request.method,
            self.upstream + path,
            params=dict(request.query),
            data=body or None,
            headers=headers,
        ) as up:
            status, text = up.status, (await up.read()).decode()
        if request.method == "POST" and path == BULK and status < 300:
            new = json.loads(text)["taskId"]
            if reuse:
                self.alias[self.created[0]] = new
            self.created.append(new)
        elif named == self.created[0] and not self.alias and not path.endswith("/status"):
            self._pages += 1
            if self._pages >= 10:  # (its 1,000 rows read)
                self.first_read.set()
        if request.method == "GET" and path == BULK and self.alias and status < 300:
            data = json.loads(text)
            purged = set(self.alias)
            data["data"]["tasks"] = [t for t in data["data"]["tasks"] if t["taskId"] not in purged]
            text = json.dumps(data)
        for old, new in self.alias.items():
            text = text.replace(new, old)
        return web.Response(status=status, text=text, content_type="application/json")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[IdAfterPurge]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._session = aiohttp.ClientSession()
        try:
            yield self
        finally:
            await self._session.close()
            await runner.cleanup()


async def test_an_id_given_again_after_its_task_was_purged_is_a_new_task(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """The service gives the id of a task whose results expired (read, done with) to a new
    task. The run took the answer for a service that hands out a live task's id twice and
    stopped (state saved), and so did every resume, on the same id: the run could never
    complete, its second task's rows billed and never read. A finished task whose results
    have expired holds no row: its id names the new task (on either state backend)."""
    n = 2000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(TASKS_OF_1000, max_write_concurrency=1)
    async with running_service(ServiceConfig(result_ttl=RESULT_TTL)) as svc:
        proxy = IdAfterPurge(svc.url)
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=state_location("run"),
                    engine=engine,
                )
    assert proxy.alias, "the second create was not given the first task's id"
    assert summary.complete and summary.resent == 0
    assert len(proxy.created) == 2  # no row created again
    o = assert_exactly_once(out, rej, ids_of(n))
    assert not o.rejects
    assert {r["taskId"] for r in o.results} == {proxy.created[0]}
