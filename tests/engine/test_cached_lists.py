"""A caching proxy in front of the service (Varnish as it comes: it caches a ``200`` to a GET
for its default TTL when the answer says nothing of caching, and an ``x-api-key`` is no
``Authorization`` that would make it pass the request on): the task list is answered from its
copy, ``Age`` seconds old, while the service holds tasks that copy does not show. A create of
unknown fate (applied, its answer lost) is looked for in that list: a copy made before the
create cannot show its task, and taking it for "not created" bills the rows twice.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from pathlib import Path

import aiohttp
import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, write_csv
from .proxy import BULK, MisbehavingProxy, Misbehaviour

#: The run's task list (its first page), as the client asks for it.
LISTED = f"{BULK}?offset=0&size=1000"
#: The reference service's bulk key.
BULK_KEY = "dev-bulk-api-key"


class CachingProxy(MisbehavingProxy):
    """The proxy behind a cache that keeps each ``200`` to a GET of the task list ``ttl``
    seconds and answers it from its copy meanwhile, with ``Age`` as RFC 9111 has it."""

    def __init__(self, rules: Misbehaviour, ttl: float) -> None:
        super().__init__("", rules)
        self.ttl = ttl
        self.copies: dict[str, tuple[float, bytes]] = {}
        self.hits = 0
        self.primed = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.primed:
            self.primed = True
            await self._copy_list(request.headers["x-api-key"])  # (a moment before the create)
        if request.method != "GET" or request.path != BULK:
            return await super().handle(request)
        key = request.path_qs
        copy = self.copies.get(key)
        now = time.monotonic()
        if copy is not None and now - copy[0] < self.ttl:
            self.hits += 1
            age = str(int(now - copy[0]))
            headers = {"Age": age, "X-Varnish": "32770 3", "Via": "1.1 varnish (Varnish/7.4)"}
            return web.Response(body=copy[1], content_type="application/json", headers=headers)
        answer = await super().handle(request)
        if answer.status == 200 and isinstance(answer, web.Response) and answer.body is not None:
            self.copies[key] = (now, bytes(answer.body))  # type: ignore[arg-type]
            answer.headers["Age"] = "0"
        return answer

    async def _copy_list(self, key: str) -> None:
        """The cache's copy of the run's task list made now (a monitor's poll, the night's other
        run, a moment before the create): it cannot show the create's task."""
        url, headers = f"{self.upstream}{LISTED}", {"x-api-key": key}
        async with aiohttp.ClientSession() as monitor, monitor.get(url, headers=headers) as seen:
            assert seen.status == 200
            self.copies[LISTED] = (time.monotonic(), await seen.read())


async def test_a_create_of_unknown_fate_is_not_sent_again_on_a_cached_task_list(
    tmp_path: Path,
) -> None:
    """The cache holds a copy of the task list made a moment before the create (a monitor's
    poll, the night's other run) for 3 s (``list_lag`` 1 s here). The run's create is applied
    and its connection reset before the answer: the run looked for its task in the list for
    ``list_lag``, was given the cache's copy every time (``Age: 0`` to ``2``), never saw the
    task, and created it again: its 1,000 rows billed twice, the first task never read, exit 0.
    A list answered ``Age`` seconds old shows the service as it was then: the look goes on
    until a list as new as the look's end is given (here the cache's next copy)."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "lag.toml"
    config.write_text("[engine]\nlist_lag = 1.0\n")
    proxy = CachingProxy(Misbehaviour(lose_first_create_answer=True), ttl=3.0)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            extra = ("--give-up-after", "30", "--config", str(config), str(manifest))
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *extra),
                    check=False,
                    env=ENV,
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert proxy.lost_answers == ["create"] and proxy.hits >= 1
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert billed == 1000, f"{billed} rows billed in {len(svc.store.tasks)} tasks"


class AgedPassThrough(MisbehavingProxy):
    """A front end that passes every request on (no cache) but puts ``Age: {age}`` on every
    answer, and drops the first create unapplied (its connection closed before the service
    was asked): the look for its task cannot find it, and the list's ``Age`` decides how long
    it goes on."""

    def __init__(self, age: str) -> None:
        super().__init__("", Misbehaviour())
        self.age = age
        self.dropped = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.dropped:
            self.dropped = True
            await request.read()
            assert request.transport is not None
            request.transport.abort()  # not applied: the client gets no answer
            raise ConnectionResetError("create dropped on purpose")
        answer = await super().handle(request)
        answer.headers["Age"] = self.age
        return answer


@pytest.mark.parametrize("age", ["1e9", "+60"])
async def test_an_age_that_is_no_delta_seconds_is_unreadable(tmp_path: Path, age: str) -> None:
    """``Age`` is a number of whole seconds, digits only (RFC 9111, delta-seconds). One that
    is not (a front end's ``1e9``, ``1_000``, ``+60`` or ``12.5`` on every answer) was read as
    a number anyway: the look for a create whose answer was lost (here never applied) took
    every fresh list for a copy that old and went on until ``--give-up-after``, then stopped
    the run (exit 1). Unreadable, it is no age: the rows are created again after ``list_lag``."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "lag.toml"
    config.write_text("[engine]\nlist_lag = 0.5\n")
    proxy = AgedPassThrough(age)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            extra = ("--give-up-after", "3", "--config", str(config), str(manifest))
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    run_args(proxy.url, out, *extra), check=False, env=ENV
                )
        billed = sum(len(task.ids) for task in svc.store.tasks.values())
    assert proxy.dropped
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(1000))
    assert billed == 1000


class StaleCopies(MisbehavingProxy):
    """A cache in front of the service, once ``stale`` is set: each answer to a GET is its
    copy made ``age`` seconds ago, with the origin's ``Date`` of then and ``Age`` (RFC 9111:
    a cache passes the stored ``Date`` on)."""

    def __init__(self, age: int) -> None:
        super().__init__("", Misbehaviour())
        self.age = age
        self.stale = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if self.stale and request.method == "GET":
            answer.headers["Date"] = formatdate(time.time() - self.age, usegmt=True)
            answer.headers["Age"] = str(self.age)
        return answer


async def test_a_cached_answers_date_is_not_the_services_clock_now() -> None:
    """A task list answered from a cache's copy made 120 s before (Varnish's default TTL)
    carries the ``Date`` the service gave it then. Taken for the service's clock now, it moved
    the offset 2 minutes back (the bounds restarted from it): write deadlines read every
    task's expiry 2 minutes late, and each create written ahead after it recorded a time in
    the service's clock (``chunks.service_at``) 2 minutes early, a resume's look for it that
    much shorter. A copy's ``Date`` is now up to its ``Age`` behind the service's clock: the
    fresh answers' bounds (here in agreement with ours) stand."""
    proxy = StaleCopies(120)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running(), TaggerClient(proxy.url, bulk_api_key=BULK_KEY) as client:
            await client.list_tasks()  # (fresh: the service's clock, ours)
            proxy.stale = True
            await client.list_tasks()  # (the cache's copy, 120 s old)
            clock = client.server_clock
            assert clock.known and clock.correction == 0.0
            assert abs(clock.stamp() - time.time()) < 2.0
