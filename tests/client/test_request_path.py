"""The client's request path against a real loopback server: URLs as sent, one deadline per
request (not a per-read socket timer)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from aiohttp import web
from yarl import URL

from fashiontag_pipeline import RetryPolicy, TaggerClient, Timeout
from fashiontag_pipeline._exceptions import TimeoutError_
from fashiontag_pipeline._request_urls import RequestUrls

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_results_url_path_and_query_as_sent() -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.Response(body=b'{"status":"success","data":{"results":[]}}')

    async with serving(handler) as url, TaggerClient(url + "/", bulk_api_key="k") as client:
        await client.task_results_raw("t 1/é", offset=200, size=100)
        await client.task_results_raw("t-2")
    assert seen == [
        "/tagger/v2.12/bulk/t%201%2F%C3%A9?offset=200&size=100",
        "/tagger/v2.12/bulk/t-2?offset=0&size=100",
    ]


async def test_base_url_with_a_path_prefix() -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.Response(body=b'{"status":"success","data":{"results":[]}}')

    async with serving(handler) as url, TaggerClient(url + "/api/", bulk_api_key="k") as client:
        await client.task_results_raw("t-1", offset=5, size=7)
    assert seen == ["/api/tagger/v2.12/bulk/t-1?offset=5&size=7"]


async def test_a_trickling_response_hits_the_request_deadline() -> None:
    """A body that keeps arriving, each piece well within ``read``, still ends at the one
    deadline of the request (``connect + read``): a per-read timer would wait forever."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        with anyio.move_on_after(10):  # bounded: the client gives up long before
            try:
                while True:
                    await resp.write(b" ")
                    await anyio.sleep(0.02)
            except ConnectionResetError:  # the client gave up
                pass
        return resp

    timeout = Timeout(connect=0.2, read=0.3)
    retry = RetryPolicy(max_attempts=1)
    async with (
        serving(handler) as url,
        TaggerClient(url, bulk_api_key="k", timeout=timeout, retry=retry) as client,
    ):
        with anyio.fail_after(8):
            with pytest.raises(TimeoutError_):
                await client.task_results_raw("t-1")


async def test_a_write_answered_2xx_with_an_unreadable_body_is_ambiguous() -> None:
    """The write was applied, its answer is garbage: never re-sent blindly (a second task)."""
    from aioresponses import aioresponses

    from fashiontag_pipeline import AmbiguousWriteError, TaggerClient
    from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest

    request = TaggingRequest(Image(ImageType.URL, "https://x/1.jpg"), BulkContext("1"))
    with aioresponses() as mocked:
        mocked.post("http://svc/tagger/v2.12/bulk", status=202, body=b"<html>proxy</html>")
        async with TaggerClient("http://svc", api_key="k", bulk_api_key="b") as client:
            with pytest.raises(AmbiguousWriteError):
                await client.create_task([request], description="run t1")
            assert client.stats.ambiguous_writes == 1
            assert client.stats.requests == 1


async def test_a_service_that_refuses_list_paging_is_asked_without_it() -> None:
    """A service whose list takes no offset/size (400) gets the plain list from then on."""
    import re

    from aioresponses import aioresponses

    from fashiontag_pipeline import TaggerClient

    listing = {
        "status": "success",
        "data": {
            "tasks": [
                {"taskId": "t2", "count": {"total": 1}, "taskStatus": "TASK_DONE"},
                {"taskId": "t1", "count": {"total": 1}, "taskStatus": "TASK_DONE"},
            ]
        },
    }
    paged = re.compile(r"^http://svc/tagger/v2\.12/bulk\?offset=.*$")
    with aioresponses() as mocked:
        mocked.get(paged, status=400, payload={"status": "failure", "error": "bad param"})
        mocked.get("http://svc/tagger/v2.12/bulk", payload=listing, repeat=True)
        async with TaggerClient("http://svc", api_key="k", bulk_api_key="b") as client:
            assert [t.task_id for t in await client.all_tasks()] == ["t2", "t1"]
            assert [t.task_id for t in await client.list_tasks(offset=0, size=1000)] == [
                "t2",
                "t1",
            ]
            assert client.stats.requests == 3  # one refused paged call, then plain ones


BASES = [
    "http://127.0.0.1:8080",
    "https://gw.example/tagging/v1",
    "http://user:p%40ss@host.example:9000/api/",
    "http://[::1]:8080",
    "https://xn--bcher-kva.example",
    "http://h.example/a%20b",
]
REQUESTS = [
    ("/tagger/v2.12/bulk", ""),
    ("/tagger/v2.12/bulk/a%2Fb%3F%23", "?offset=100&size=100"),
    ("/tagger/v2.12/bulk/t1/status", ""),
]


def _seen(url: URL) -> tuple[object, ...]:
    """What aiohttp reads of a request URL."""
    return (
        str(url),
        url.scheme,
        url.raw_authority,
        url.raw_host,
        url.host,
        url.port,
        url.raw_user,
        url.raw_password,
        url.raw_path,
        url.raw_query_string,
        url.raw_fragment,
        url.raw_path_qs,
        url.origin(),
        url,
    )


@pytest.mark.parametrize("base", BASES)
def test_request_urls_built_from_parts_are_the_urls_parsed(base: str) -> None:
    """A request's URL built from the base's parts (the fast path) is the URL its text parses
    to, whatever the base (a path prefix, credentials, IPv6, punycode, a trailing slash), and
    so is the parsed one (the fallback)."""
    urls = RequestUrls(str(URL(base)))
    assert urls.parts is not None
    parsed = RequestUrls(urls.base)
    parsed.parts = None
    for path, query in REQUESTS:
        expected = _seen(URL(urls.base + path + query, encoded=True))
        assert _seen(urls.url(path, query)) == expected
        assert _seen(parsed.url(path, query)) == expected


async def test_request_heads_as_sent() -> None:
    """Each operation's request line and headers on the wire, in order (the keys, the
    language, a JSON body's type, the session's User-Agent, aiohttp's own), and a cookie a
    front end sets on a read's answer sent back on every later read (the pool of writes has a
    jar of its own: none set on a write's answer here)."""
    from fashiontag_pipeline._exceptions import FashiontagError
    from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest

    seen: list[list[tuple[str, str]]] = []

    async def handler(request: web.Request) -> web.Response:
        head = [(k.decode(), v.decode()) for k, v in request.raw_headers]
        seen.append([(request.method, request.raw_path), *head])
        if request.path.endswith("/tags"):
            return web.json_response({"status": "success", "data": {"tags": []}})
        if request.method != "GET":
            answer = {"status": "success", "taskId": "t1", "validation": {"accept": 1}}
            return web.json_response(answer, status=202)
        if request.path.endswith("/status"):
            task = {"taskId": "t1", "count": {"total": 1}, "taskStatus": "TASK_DONE"}
            return web.json_response({"status": "success", "data": task})
        response = web.json_response({"status": "success", "data": {"results": []}})
        if request.path == "/":
            response.set_cookie("lb", "node-2")
        return response

    request = TaggingRequest(Image(ImageType.URL, "https://x/1.jpg"), BulkContext("1"))
    image = Image(ImageType.URL, "https://x/2.jpg")
    async with serving(handler) as url:
        url = url.replace("127.0.0.1", "localhost")  # (a cookie of an IP address is not kept)
        async with TaggerClient(url, api_key="single", bulk_api_key="bulk") as client:
            assert await client.probe() == 200
            await client.task_results_raw("t1", offset=100, size=100)
            await client.task_results_raw("t1", language="ko")
            await client.task_status("t1")
            with contextlib.suppress(FashiontagError):  # (the answers' shapes: not the point)
                await client.create_task([request], description="d")
            with contextlib.suppress(FashiontagError):
                await client.append_to_task("t1", [request])
            with contextlib.suppress(FashiontagError):
                await client.tag_raw(image)
            await client.task_results_raw("t1", offset=0, size=1)
        host = url.removeprefix("http://")
    plain = [("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate")]
    ua = ("User-Agent", "fashiontag_pipeline/0.1")
    cookie = ("Cookie", "lb=node-2")
    json_body = ("Content-Type", "application/json")

    def read(line: tuple[str, str], *head: tuple[str, str]) -> list[tuple[str, str]]:
        return [line, ("Host", host), ua, *head, *plain, cookie]

    def write(line: tuple[str, str], key: str, n: int) -> list[tuple[str, str]]:
        head = [("accept-language", "en"), ("x-api-key", key), json_body]
        return [line, ("Host", host), ua, *head, *plain, ("Content-Length", str(n))]

    bulk = [("accept-language", "en"), ("x-api-key", "bulk")]
    assert seen[0] == [("GET", "/"), ("Host", host), ua, ("accept-language", "en"), *plain]
    assert seen[1] == read(("GET", "/tagger/v2.12/bulk/t1?offset=100&size=100"), *bulk)
    ko = [("accept-language", "ko"), ("x-api-key", "bulk")]
    assert seen[2] == read(("GET", "/tagger/v2.12/bulk/t1?offset=0&size=100"), *ko)
    assert seen[3] == read(("GET", "/tagger/v2.12/bulk/t1/status"), *bulk)
    lengths = [int(dict(s)["Content-Length"]) for s in seen[4:7]]
    assert seen[4] == write(("POST", "/tagger/v2.12/bulk"), "bulk", lengths[0])
    assert seen[5] == write(("PUT", "/tagger/v2.12/bulk/t1"), "bulk", lengths[1])
    assert seen[6] == write(("POST", "/tagger/v2/tags"), "single", lengths[2])
    assert seen[7] == read(("GET", "/tagger/v2.12/bulk/t1?offset=0&size=1"), *bulk)
    assert len(seen) == 8
