"""Behaviours carried over from earlier sessions' notes, staged as a user meets them."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .helpers import ENV, assert_exactly_once, run_args, write_csv
from .proxy import Misbehaviour, misbehaving

MOVED = "http://new.example.invalid"


@contextlib.asynccontextmanager
async def moved_reads(
    upstream: str, moved: str, *, status: int = 301, list_down: bool = False
) -> AsyncIterator[str]:
    """A front end that forwards writes and the task list, and answers every read of a task
    (its status, its results) ``status`` to ``moved`` (the service moved mid-run);
    ``list_down``: the task list answered 503 (the statuses are read instead)."""
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        raw = request.raw_path
        if request.method == "GET" and request.path.endswith("/bulk") and list_down:
            return web.Response(status=503, text="down")
        if request.method == "GET" and "/bulk/" in request.path:
            return web.Response(status=status, headers={"Location": moved + raw}, text="Moved")
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("x-api-key", "content-type", "accept-language")
        }
        async with session.request(
            request.method, upstream + raw, data=body or None, headers=headers
        ) as up:
            payload = await up.read()
            return web.Response(
                status=up.status,
                body=payload,
                headers={"Content-Type": up.headers.get("Content-Type", "text/plain")},
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await session.close()


@pytest.mark.parametrize(("status", "list_down"), [(301, False), (308, False), (301, True)])
async def test_a_permanent_redirect_of_a_read_stops_the_run_at_once(
    tmp_path: Path, status: int, list_down: bool
) -> None:
    """The service moved for good mid-run (http -> https, a new host): its front end answers
    every read of a task 301 or 308 to the new address. A status read so answered stopped the
    run at once; a results read was retried like a maintenance page's 302 until
    --give-up-after (and for ever in a daemon). Now both stop at once, state saved, the line
    naming the base URL to give; the key never goes to the new host."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out = tmp_path / "o.jsonl"
    async with (
        running_service(ServiceConfig(fetch=False)) as svc,
        moved_reads(svc.url, MOVED, status=status, list_down=list_down) as url,
    ):
        started = time.monotonic()
        args = run_args(url, out, str(manifest), "--state", str(tmp_path / "s.db"))
        args += ["--give-up-after", "30"]
        with anyio.fail_after(120):
            result = await anyio.run_process(args, check=False, env=ENV)
        took = time.monotonic() - started
    err = result.stderr.decode()
    assert result.returncode == 1 and took < 20, err[-2000:]
    last = err.splitlines()[-1]
    assert last.startswith("fashiontag: ") and "Traceback" not in err, err[-2000:]
    assert "give the base URL http://new.example.invalid" in last, last


@pytest.mark.parametrize("merged", ["5, 5", "5,5"])
async def test_a_retry_after_merged_by_a_proxy_is_still_waited(tmp_path: Path, merged: str) -> None:
    """A proxy that merges a repeated header into one (RFC 9110 lets it join field lines with
    commas) passes the service's ``Retry-After: 5`` on as ``5, 5``: every request answered 429
    so for 5 s (a rate limit). Read as no Retry-After, the run asked again after 0.2 s
    backoffs (dozens of requests into the limit); it waits the 5 s it is asked to."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=429, storm_retry_after=merged, storm_window=(0.0, 5.0))
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(manifest))
        with anyio.fail_after(40):
            done = await anyio.run_process(args, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()[-600:]
    assert proxy.storm_answers <= 6, f"{proxy.storm_answers} requests answered 429 in 5 s"
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(3000)})


@contextlib.asynccontextmanager
async def taking_and_silent() -> AsyncIterator[str]:
    """A service that takes every connection and never answers (a frozen process behind a
    listening socket)."""
    held: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        held.append(stream)
        async with stream:  # (closed when the test ends: no unclosed socket warning)
            await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("command", [["tag", "https://img.example/a.jpg"], ["tasks", "list"]])
async def test_a_one_shot_command_gives_up_when_it_says_on_a_silent_service(
    command: list[str],
) -> None:
    """``tag`` and ``tasks`` keep trying a failing service for ``--give-up-after`` seconds,
    then exit 1 (README). A service that takes the connection and never answers held them
    for the request deadline instead (70 s at the defaults, whatever ``--give-up-after 3``
    said: a smoke test of the service in a health check hung past its own timeout). The
    request's deadline is never longer than the command's give-up."""
    async with taking_and_silent() as url:
        started = time.monotonic()
        argv = [*command, "--base-url", url, "--give-up-after", "3"]
        with anyio.fail_after(60):
            result = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", *argv], check=False, env=ENV
            )
        took = time.monotonic() - started
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err, err
    assert took < 15, (took, err)


@pytest.mark.parametrize("command", [["tag", "https://img.example/a.jpg"], ["tasks", "list"]])
async def test_give_up_after_zero_still_waits_for_a_healthy_answer(command: list[str]) -> None:
    """``--give-up-after 0``: no retry of a failing service (README), not a request deadline
    of a millisecond. Every request of a healthy service answered in 0.3 s timed out, exit 1."""
    spec = FaultSpec(latency=1.0, latency_seconds=0.3)
    async with running_service(ServiceConfig(rate=0, fetch=False, faults=spec)) as svc:
        argv = [*command, "--base-url", svc.url, "--give-up-after", "0"]
        with anyio.fail_after(60):
            result = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", *argv], check=False, env=ENV
            )
    err = result.stderr.decode()
    assert result.returncode == 0, err
