"""The reference service facing clients that misbehave: bodies held open, HTTP the parser
refuses, ambiguous query strings. Real processes and sockets on 127.0.0.1; every wait bounded."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

import aiohttp
import anyio
import anyio.abc
import pytest

from fashiontag_pipeline.service import RunningService

from .conftest import BULK_KEY
from .test_bulk import raw
from .test_cli_openapi import start_serve, stop

BULK = "/tagger/v2.12/bulk"
MIB = 1024 * 1024


def _rss_bytes(pid: int) -> int:
    """The process's resident memory (a process that has exited has none: it failed)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"the service (pid {pid}) is gone: no VmRSS")


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/PID/status")
async def test_bodies_held_open_do_not_grow_memory_without_bound() -> None:
    """40 clients each announce a 15.5 MiB body (under the 16 MiB limit), send all of it but
    the last bytes, and wait. Each body alone is allowed; together they must not cost the
    service 40 times its largest body in memory (a thousand such connections, the connection
    limit, would be 16 GiB). Before, each request's body was gathered in memory up to
    ``max_body_bytes`` for ``body_timeout`` (60 s), with no bound over the requests: the
    service's RSS grew by ~600 MiB here, and by whatever a client chose with more
    connections. Meanwhile another client must still be answered at once."""
    proc, url = start_serve("--port", "0", "--bulk-api-key", "bulk-k")
    port = int(url.rsplit(":", 1)[1])
    announced = 15 * MIB + MIB // 2
    sent = announced - 10
    chunk = b"[" * (1 * MIB)
    try:
        before = _rss_bytes(proc.pid)
        peak = before
        answered_at = -1.0
        async with contextlib.AsyncExitStack() as stack:
            streams: list[anyio.abc.SocketStream] = []
            for _ in range(40):
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stack.enter_async_context(stream)
                streams.append(stream)

            async def hold(stream: anyio.abc.SocketStream) -> None:
                head = (
                    f"POST {BULK} HTTP/1.1\r\nHost: x\r\nx-api-key: bulk-k\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {announced}\r\n\r\n"
                ).encode()
                with contextlib.suppress(OSError, anyio.BrokenResourceError):
                    await stream.send(head)
                    left = sent
                    while left:
                        part = chunk[: min(left, len(chunk))]
                        await stream.send(part)
                        left -= len(part)

            with anyio.move_on_after(15):
                async with anyio.create_task_group() as tg:
                    for stream in streams:
                        tg.start_soon(hold, stream)
            for _ in range(20):  # let the service read what the kernel buffers hold
                await anyio.sleep(0.1)
                peak = max(peak, _rss_bytes(proc.pid))
            started = anyio.current_time()
            with anyio.fail_after(5):
                await _list_tasks(url)
            answered_at = anyio.current_time() - started
            peak = max(peak, _rss_bytes(proc.pid))
    finally:
        stop(proc)
    grown = (peak - before) / MIB
    assert grown < 300, f"RSS grew by {grown:.0f} MiB for 40 bodies held open"
    assert 0 <= answered_at < 5


async def _list_tasks(url: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + BULK, headers={"x-api-key": "bulk-k"}) as resp,
    ):
        assert resp.status == 200


async def test_a_repeated_query_parameter_is_refused(service: RunningService) -> None:
    """``?offset=1&offset=-2``: which one did the client mean? A proxy or a client library
    may read the last where the service reads the first. It must be a 400 in the error
    shape, as a negative offset alone is. Before, the service silently used the first
    (offset 1) and answered 200."""
    for query in ("?offset=1&offset=-2", "?size=5&size=500", "?offset=0&size=1&size=2"):
        status, body, _ = await raw(service, "GET", BULK + query)
        assert status == 400, (query, status, body)
        assert body["status"] == "failure" and "more than once" in body["error"], body


async def test_a_client_gone_mid_body_is_no_error_with_a_traceback(
    service: RunningService, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``fashiontag run`` killed while it sent a create (cron's ``timeout``, a Kubernetes
    Job's SIGKILL after its grace period, a laptop put to sleep) leaves the body half sent.
    The service logged that as ``ERROR unhandled error in POST ...`` with a traceback
    (``ConnectionResetError: Connection lost``) for every such request: its operator was
    told of a service fault where a client had gone. Nothing is logged above debug, and
    the service goes on answering."""
    port = int(service.url.rsplit(":", 1)[1])
    head = (
        f"POST {BULK} HTTP/1.1\r\nHost: x\r\nx-api-key: {BULK_KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with caplog.at_level("INFO", logger="fashiontag_pipeline.service"):
        for _ in range(3):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(head + b'{"requests": [' * 100)
                await anyio.sleep(0.1)
        await anyio.sleep(0.3)
        status, _, _ = await raw(service, "GET", BULK)
    assert status == 200
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
