"""Faults of what stands between the engine and the service: a front end (a gateway, an
ingress, a load balancer) that answers for the service while it is redeployed.

Each test runs the reference service behind a front (the misbehaving proxy of :mod:`.proxy`,
with faults of its own) and checks the promises: every row exactly once in results or rejects,
no row billed twice, an honest end.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .gateways import _tcp_serving
from .helpers import assert_exactly_once, client_config, ids_of, run_through, write_csv
from .proxy import BULK, MisbehavingProxy, Misbehaviour

#: Tasks of 3,000 rows (a create then PUTs of 1,000), polled fast.
LONG_TASKS = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=3000,
    rotate_min_images=3000,
    give_up_after=10.0,
)

#: What Traefik answers for a route it has no backend for (a redeploy under way).
GATEWAY_404 = b"404 page not found\n"


class GatewayBlip(MisbehavingProxy):
    """The proxy with a front end that, for the first ``times`` requests of one kind
    (``list``, ``status``, ``page`` or ``PUT``; pages only once the task is done), answers
    404 with its own plain-text page instead of forwarding them: the service never sees them,
    and still holds every task."""

    def __init__(self, upstream: str, kind: str, times: int) -> None:
        super().__init__(upstream, Misbehaviour())
        self.kind = kind
        self.times = times
        self.blipped = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        kind = (
            "list"
            if path == BULK and request.method == "GET"
            else "status"
            if path.endswith("/status")
            else "page"
            if request.method == "GET" and path.startswith(BULK + "/")
            else request.method
        )
        if kind == self.kind and self.blipped < self.times:
            self.blipped += 1
            return web.Response(
                status=404, body=GATEWAY_404, headers={"Content-Type": "text/plain; charset=utf-8"}
            )
        return await super().handle(request)


async def run_blipped(tmp_path: Path, n: int, proxy: GatewayBlip) -> tuple[Any, Any]:
    return await run_through(tmp_path, n, proxy, LONG_TASKS)


@pytest.mark.parametrize("kind", ["page", "list", "PUT"])
async def test_a_gateways_404_page_while_the_service_is_redeployed(
    tmp_path: Path, kind: str
) -> None:
    """A gateway in front of the service answers a few requests ``404 page not found`` (plain
    text, Traefik's page for a route with no backend while the service is redeployed); the
    service never saw them and still holds every task. A results page so answered was taken
    for the service forgetting the task: its 1,000 rows were sent (and billed) again in a new
    task. The task list so answered ended the run at once (exit 1, ``GET
    /tagger/v2.12/bulk: HTTP 404: 404 page not found``). A 404 that is not the service's
    JSON answer is no word from the service about the task: it is retried like a 5xx, under
    the run's give-up budget."""
    proxy = GatewayBlip("", kind, 3)
    summary, o = await run_blipped(tmp_path, 3000, proxy)
    # (A list so answered has the tasks' statuses read instead: the run may end before the
    # list is asked for three times.)
    assert proxy.blipped == 3 or (kind == "list" and proxy.blipped >= 1)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created


class HangingPages(MisbehavingProxy):
    """The proxy with results pages that never answer: the connection is taken, the request
    read, and nothing comes back (a service wedged behind a load balancer that keeps the
    connection open)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, Misbehaviour())
        self.hung = 0
        self.release = anyio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if request.method == "GET" and path.startswith(BULK + "/") and "offset" in request.query:
            self.hung += 1
            await self.release.wait()  # set at the end of the test: the proxy can then close
            return web.Response(status=503)
        return await super().handle(request)


async def test_give_up_after_holds_when_every_page_request_hangs(tmp_path: Path) -> None:
    """Results pages that never answer: the run must stop, state saved, about
    ``give_up_after`` seconds after the service last answered, not after every request's
    own retries ran out first. The client retried each page up to ``max_attempts`` times,
    each until its whole deadline, before the give-up budget saw the first failure, and the
    budget counted from that failure: with a 1 s deadline, 4 attempts and a give-up of 2 s
    the run stopped after ~10 s ("service unreachable for 2s"); at the defaults (70 s, 6
    attempts, 120 s) after ~14 minutes, while it said it would keep trying for 120 s."""
    from fashiontag_pipeline import Timeout

    manifest = write_csv(tmp_path / "m.csv", 200)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = HangingPages("")
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            started = anyio.current_time()
            with anyio.fail_after(60), pytest.raises(Exception) as caught:
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url, timeout=Timeout(total=1.0)),
                    out=out,
                    rejects=rej,
                    engine=msgspec.structs.replace(LONG_TASKS, give_up_after=2.0),
                )
            elapsed = anyio.current_time() - started
            proxy.release.set()
    assert proxy.hung >= 1
    assert "2s" in str(caught.value), caught.value
    # The budget: 2 s; then the request under way ends within its 1 s deadline. Before: 10 s.
    assert elapsed < 6.0, elapsed


class SlowWrites(MisbehavingProxy):
    """The proxy with a service slow to answer writes (``delay`` seconds each, answered in
    the end), whose first create is answered 503 once, after that delay, and not applied."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__(upstream, Misbehaviour())
        self.delay = delay
        self.refused = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("POST", "PUT") and request.path.startswith(BULK):
            await anyio.sleep(self.delay)
            if request.method == "POST" and not self.refused:
                self.refused += 1
                await request.read()
                return web.Response(status=503)
        return await super().handle(request)


async def test_one_error_from_a_slow_service_is_not_give_up_after_of_failure(
    tmp_path: Path,
) -> None:
    """A service slow to answer writes (3 s each, with --give-up-after 2) answers the first
    create 503 once: the run stopped at once, "create task: service failing for 2s", exit 1,
    though the service had answered every request and failed one. The give-up budget counted
    the failure from the request's start, which is right for a request that never answered
    (a hang) and wrong for one answered: the failing began with the answer."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = SlowWrites("", 3.0)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=msgspec.structs.replace(LONG_TASKS, give_up_after=2.0),
                )
    assert proxy.refused == 1
    assert summary.complete
    o = assert_exactly_once(out, rej, ids_of(300))
    assert len(o.results) == 300


#: A load balancer's maintenance page, served with 200 OK (as many are, so that browsers
#: show it), for a second or two while the service behind it is switched over.
MAINTENANCE_PAGE = (
    b"<!DOCTYPE html>\n<html><head><title>Down for maintenance</title></head>"
    b"<body><h1>We'll be back in a moment</h1></body></html>\n"
)


class MaintenanceBlip(MisbehavingProxy):
    """The proxy with a front end that, once ``after`` results pages have been answered,
    answers every results page request (or, with ``method``, every request of that method)
    for ``seconds`` with its maintenance page, 200 OK, ``text/html`` (the service never sees
    them, and still holds every task)."""

    def __init__(
        self,
        upstream: str,
        after: int,
        seconds: float,
        moved: bool = False,
        method: str | None = None,
        body: bytes = MAINTENANCE_PAGE,
    ) -> None:
        super().__init__(upstream, Misbehaviour())
        self.after = after
        self.seconds = seconds
        #: Redirect to the page (302 to another host) instead of serving it.
        self.moved = moved
        self.method = method
        self.body = body
        self.pages = 0
        self.blipped = 0
        self.began: float | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        page = request.method == "GET" and request.path.startswith(BULK + "/")
        page = page and "offset" in request.query
        if self.method is not None:
            page = request.method == self.method
        if page and self.pages >= self.after:
            now = anyio.current_time()
            self.began = now if self.began is None else self.began
            if now - self.began < self.seconds:
                self.blipped += 1
                if self.moved:
                    where = "https://status.example.com/maintenance.html"
                    return web.Response(status=302, headers={"Location": where})
                return web.Response(
                    status=200,
                    body=self.body,
                    headers={"Content-Type": "text/html; charset=utf-8"},
                )
        if page:
            self.pages += 1
        return await super().handle(request)


async def test_a_maintenance_page_served_200_for_a_moment_bills_no_row_twice(
    tmp_path: Path,
) -> None:
    """A load balancer answers results pages for 1.5 s with its maintenance page, served 200
    OK as ``text/html`` (the service is switched over behind it). Such a page was taken for
    a results page the service garbled, which asking again rarely cures: asked four times in
    0.7 s, then taken as empty, and its 100 rows sent (and billed) again in a new task. A 200
    whose body is not JSON at all is no answer of the service: it is retried like a 5xx,
    under the run's give-up budget."""
    proxy = MaintenanceBlip("", after=3, seconds=1.5)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped >= 4
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created


async def test_an_empty_200_for_a_moment_bills_no_row_twice(tmp_path: Path) -> None:
    """The load balancer answers results pages for 1.5 s with 200 OK and no body at all (a
    fixed response of its own while the service is switched over): each page so answered was
    asked four times in 0.7 s, then taken as empty, its rows sent (and billed) again. The
    service never answers a read with nothing: retried like a 5xx, as a page that is not
    JSON."""
    proxy = MaintenanceBlip("", after=3, seconds=1.5, body=b"")
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped >= 4
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created


async def test_a_redirect_to_a_maintenance_page_for_a_moment_bills_no_row_twice(
    tmp_path: Path,
) -> None:
    """The same load balancer redirects results page requests to its maintenance page (302 to
    another host) for 1.5 s. A redirect (never followed: the key would go with it) was taken
    as a refusal of the page that asking again rarely cures: four tries in 0.7 s, then a page
    with no result, its 100 rows sent (and billed) again. A redirect of a read is retried like
    a 5xx, under the run's give-up budget (a service that stays moved stops the run then,
    naming where it redirects)."""
    proxy = MaintenanceBlip("", after=3, seconds=1.5, moved=True)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped >= 4
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_a_maintenance_page_served_200_to_writes_is_no_write_applied(
    tmp_path: Path, method: str
) -> None:
    """The same maintenance page (HTML, 200 OK) answers the creates (or the appends) for
    1.5 s. A 2xx to a write was taken as the write applied with an answer that cannot be read:
    a create so answered was looked for in the task list by its token until
    ``--give-up-after``, and never found (the service never saw it): the run stopped, exit 1,
    after a blip of a second. A page that is not JSON at all is no answer of the service: the
    write's fate is unknown (its task looked for once, then sent again)."""
    proxy = MaintenanceBlip("", after=0, seconds=1.5, method=method)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped >= 1
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0


class OldCompressor(MisbehavingProxy):
    """The proxy behind a front end that compresses every answer as ``Content-Encoding:
    x-gzip``, the old name of gzip that some servers still send (RFC 9110 8.4.1.3: a recipient
    SHOULD take it as gzip)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, Misbehaviour())
        self.compressed = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if not isinstance(answer, web.Response) or not isinstance(answer.body, bytes):
            return answer
        self.compressed += 1
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        headers["Content-Encoding"] = "x-gzip"
        return web.Response(status=answer.status, body=gzip.compress(answer.body), headers=headers)


async def test_answers_compressed_as_x_gzip_are_read(tmp_path: Path) -> None:
    """Every answer gzip-compressed and labelled ``x-gzip``: aiohttp decodes only ``gzip``,
    so every answer was read as its compressed bytes, "JSON is malformed: invalid character
    (byte 0)": each create taken as applied and looked for, each page and poll asked again
    until ``--give-up-after``, and the run stopped (exit 1), every night."""
    proxy = OldCompressor("")
    summary, o = await run_through(tmp_path, 2500, proxy, LONG_TASKS)
    assert proxy.compressed
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2500 and not o.rejects
    assert summary.resent == 0 and summary.ambiguous_writes == 0


async def test_give_up_after_holds_when_the_service_takes_connections_and_never_answers(
    tmp_path: Path,
) -> None:
    """A service that accepts connections and never sends a byte: with a 3 s deadline and
    --give-up-after 3.5, the create timed out (0-3 s) and its look-up in the task list timed
    out too (3-6 s), past the give-up point; the client still sent that read once more (its
    give-up check ran before each attempt, with the time left when the failed one began) and
    the run stopped after ~9 s. No retry starts past the give-up point: it stops when the
    request under way at that point ends."""
    from fashiontag_pipeline import Timeout

    manifest = write_csv(tmp_path / "m.csv", 50)
    held = 0

    async def hold(stream: anyio.abc.SocketStream) -> None:
        nonlocal held
        held += 1
        async with stream:
            await anyio.sleep_forever()

    async with _tcp_serving(hold) as port:
        started = anyio.current_time()
        with anyio.fail_after(60), pytest.raises(Exception) as caught:
            await run_pipeline(
                [manifest],
                client=client_config(f"http://127.0.0.1:{port}", timeout=Timeout(total=3.0)),
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=msgspec.structs.replace(LONG_TASKS, give_up_after=3.5),
            )
        elapsed = anyio.current_time() - started
    # (Reached each time: no outage, a deadline that ran out; see test_slow_answers.)
    assert "not answering within the request deadline (3 s" in str(caught.value), caught.value
    assert held == 2, f"{held} requests sent"
    # The budget: 3.5 s; then the request under way ends within its 3 s deadline. Before: 9 s.
    assert elapsed < 7.8, elapsed


class PollRedirectBlip(MisbehavingProxy):
    """The proxy with a load balancer that, from the first poll on, redirects every read of
    the task list and of a task's status (302 to its maintenance page on another host, or
    ``status``) for ``seconds``: the service behind it is switched over, and still holds
    every task."""

    def __init__(self, upstream: str, seconds: float, status: int = 302) -> None:
        super().__init__(upstream, Misbehaviour())
        self.seconds = seconds
        self.status = status
        self.blipped = 0
        self.began: float | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        poll = request.method == "GET" and (path == BULK or path.endswith("/status"))
        if poll:
            now = anyio.current_time()
            self.began = now if self.began is None else self.began
            if now - self.began < self.seconds:
                self.blipped += 1
                where = "https://status.example.com/maintenance.html"
                return web.Response(status=self.status, headers={"Location": where})
        return await super().handle(request)


@pytest.mark.parametrize("status", [302, 303, 307])
async def test_a_redirect_of_the_polls_for_a_moment_is_waited_out(
    tmp_path: Path, status: int
) -> None:
    """The load balancer redirects the task list and every status read to its maintenance
    page for 1.5 s (a switch-over behind it). The same redirect of a results page is waited
    out under the give-up budget; of a poll it stopped the run at once (exit 1; a daemon
    with it, for a moment's maintenance). A temporary redirect of a poll is transient too: the
    run waits it out, every row once, nothing sent again."""
    proxy = PollRedirectBlip("", seconds=1.5, status=status)
    summary, o = await run_through(tmp_path, 3000, proxy, LONG_TASKS)
    assert proxy.blipped >= 2
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == 0
    assert len(proxy.created) == 1, proxy.created
