"""A service that answers exactly as the spec's tables show, and no more.

The reference service adds what DESIGN section 3 settles (a ``status`` on every answer, ...);
a real service may send only what the spec lists. Each test rewrites the reference service's
answers to the spec's letter and checks the promises: every row once, no row billed twice, an
honest exit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from aiohttp import web

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import client_config, run_through
from .proxy import BULK, MisbehavingProxy, Misbehaviour


class LiteralProxy(MisbehavingProxy):
    """The reference service with the JSON answers of ``kinds`` passed through ``rewrite``."""

    def __init__(self, kinds: set[str], rewrite: Any) -> None:
        super().__init__("", Misbehaviour())
        self.kinds = kinds
        self.rewrite = rewrite
        self.rewritten = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        path = request.path
        kind = (
            "results"
            if request.method == "GET"
            and path.startswith(BULK + "/")
            and not path.endswith("/status")
            else "status"
            if path.endswith("/status")
            else "other"
        )
        if kind not in self.kinds or not isinstance(answer, web.Response):
            return answer
        if answer.status != 200 or not isinstance(answer.body, bytes):
            return answer
        data = json.loads(answer.body)
        self.rewritten += 1
        return web.json_response(self.rewrite(data), status=answer.status)


def _without_status(data: dict[str, Any]) -> dict[str, Any]:
    data.pop("status", None)
    data.pop("error", None)
    return data


async def test_results_pages_that_carry_only_data_as_section_4_6_shows(tmp_path: Path) -> None:
    """Spec 4.6 lists a results page's body as ``data.taskInfo`` and ``data.results[]`` only:
    no top-level ``status`` (4.4 and 4.5 list one; 4.6 does not). A service that answers so
    must have its pages read, not refused for a missing field."""
    proxy = LiteralProxy({"results"}, _without_status)
    summary, o = await run_through(tmp_path, 250, proxy, fail_after=60)
    assert proxy.rewritten
    assert summary.complete and len(o.results) == 250 and summary.resent == 0


async def test_the_library_reads_a_results_page_that_carries_only_data(tmp_path: Path) -> None:
    """The same page read by ``TaggerClient.task_results`` (``fashiontag tasks results``):
    before, a DecodeError "not a results page: missing required field status"."""
    proxy = LiteralProxy({"results"}, _without_status)
    request = TaggingRequest(
        image=Image(type=ImageType.URL, content="https://img.example/a.jpg"),
        context=BulkContext(id="a"),
    )
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running(), TaggerClient(config=client_config(proxy.url)) as client:
            task = await client.create_task([request])
            with anyio.fail_after(20):
                while not (await client.task_status(task.task_id)).done:
                    await anyio.sleep(0.02)
            page = await client.task_results(task.task_id)
    assert proxy.rewritten and [r.id for r in page.results] == ["a"]
