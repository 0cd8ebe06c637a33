"""Hostile clients over loopback: idle and header-drip connections, keys in malformed headers,
huge task lists, and slow or private image hosts in fetch mode. Every loop is bounded."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.service import ReferenceAnalyzer, RunningService
from fashiontag_pipeline.service.fetching import ImageFetcher

from .conftest import BULK_KEY, KEY, OTHER_BULK_KEY, StartService
from .test_bulk import raw
from .test_single import product_png

BULK = "/tagger/v2.12/bulk"
SINGLE = "/tagger/v2/tags"


def element(url: str, ident: str) -> dict[str, Any]:
    return {"image": {"type": "url", "content": url}, "context": {"id": ident}}


async def closed_by_server(stream: anyio.abc.ByteStream) -> bool:
    """Read until the server closes (True) or 10 s pass (False)."""
    with anyio.move_on_after(10):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return True
    return False


# --------------------------------------------------------------------------- connections


async def test_header_drip_and_idle_connections_are_closed(start_service: StartService) -> None:
    service = await start_service(header_timeout=0.3, keepalive_timeout=0.5)
    drip = await anyio.connect_tcp(service.host, service.port)
    idle = await anyio.connect_tcp(service.host, service.port)
    async with drip, idle:
        await drip.send(b"GET /openapi.json HTTP/1.1\r\nHo")
        assert await closed_by_server(drip)
        assert await closed_by_server(idle)


async def test_header_timeout_closes_a_drip_whatever_the_keep_alive(
    start_service: StartService,
) -> None:
    """The header timeout alone closes a drip (keep-alive far longer), on a new connection
    and on one that already served a request."""
    service = await start_service(header_timeout=0.3, keepalive_timeout=100.0)
    fresh = await anyio.connect_tcp(service.host, service.port)
    used = await anyio.connect_tcp(service.host, service.port)
    async with fresh, used:
        await used.send(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        with anyio.fail_after(10):
            assert await used.receive()  # answered, connection kept alive
        await fresh.send(b"GET /openapi.json HTTP/1.1\r\nHo")
        await used.send(b"GET /openapi.json HTTP/1.1\r\nHo")
        assert await closed_by_server(fresh)
        assert await closed_by_server(used)


async def test_connection_limit_evicts_idle_connections(start_service: StartService) -> None:
    service = await start_service(max_connections=4)
    async with contextlib.AsyncExitStack() as stack:
        idle = [
            await stack.enter_async_context(await anyio.connect_tcp(service.host, service.port))
            for _ in range(4)
        ]
        with anyio.fail_after(10):
            status, _, _ = await raw(service, "GET", BULK)  # a fifth connection gets through
        assert status == 200
        assert await closed_by_server(idle[0])  # the oldest idle one made room
    assert service.state.connections.open_connections <= 4


async def test_a_key_in_a_malformed_header_line_never_reaches_the_log(
    service: RunningService, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        stream = await anyio.connect_tcp(service.host, service.port)
        async with stream:
            await stream.send(
                b"GET " + BULK.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"x-api-key: " + BULK_KEY.encode() + b"\x01\r\n\r\n"
            )
            answer = b""
            with anyio.fail_after(10):
                while b"\r\n" not in answer:
                    answer += await stream.receive()
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
        await anyio.sleep(0.05)
    text = "\n".join(
        r.getMessage() + str(r.exc_info or "") + (r.exc_text or "") for r in caplog.records
    )
    assert BULK_KEY not in text and BULK_KEY[:10] not in text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- task list


async def test_list_is_paged_newest_first_with_task_info(service: RunningService) -> None:
    ids = []
    for i in range(5):
        status, created, _ = await raw(
            service, "POST", BULK, {"taggingRequest": [element("https://c/x", str(i))]}
        )
        assert status == 202
        ids.append(created["taskId"])
    status, listed, _ = await raw(service, "GET", BULK)
    assert status == 200
    assert [t["taskId"] for t in listed["data"]["tasks"]] == ids[::-1]
    assert listed["data"]["taskInfo"] == {"totalCount": 5, "offset": 0, "size": 5}
    status, page, _ = await raw(service, "GET", BULK + "?offset=1&size=2")
    assert [t["taskId"] for t in page["data"]["tasks"]] == [ids[3], ids[2]]
    status, past, _ = await raw(service, "GET", BULK + "?offset=9")
    assert status == 200 and past["data"]["tasks"] == []
    for bad in ("size=0", "size=1001", "offset=-1"):
        status, _, _ = await raw(service, "GET", f"{BULK}?{bad}")
        assert status == 400, bad


async def test_live_tasks_per_key_are_capped(start_service: StartService) -> None:
    service = await start_service(max_live_tasks=3)
    one = {"taggingRequest": [element("https://c/x", "1")]}
    for _ in range(3):
        status, _, _ = await raw(service, "POST", BULK, one)
        assert status == 202
    status, body, headers = await raw(service, "POST", BULK, one)
    assert status == 429
    assert "live tasks" in body["error"] and int(headers["Retry-After"]) > 0
    status, _, _ = await raw(service, "POST", BULK, one, key=OTHER_BULK_KEY)
    assert status == 202  # another key has its own cap


async def test_status_body_follows_count_changes(service: RunningService) -> None:
    _, created, _ = await raw(
        service, "POST", BULK, {"taggingRequest": [element("https://c/x", "1")]}
    )
    path = f"{BULK}/{created['taskId']}"
    _, before, _ = await raw(service, "GET", path + "/status")
    await raw(service, "PUT", path, {"taggingRequest": [element("https://c/y", "2")]})
    _, after, _ = await raw(service, "GET", path + "/status")
    assert before["data"]["count"]["total"] == 1 and after["data"]["count"]["total"] == 2
    assert after["data"]["taskExpireAt"] > before["data"]["taskExpireAt"]


# --------------------------------------------------------------------------- fetch mode


class ImageHosts:
    """Two loopback image hosts: ``slow`` holds every request until released, ``fast``
    answers at once. Counts what each saw."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.slow_active = 0
        self.slow_most = 0
        self.slow_seen = 0
        self.fast_seen = 0
        self.slow = ""
        self.fast = ""
        self.png = product_png((200, 20, 30))

    async def slow_png(self, request: web.Request) -> web.Response:
        self.slow_seen += 1
        self.slow_active += 1
        self.slow_most = max(self.slow_most, self.slow_active)
        try:
            with anyio.move_on_after(10):
                await self.release.wait()
        finally:
            self.slow_active -= 1
        return web.Response(body=self.png, content_type="image/png")

    async def fast_png(self, request: web.Request) -> web.Response:
        self.fast_seen += 1
        return web.Response(body=self.png, content_type="image/png")


@contextlib.asynccontextmanager
async def image_hosts() -> AsyncIterator[ImageHosts]:
    hosts = ImageHosts()
    runners = []
    try:
        for name, handler in (("slow", hosts.slow_png), ("fast", hosts.fast_png)):
            app = web.Application()
            app.router.add_get("/{name}", handler)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            setattr(hosts, name, f"http://127.0.0.1:{runner.addresses[0][1]}")
        yield hosts
    finally:
        hosts.release.set()
        for runner in runners:
            await runner.cleanup()


async def wait_done(service: RunningService, task_id: str, key: str, limit: float) -> bool:
    with anyio.move_on_after(limit):
        while True:
            _, status, _ = await raw(service, "GET", f"{BULK}/{task_id}/status", key=key)
            if status["data"]["taskStatus"] == "TASK_DONE":
                return True
            await anyio.sleep(0.05)
    return False


async def test_one_keys_slow_images_do_not_hold_up_another_key(
    start_service: StartService,
) -> None:
    async with image_hosts() as hosts:
        service = await start_service(fetch=True, fetch_concurrency=8, fetch_per_host=64)
        slow = {"taggingRequest": [element(f"{hosts.slow}/{i}.png", str(i)) for i in range(40)]}
        status, _, _ = await raw(service, "POST", BULK, slow)
        assert status == 202
        with anyio.fail_after(10):
            while hosts.slow_active < 4:
                await anyio.sleep(0.02)
        fast = {"taggingRequest": [element(f"{hosts.fast}/a.png", "a")]}
        status, created, _ = await raw(service, "POST", BULK, fast, key=OTHER_BULK_KEY)
        assert status == 202
        assert await wait_done(service, created["taskId"], OTHER_BULK_KEY, 5)
        assert hosts.slow_active < 8  # the slow key never held every fetch slot
        hosts.release.set()


async def test_connections_per_image_host_are_limited(start_service: StartService) -> None:
    async with image_hosts() as hosts:
        service = await start_service(fetch=True, fetch_per_host=2)

        async def single(url: str) -> None:
            status, _, _ = await raw(
                service, "POST", SINGLE, {"image": {"type": "url", "content": url}}, key=KEY
            )
            assert status == 200

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(single, f"{hosts.slow}/{i}.png")
                while hosts.slow_active < 2:
                    await anyio.sleep(0.02)
                await single(f"{hosts.fast}/a.png")  # another host is not queued behind
                assert hosts.fast_seen == 1
                hosts.release.set()
        assert hosts.slow_most <= 2 and hosts.slow_seen == 6


async def test_private_image_hosts_are_refused_by_default(start_service: StartService) -> None:
    async with image_hosts() as hosts:
        service = await start_service(fetch=True, fetch_allow_private=False)
        for url in (
            f"{hosts.fast}/a.png",
            "http://localhost:1/",
            "http://[::1]:1/",
            "http://10.0.0.1/",
        ):
            status, body, _ = await raw(
                service, "POST", SINGLE, {"image": {"type": "url", "content": url}}, key=KEY
            )
            assert status == 200
            assert body["error"]["code"] == 803
            assert "not a public address" in body["error"]["message"], url
        assert hosts.fast_seen == 0


def test_serve_options_reach_the_config(tmp_path: Any) -> None:
    import argparse

    from fashiontag_pipeline.service.cli import add_serve_arguments, build_config

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    config, _, _ = build_config(parser.parse_args([]), environ={})
    assert not config.fetch_allow_private  # serve refuses private hosts by default
    assert config.keepalive_timeout == 15 and config.max_connections == 1000
    flags = "--max-connections 7 --keepalive-timeout 2 --header-timeout 3 --body-timeout 4"
    flags += " --max-live-tasks 5 --decode-workers 1 --fetch-per-host 2 --fetch-allow-private"
    flags += " --max-body-bytes 4096"
    config, _, _ = build_config(parser.parse_args(flags.split()), environ={})
    assert (config.max_connections, config.keepalive_timeout, config.header_timeout) == (7, 2, 3)
    assert (config.body_timeout, config.max_live_tasks, config.decode_workers) == (4, 5, 1)
    assert config.fetch_per_host == 2 and config.fetch_allow_private
    assert config.max_body_bytes == 4096
    toml = tmp_path / "serve.toml"
    toml.write_text("[service]\nmax_connections = 9\nheader_timeout = 1.5\n")
    config, _, _ = build_config(parser.parse_args(["--config", str(toml)]), environ={})
    assert config.max_connections == 9 and config.header_timeout == 1.5


def test_serve_warns_that_keys_given_as_flags_are_visible(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As the other commands do (README: "the CLI warns"); the key itself is never shown."""
    import argparse

    from fashiontag_pipeline.service.cli import add_serve_arguments, build_config

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    build_config(parser.parse_args(["--api-key", "hunter2-key"]), environ={})
    err = capsys.readouterr().err
    assert "--api-key is visible to other users" in err and "hunter2" not in err
    build_config(parser.parse_args([]), environ={"FASHIONTAG_API_KEY": "hunter2-key"})
    assert capsys.readouterr().err == ""


async def test_images_queued_for_a_busy_host_are_not_timed_out_before_they_start(
    start_service: StartService,
) -> None:
    """Fetch mode, one image host that takes a while per image: the per-host connection limit
    queues the other downloads, and the download timeout ran from the queueing, not from the
    download's start. Images the host would have served in time failed with 803 "image URL
    timed out" without ever being asked for (rows in the rejects that a slower pace would have
    tagged). The timeout now starts when the download does."""
    pace = 0.3
    seen = 0

    async def paced_png(request: web.Request) -> web.Response:
        nonlocal seen
        seen += 1
        await anyio.sleep(pace)
        return web.Response(body=product_png((20, 200, 30)), content_type="image/png")

    app = web.Application()
    app.router.add_get("/{name}", paced_png)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host = f"http://127.0.0.1:{runner.addresses[0][1]}"
        fetcher = ImageFetcher(per_host=1, allow_private=True, timeout=1.0)
        service = await start_service(fetch=True, analyzer=ReferenceAnalyzer(fetcher=fetcher))
        images = [element(f"{host}/{i}.png", str(i)) for i in range(8)]
        _, created, _ = await raw(service, "POST", BULK, {"taggingRequest": images})
        assert await wait_done(service, created["taskId"], BULK_KEY, 10)
        _, status, _ = await raw(service, "GET", f"{BULK}/{created['taskId']}/status")
        assert status["data"]["count"]["failure"] == 0, (status["data"]["count"], seen)
    finally:
        await runner.cleanup()
