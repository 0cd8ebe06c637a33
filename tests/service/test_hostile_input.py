"""Hostile request bodies and queries: nothing stalls the loop, answers stay small, errors are
4xx with the JSON error shape (never a 500 with a logged traceback)."""

from __future__ import annotations

import base64
import io
import json
import logging
import struct
import threading
import zlib
from typing import Any

import aiohttp
import anyio
import pytest

from fashiontag_pipeline.service import ReferenceAnalyzer, RunningService
from fashiontag_pipeline.service.analyzer import Analysis

from .conftest import BULK_KEY, KEY, StartService
from .test_bulk import raw
from .test_single import data_url, product_png

SINGLE = "/tagger/v2/tags"
BULK = "/tagger/v2.12/bulk"


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` grey pixels (only a few bytes of data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


class BlockingAnalyzer(ReferenceAnalyzer):
    """from_bytes waits (in whatever thread runs it) until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def from_bytes(self, data: bytes) -> Analysis:
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        self.entered.release()
        try:
            # Bounded: on the event loop (the old behaviour) this would stall every request.
            self.release.wait(5)
            return Analysis(1)
        finally:
            with self._lock:
                self.active -= 1


async def post(service: RunningService, path: str, data: bytes, key: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            service.url + path,
            data=io.BytesIO(data),
            headers={"x-api-key": key, "content-type": "application/json"},
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def test_a_small_base64_image_is_decoded_off_the_event_loop(
    start_service: StartService,
) -> None:
    analyzer = BlockingAnalyzer()
    service = await start_service(analyzer=analyzer)
    small = data_url(product_png((10, 200, 10)))  # a few hundred bytes: was decoded inline
    done: list[str] = []

    async def tag_base64() -> None:
        status, _, _ = await raw(
            service, "POST", SINGLE, {"image": {"type": "base64", "content": small}}, key=KEY
        )
        assert status == 200
        done.append("base64")

    async def tag_url() -> None:
        status, _, _ = await raw(
            service,
            "POST",
            SINGLE,
            {"image": {"type": "url", "content": "https://cdn.test/a.jpg"}},
            key=KEY,
        )
        assert status == 200
        done.append("url")

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(tag_base64)
            await anyio.to_thread.run_sync(analyzer.entered.acquire)
            await tag_url()  # answered while the image is still being decoded
            analyzer.release.set()
    assert done == ["url", "base64"]


def test_decoded_pixels_reads_only_the_header() -> None:
    from fashiontag_pipeline.service.decoding import decoded_pixels

    assert decoded_pixels(png_header(6300, 6300)) == 6300 * 6300
    assert decoded_pixels(b"not an image") == 0


async def test_decodes_wait_for_their_pixels_to_fit_the_budget() -> None:
    from fashiontag_pipeline.service.decoding import DecodePool

    analyzer = BlockingAnalyzer()
    pool = DecodePool(4, pixel_budget=6300 * 6300)
    big = png_header(6300, 6300)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(pool.analyze, analyzer, big)
            await anyio.to_thread.run_sync(analyzer.entered.acquire)
            await anyio.sleep(0.2)  # give the others a chance to (wrongly) start
            assert analyzer.active == 1
            analyzer.release.set()
    assert analyzer.most_active == 1


@pytest.mark.parametrize("path,key", [(SINGLE, KEY), (BULK, BULK_KEY)])
@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"taggingRequest": "\xff\xfe"}'],
    ids=["deep", "bad-utf8"],
)
async def test_malformed_json_is_400_without_a_logged_traceback(
    service: RunningService,
    caplog: pytest.LogCaptureFixture,
    path: str,
    key: str,
    body: bytes,
) -> None:
    with caplog.at_level(logging.DEBUG):
        status, payload = await post(service, path, body, key)
    assert status == 400
    assert payload["status"] == "failure"
    if path == SINGLE:
        assert payload["error"]["code"] == 824
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("path,key", [(SINGLE, KEY), (BULK, BULK_KEY)])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decompress_is_400_not_a_500(
    service: RunningService,
    caplog: pytest.LogCaptureFixture,
    path: str,
    key: str,
    encoding: str,
) -> None:
    """A body labelled gzip (or deflate) that is not: the caller's mistake, not the service's."""
    with caplog.at_level(logging.DEBUG):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                service.url + path,
                data=b"not compressed at all",
                headers={
                    "x-api-key": key,
                    "content-type": "application/json",
                    "content-encoding": encoding,
                },
            ) as resp,
        ):
            status, payload = resp.status, await resp.json(content_type=None)
    assert status == 400
    assert payload["status"] == "failure"
    message = payload["error"]["message"] if path == SINGLE else payload["error"]
    assert encoding in message
    if path == SINGLE:
        assert payload["error"]["code"] == 824
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_client_gone_mid_body_logs_no_traceback(
    service: RunningService, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG), anyio.fail_after(10):
        stream = await anyio.connect_tcp(service.host, service.port)
        async with stream:
            await stream.send(
                b"POST " + BULK.encode() + b" HTTP/1.1\r\nHost: x\r\nx-api-key: "
                b"%s\r\nContent-Length: 1000\r\n\r\n{" % BULK_KEY.encode()
            )
            await stream.send_eof()
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await stream.receive()
        await anyio.sleep(0.1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_failure_list_echoes_the_spec_fields_cut_short(service: RunningService) -> None:
    huge = "x" * 100_000
    element = {
        "image": {"type": "url", "content": "ftp://" + huge, "extra": huge},
        "context": {"id": "a", "keywords": huge, "notInSpec": huge, "age": [huge[:100]] * 100},
        "junk": huge,
    }
    body = json.dumps({"taggingRequest": [element] * 20}).encode()
    status, payload = await post(service, BULK, body, BULK_KEY)
    assert status == 202
    failures = payload["failureList"]
    assert len(failures) == 20
    echo = failures[0]["request"]
    assert set(echo) == {"image", "context"}
    assert set(echo["image"]) == {"type", "content"}
    assert set(echo["context"]) == {"id", "keywords", "age"}
    assert echo["context"]["id"] == "a"
    # Whole up to the longest URL the service takes (8,192), then cut with an ellipsis.
    assert len(echo["image"]["content"]) == 8193 and echo["image"]["content"].startswith("ftp://")
    assert len(echo["context"]["age"]) <= 16
    assert len(str(payload)) < 500_000  # was ~16 MB


async def test_single_mode_caps_url_length(service: RunningService) -> None:
    url = "https://cdn.test/" + "a" * 9000
    status, payload, _ = await raw(
        service, "POST", SINGLE, {"image": {"type": "url", "content": url}}, key=KEY
    )
    assert status == 200
    assert payload["status"] == "failure" and payload["error"]["code"] == 803


@pytest.mark.parametrize("value", ["+3", " 3", "3_0", "\uff13", "1" * 40])
async def test_query_integers_are_plain_decimals(service: RunningService, value: str) -> None:
    status, created, _ = await raw(
        service,
        "POST",
        BULK,
        {
            "taggingRequest": [
                {"image": {"type": "url", "content": "https://c/1"}, "context": {"id": "1"}}
            ]
        },
    )
    assert status == 202
    for path in (f"{BULK}/{created['taskId']}", BULK):
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                service.url + path, params={"offset": value}, headers={"x-api-key": BULK_KEY}
            ) as resp,
        ):
            assert resp.status == 400, path


async def test_chunked_body_over_the_limit_gets_413(start_service: StartService) -> None:
    service = await start_service(max_body_bytes=64 * 1024)

    async def body() -> Any:
        for _ in range(32):
            yield b" " * 8192

    async with (
        aiohttp.ClientSession() as session,
        session.post(service.url + BULK, data=body(), headers={"x-api-key": BULK_KEY}) as resp,
    ):
        assert resp.status == 413
        assert (await resp.json())["status"] == "failure"


async def test_slow_body_gets_408(start_service: StartService) -> None:
    service = await start_service(body_timeout=0.3)
    with anyio.fail_after(10):
        stream = await anyio.connect_tcp(service.host, service.port)
        async with stream:
            await stream.send(
                b"POST "
                + BULK.encode()
                + b" HTTP/1.1\r\nHost: x\r\nx-api-key: "
                + BULK_KEY.encode()
                + b"\r\nContent-Length: 1000\r\n\r\n{"
            )
            answer = b""
            while b"\r\n" not in answer:
                answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 408")


def test_base64_helper_round_trip() -> None:
    assert base64.b64decode(data_url(b"ab").split(",", 1)[1]) == b"ab"


MALFORMED_URLS = ["http://[bad/a.jpg", "http://cdn.test:99999/a.jpg", "https://cdn.test:port/a.jpg"]


async def test_a_malformed_image_url_in_fetch_mode_is_803_not_a_500(
    start_service: StartService, caplog: pytest.LogCaptureFixture
) -> None:
    """Fetch mode, an image URL with a port out of range or a broken IPv6 bracket (it passes
    the ``http(s)://`` check): single mode answered 500 "internal error" (a 5xx, which clients
    retry as transient, for a URL that can never be fetched) and bulk gave each such image a
    500 failure, each with a traceback in the service log. Now 803, as any URL that cannot be
    fetched, and nothing logged past INFO."""
    service = await start_service(fetch=True)
    with caplog.at_level(logging.INFO, logger="fashiontag_pipeline.service"):
        for url in MALFORMED_URLS:
            status, body, _ = await raw(
                service, "POST", SINGLE, {"image": {"type": "url", "content": url}}, key=KEY
            )
            assert (status, body["error"]["code"]) == (200, 803), (url, status, body)
        elements = [
            {"image": {"type": "url", "content": url}, "context": {"id": str(n)}}
            for n, url in enumerate(MALFORMED_URLS)
        ]
        _, created, _ = await raw(service, "POST", BULK, {"taggingRequest": elements})
        path = f"{BULK}/{created['taskId']}"
        with anyio.fail_after(10):
            while (await raw(service, "GET", f"{path}/status"))[1]["data"]["taskStatus"] != (
                "TASK_DONE"
            ):
                await anyio.sleep(0.02)
        _, page, _ = await raw(service, "GET", path)
        codes = [r["taggingResult"]["error"]["code"] for r in page["data"]["results"]]
        assert codes == [803] * len(MALFORMED_URLS), page
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
