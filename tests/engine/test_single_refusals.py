"""Refusals of the single endpoint that come from a front end, not the service (found by a hunt).

A gateway in front of the service answers in its own words: nginx's ``400 The plain HTTP
request was sent to HTTPS port`` (``--base-url http://`` to its TLS port) refuses every
request, whatever the image. Taken as the service's refusal of each image, every local-file
and ``data:`` row was a ``server-validation`` reject and the run ended complete, exit 0: no
row was tagged, and none was ever sent again.
"""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, read_outcomes
from .proxy import Misbehaviour, misbehaving
from .test_single_mode import red_picture, write_csv_rows

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2, fsync_seconds=10.0)

SINGLE = "/tagger/v2/tags"

NGINX_400 = (
    b"<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>"
    b"\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>The plain HTTP"
    b" request was sent to HTTPS port</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n"
    b"</html>\r\n"
)
NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>"
    b"\r\n</body>\r\n</html>\r\n"
)


@dataclass
class Gateway:
    """A front end forwarding to the service, but answering a request to the single endpoint
    whose body holds ``holding`` with ``status`` and ``page`` itself (b"": every one)."""

    upstream: str
    status: int
    page: bytes
    holding: bytes = b""
    url: str = ""
    refused: int = 0
    #: Answer that share of the requests to the single endpoint (drawn by ``seed``) with
    #: ``status`` and ``page`` (JSON), the rest forwarded; None: by ``holding``.
    share: float | None = None
    seed: int = 0


@asynccontextmanager
async def gateway(rules: Gateway) -> AsyncIterator[Gateway]:
    session = aiohttp.ClientSession()
    dice = random.Random(rules.seed)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == SINGLE and rules.share is not None:
            if dice.random() < rules.share:
                rules.refused += 1
                return web.Response(
                    status=rules.status, body=rules.page, content_type="application/json"
                )
        elif request.path == SINGLE and rules.holding in body:
            rules.refused += 1
            return web.Response(status=rules.status, body=rules.page, content_type="text/html")
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("x-api-key",)}
        headers["content-type"] = "application/json"
        async with session.request(
            request.method, rules.upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            return web.Response(
                status=answer.status, body=await answer.read(), content_type="application/json"
            )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rules.url = f"http://127.0.0.1:{port}"
    try:
        yield rules
    finally:
        await runner.cleanup()
        await session.close()


async def test_a_gateway_refusing_every_single_request_stops_the_run_and_rejects_no_row(
    tmp_path: Path,
) -> None:
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(5)]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state"
    engine = msgspec.structs.replace(FAST, give_up_after=1.0)
    async with running_service(ServiceConfig()) as svc:
        async with gateway(Gateway(svc.url, 400, NGINX_400)) as gw:
            with pytest.raises(FatalRunError, match="plain HTTP request was sent to HTTPS port"):
                await run_pipeline(
                    [manifest],
                    client=client_config(gw.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=engine,
                )
        assert gw.refused >= 5
        o = read_outcomes(out, rej)
        assert not o.rejects and not o.results
        # The right base URL: the same command tags the rows that waited.
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            state=state,
            engine=FAST,
        )
    assert summary.complete and summary.rejected == 0 and summary.tagged == 5
    assert_exactly_once(out, rej, {i for i, _ in rows})


@pytest.mark.parametrize(("status", "page"), [(400, NGINX_400), (413, NGINX_413)])
async def test_a_gateway_refusing_one_image_while_others_are_tagged_rejects_that_row(
    tmp_path: Path, status: int, page: bytes
) -> None:
    """A front end refusing one image only (nginx's body limit for a big one) while the others
    are tagged: that refusal is the image's, a ``server-validation`` reject with the page's
    words, the run complete (not stopped every night on it)."""
    png = red_picture(tmp_path / "red.png")
    big = red_picture(tmp_path / "big.jpg")
    rows = [("big", str(big))] + [(f"s{i}", str(png)) for i in range(20)]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, give_up_after=10.0)
    marker = base64.b64encode(big.read_bytes())[-120:]
    rules = Gateway("", status, page, holding=marker)
    async with running_service(ServiceConfig()) as svc:
        rules.upstream = svc.url
        async with gateway(rules) as gw:
            summary = await run_pipeline(
                [manifest], client=client_config(gw.url), out=out, rejects=rej, engine=engine
            )
    assert summary.complete and summary.rejected == 1 and summary.tagged == 20
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    (reject,) = o.rejects
    assert reject["id"] == "big" and reject["stage"] == "server-validation"
    assert str(status) in reject["reason"], reject


@pytest.mark.parametrize(
    ("code", "message", "fatal"),
    [
        (823, "usage quota exceeded", "rate limiting this key"),
        (609, "authentication failed", "the service refused the run"),
        (612, "API key required", "the service refused the run"),
        (500, "internal error", "answering with errors"),
        (623, "invalid URI or method", "about no image"),
    ],
)
async def test_a_single_mode_200_failure_about_no_image_is_no_result(
    tmp_path: Path, code: int, message: str, fatal: str
) -> None:
    """The single endpoint answers HTTP 200 with the service's failure body, its ``error``
    an object, whose code says the request was refused for no image of its own (823 usage
    quota exceeded, 609 authentication failed, 612 API key required, 500 internal error,
    623 invalid URI or method: codes the service family documents; the spec shows no HTTP
    status for them). Each row was written as a tagging failure and the run ended complete,
    exit 0: no image tagged, none sent again. A quota is retried as a 429 and an internal
    error as a 5xx (under the run's budget), a refused key or a 623 (the 405 of a wrong base
    URL) stops the run at once; the rows wait in the state either way."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(3)]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state"
    engine = msgspec.structs.replace(FAST, give_up_after=1.0)
    refusal = {"status": "failure", "error": {"code": code, "message": message}}
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(single_given=refusal)) as proxy:
            with pytest.raises(FatalRunError, match=fatal) as raised:
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=engine,
                )
        assert message in str(raised.value)
        o = read_outcomes(out, rej)
        assert not o.results and not o.rejects
        again = client_config(svc.url)
        summary = await run_pipeline(
            [manifest], client=again, out=out, rejects=rej, state=state, engine=FAST
        )
    assert summary.complete and summary.tagged == 3 and summary.failed == 0
    assert_exactly_once(out, rej, {i for i, _ in rows})


MAINTENANCE = b"<!DOCTYPE html><html><head><title>Down for maintenance</title></head></html>"


@pytest.mark.parametrize(
    "page",
    [b'{"status": "failure", "error": "rate limit exceeded"}', MAINTENANCE, b""],
    ids=["rate-limit-worded", "maintenance-page", "empty"],
)
async def test_a_rate_limit_worded_as_a_failure_rejects_no_good_image(
    tmp_path: Path, page: bytes
) -> None:
    """A gateway's rate limit answered HTTP 200 in the bulk paths' error shape (``{"status":
    "failure", "error": "rate limit exceeded"}``) to part of the single-mode requests, the
    others tagged (a per-second limit under ``--single-concurrency``): it says nothing of the
    image sent, yet counted as the image's failure with others tagged in between, so a good
    picture refused ``max_sends`` times was rejected as one the service fails on (a fifth of
    them here, ``max_sends`` 2; one in 30 at the default 5 with 50 % refused). So did a
    front end's page served 200 (a backend in maintenance behind the load balancer), or an
    empty 200, to part of them."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(100)]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, max_sends=2, give_up_after=20.0)
    rules = Gateway("", 200, page, share=0.45, seed=3)
    async with running_service(ServiceConfig()) as svc:
        rules.upstream = svc.url
        async with gateway(rules) as gw:
            summary = await run_pipeline(
                [manifest], client=client_config(gw.url), out=out, rejects=rej, engine=engine
            )
    assert rules.refused > 20
    assert summary.complete and summary.rejected == 0, read_outcomes(out, rej).rejects[:2]
    assert_exactly_once(out, rej, {i for i, _ in rows})
