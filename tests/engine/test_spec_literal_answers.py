"""A service that answers exactly as the spec's tables show, and no more.

The reference service adds what DESIGN section 3 settles (a ``status`` on every answer, ...);
a real service may send only what the spec lists. Each test rewrites the reference service's
answers to the spec's letter and checks the promises: every row once, no row billed twice, an
honest exit. The empty arrays of a Go service (``null``: a nil slice) are read here too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._models import BulkContext, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    TASKS_OF_1000,
    assert_exactly_once,
    client_config,
    ids_of,
    run_through,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour, misbehaving


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


class NullProxy(LiteralProxy):
    """A service whose empty arrays are written ``null`` (a Go service's nil slice: its
    encoding/json writes ``null`` for a slice it never filled)."""

    def __init__(self, kinds: set[str]) -> None:
        super().__init__(kinds, _nulled)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("POST", "PUT") and "write" in self.kinds:
            answer = await MisbehavingProxy.handle(self, request)
            if not isinstance(answer, web.Response) or not isinstance(answer.body, bytes):
                return answer
            if answer.status != 202:
                return answer
            self.rewritten += 1
            return web.json_response(_nulled(json.loads(answer.body)), status=202)
        return await super().handle(request)


def _nulled(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: None if v == [] else _nulled(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_nulled(v) for v in node]
    return node


async def test_writes_answered_with_a_null_failure_list(tmp_path: Path) -> None:
    """A create or append whose every row was taken, answered ``"failureList": null`` (a Go
    service's empty slice): the write was taken, its rows tagged once."""
    proxy = NullProxy({"write"})
    summary, o = await run_through(tmp_path, 2500, proxy, fail_after=60)
    assert proxy.rewritten
    assert summary.complete and len(o.results) == 2500 and summary.resent == 0


async def test_reads_answered_with_null_for_empty_arrays(tmp_path: Path) -> None:
    """Task lists, statuses and results pages whose empty arrays are ``null``."""
    proxy = NullProxy({"results", "status", "other"})
    summary, o = await run_through(tmp_path, 2500, proxy, fail_after=60)
    assert summary.complete and len(o.results) == 2500 and summary.resent == 0


class NullListLostCreate(NullProxy):
    """Empty arrays written ``null``, and the first create dropped unforwarded, its
    connection closed: a create the service never saw, whose answer never came."""

    def __init__(self) -> None:
        super().__init__({"other"})
        self.dropped = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.dropped:
            self.dropped += 1
            await request.read()
            assert request.transport is not None
            request.transport.abort()
            raise ConnectionResetError("create dropped on purpose")
        return await super().handle(request)


async def test_a_lost_create_looked_for_in_a_task_list_written_null(tmp_path: Path) -> None:
    """A key with no task yet, whose list is ``{"data": {"tasks": null}}`` (a Go service's
    empty slice), and a create lost on its way: the create is looked for in that list, which
    must read as empty, and the rows sent once."""
    proxy = NullListLostCreate()
    summary, o = await run_through(tmp_path, 300, proxy, fail_after=60)
    assert proxy.dropped and proxy.rewritten
    assert summary.complete and len(o.results) == 300


async def test_a_create_that_took_no_row_answered_without_a_task(tmp_path: Path) -> None:
    """A service that creates no task for a create whose every row failed validation, and
    answers 202 with its ``validation`` and ``failureList`` but no ``taskId`` (the spec shows
    none for that case; the reference service makes an empty task): the rows are the
    service's rejects, each once, and the run ends complete."""
    creates: list[int] = []

    async def create(request: web.Request) -> web.Response:
        sent = (await request.json())["taggingRequest"]
        creates.append(len(sent))
        failures = [{"request": r, "errorMessage": "image URL could not be fetched"} for r in sent]
        body = {"validation": {"accept": 0, "failure": len(sent)}, "failureList": failures}
        return web.json_response(body, status=202)

    async def tasks(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"tasks": []}})

    app = web.Application()
    app.router.add_post(BULK, create)
    app.router.add_get(BULK, tasks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    manifest = write_csv(tmp_path / "m.csv", 30)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    try:
        with anyio.fail_after(60):
            summary = await run_pipeline(
                [manifest],
                client=client_config(f"http://127.0.0.1:{port}"),
                out=out,
                rejects=rej,
                engine=TASKS_OF_1000,
            )
    finally:
        await runner.cleanup()
    o = assert_exactly_once(out, rej, ids_of(30))
    assert summary.complete and len(o.rejects) == 30 and not o.results
    assert sum(creates) == 30


class NumberEchoes(MisbehavingProxy):
    """A write's ``failureList`` echoes a numeric-looking ``context.id`` as a JSON number (a
    service that reads such ids as numbers, as its results pages may: ``"id": 17``)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request.method not in ("POST", "PUT") or not isinstance(answer, web.Response):
            return answer
        if answer.status >= 300 or not isinstance(answer.body, bytes):
            return answer
        data = json.loads(answer.body)
        for failure in data.get("failureList") or []:
            context = failure.get("request", {}).get("context", {})
            if str(context.get("id", "")).isdigit():
                context["id"] = int(context["id"])
        return web.json_response(data, status=answer.status)


async def test_a_refused_row_whose_id_is_echoed_as_a_number(tmp_path: Path) -> None:
    """Row ``17`` refused by the service, its ``failureList`` entry echoing ``"id": 17``: the
    row is the service's reject with the service's reason, not taken as accepted and sent
    again until it is an ``unreturned`` reject."""
    lines = ["id,url"] + [f"{i},https://img.example/{i}.jpg" for i in range(300)]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = NumberEchoes("", Misbehaviour(always_refused={"17"}))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
    o = assert_exactly_once(out, rej, {str(i) for i in range(300)})
    assert summary.complete and [r["id"] for r in o.rejects] == ["17"]
    assert "could not be fetched" in o.rejects[0]["reason"], o.rejects[0]
    assert summary.resent == 0


@pytest.mark.parametrize("refused", ["017", "000"])
async def test_a_refused_row_whose_id_is_echoed_as_a_number_without_its_zeros(
    tmp_path: Path, refused: str
) -> None:
    """Row ``017`` refused by a service that reads numeric-looking ids as numbers, its
    ``failureList`` entry echoing ``"id": 17``: the row is the service's reject with the
    service's reason (its results pages are read so already, ``"id": 17`` for ``"017"``).
    Before, the echo matched no row of the write, the row was taken as accepted, sent again
    in task after task until ``max_sends``, then rejected as never returned."""
    ids = [f"{i:03d}" for i in range(300)]
    lines = ["id,url"] + [f"{i},https://img.example/{i}.jpg" for i in ids]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = NumberEchoes("", Misbehaviour(always_refused={refused}))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
    o = assert_exactly_once(out, rej, set(ids))
    assert summary.complete and [r["id"] for r in o.rejects] == [refused]
    assert "could not be fetched" in o.rejects[0]["reason"], o.rejects[0]
    assert summary.resent == 0


class FailureBodyWrites(MisbehavingProxy):
    """The first ``count`` creates answered HTTP 200 with the bulk paths' failure body, not
    forwarded (a service that refuses with a success status, as its polls may)."""

    def __init__(self, count: int) -> None:
        super().__init__("", Misbehaviour())
        self.count = count
        self.refused = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and self.refused < self.count:
            self.refused += 1
            await request.read()
            body = {"status": "failure", "error": "service busy, try again later"}
            return web.json_response(body, status=200)
        return await super().handle(request)


async def test_creates_answered_200_with_the_failure_body(tmp_path: Path) -> None:
    """Creates answered HTTP 200 ``{"status": "failure", "error": ...}``: no task, nothing
    applied (the spec's failure, under a success status). Asked again, as a poll so answered
    is: before, each was taken for a create applied with an unreadable answer, its task
    looked for until ``--give-up-after``, then the run stopped saying it was applied."""
    proxy = FailureBodyWrites(2)
    summary, o = await run_through(tmp_path, 300, proxy, fail_after=60)
    assert proxy.refused == 2
    assert summary.complete and len(o.results) == 300 and len(proxy.created) == 1


async def test_fashiontag_tasks_results_prints_a_result_of_another_shape_as_it_came() -> None:
    """A results page holding a tagging result the typed model does not take (a failure
    whose ``error.code`` is a word; ``run`` writes it as it came): ``fashiontag tasks
    results`` decoded the page into the model, exit 1 with "not a results page" and nothing
    printed (as ``fashiontag tag`` did before it printed the answer as it came). It prints the
    page, that result as the service sent it."""
    worded = {
        "status": "failure",
        "error": {"code": "IMAGE_DOWNLOAD_FAILED", "message": "image could not be fetched"},
    }
    rules = Misbehaviour(results_given={"a": worded})
    request = TaggingRequest(
        image=Image(type=ImageType.URL, content="https://img.example/a.jpg"),
        context=BulkContext(id="a"),
    )
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        async with TaggerClient(config=client_config(proxy.url)) as client:
            task = await client.create_task([request])
            with anyio.fail_after(20):
                while not (await client.task_status(task.task_id)).done:
                    await anyio.sleep(0.02)
        argv = ["tasks", "results", task.task_id, "--base-url", proxy.url, "--give-up-after", "2"]
        done = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *argv], check=False, env=ENV
        )
    assert done.returncode == 0, done.stderr.decode()
    page = msgspec.json.decode(done.stdout)
    assert [r["taggingResult"] for r in page["results"]] == [worded]


class PartialFailureBodies(MisbehavingProxy):
    """Writes answered 2xx with rows refused carry ``"status": "failure"`` and no task id (a
    service that says failure when any row failed; an append's task is in its path): the
    answer's ``validation.accept`` says the other rows were taken."""

    def __init__(self) -> None:
        super().__init__("", Misbehaviour(always_refused={"p150"}))
        self.rewritten = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request.method not in ("POST", "PUT") or not isinstance(answer, web.Response):
            return answer
        if answer.status >= 300 or not isinstance(answer.body, bytes):
            return answer
        data = json.loads(answer.body)
        if not data.get("failureList"):
            return answer
        self.rewritten += 1
        data.pop("taskId", None)
        data["status"] = "failure"
        return web.json_response(data, status=answer.status)


async def test_a_failure_status_on_a_write_that_took_rows(tmp_path: Path) -> None:
    """A write answered 2xx, no task named, ``"status": "failure"`` and one row in its
    ``failureList``, but ``validation.accept`` saying the others were taken: those rows were
    applied (billed). They must not be sent again as if nothing had been."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = PartialFailureBodies()
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=msgspec.structs.replace(TASKS_OF_1000, give_up_after=5.0),
                )
        billed = svc.store.image_count
    assert proxy.rewritten
    assert billed == 299, (billed, summary)
    o = assert_exactly_once(out, rej, ids_of(300))
    assert [r["id"] for r in o.rejects] == ["p150"], o.rejects


class NulledFailures(MisbehavingProxy):
    """A write's ``failureList`` entries with ``null`` in place of what the service did not
    fill in (a Go service's nil pointer or map: ``field`` of each entry, or of its
    ``request``, written ``null``)."""

    def __init__(self, rules: Misbehaviour, nulled: tuple[str, ...]) -> None:
        super().__init__("", rules)
        self.nulled = nulled

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request.method not in ("POST", "PUT") or not isinstance(answer, web.Response):
            return answer
        if answer.status >= 300 or not isinstance(answer.body, bytes):
            return answer
        data = json.loads(answer.body)
        for failure in data.get("failureList") or []:
            node = failure
            *path, last = self.nulled
            for key in path:
                node = node[key]
            node[last] = None
        return web.json_response(data, status=answer.status)


@pytest.mark.parametrize(
    "nulled",
    [("errorMessage",), ("request", "image"), ("request", "context", "brand")],
    ids=["message", "image", "brand"],
)
async def test_a_refusal_with_null_fields_in_its_failure_list(
    tmp_path: Path, nulled: tuple[str, ...]
) -> None:
    """Row ``p3`` refused, its ``failureList`` entry holding ``null`` where the service left a
    field unset (its message, the echoed image or a context field): the whole write's answer
    was unreadable, so each write holding a refused row was taken as of unknown fate, looked
    for by its token in the task list and retried. The answer is read (a ``null`` message as
    none given): ``p3`` is the service's reject, every other row tagged, none sent again."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = NulledFailures(Misbehaviour(always_refused={"p3"}), nulled)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
        billed = svc.store.image_count
    o = assert_exactly_once(out, rej, ids_of(300))
    assert summary.complete and [r["id"] for r in o.rejects] == ["p3"]
    assert o.rejects[0]["stage"] == "server-validation"
    assert summary.ambiguous_writes == 0 and summary.resent == 0 and billed == 299


class UpperCaseEchoes(MisbehavingProxy):
    """A write's ``failureList`` echoes each ``context.id`` in upper case (a service that
    changes the case of the ids it echoes, as its results pages may)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if request.method not in ("POST", "PUT") or not isinstance(answer, web.Response):
            return answer
        if answer.status >= 300 or not isinstance(answer.body, bytes):
            return answer
        data = json.loads(answer.body)
        for failure in data.get("failureList") or []:
            context = failure.get("request", {}).get("context", {})
            if isinstance(context.get("id"), str):
                context["id"] = context["id"].upper()
        return web.json_response(data, status=answer.status)


async def test_a_refused_id_ending_in_dots_echoed_in_another_case(tmp_path: Path) -> None:
    """Row ``sku...`` (an id that ends in dots) refused by a service that echoes ids in upper
    case, beside row ``SKU-12`` in the same write: the echo ``SKU...`` is ``sku...`` changed,
    not ``SKU-12`` cut short. It was read as a cut id first: ``SKU-12``, accepted and tagged,
    was rejected with the other row's reason, and ``sku...`` was sent again until it was an
    ``unreturned`` reject."""
    ids = [str(i) for i in range(50)] + ["sku...", "SKU-12"]
    lines = ["id,url"] + [f"{i},https://img.example/{n}.jpg" for n, i in enumerate(ids)]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = UpperCaseEchoes("", Misbehaviour(always_refused={"sku..."}))
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
    o = assert_exactly_once(out, rej, set(ids))
    assert summary.complete and [r["id"] for r in o.rejects] == ["sku..."], o.rejects
    assert "could not be fetched" in o.rejects[0]["reason"], o.rejects[0]
    assert summary.resent == 0
