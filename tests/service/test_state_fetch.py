"""SQLite persistence across restarts, and fetch mode against a local image server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline import AmbiguousWriteError, RetryPolicy, TaggerClient
from fashiontag_pipeline._models import (
    BulkContext,
    Context,
    Detection,
    Image,
    ImageType,
    TaggingRequest,
    TaskStatus,
)
from fashiontag_pipeline.service import ServiceConfig, run_service, running_service

from .conftest import BULK_KEY, KEY, StartService, requests
from .test_single import product_png

CONFIG = {"api_keys": (KEY,), "bulk_api_keys": (BULK_KEY,)}


async def test_restart_keeps_tasks_and_results(
    tmp_path: Path, client_for: Callable[..., TaggerClient]
) -> None:
    state = tmp_path / "state.sqlite"
    config = ServiceConfig(state_path=state, **CONFIG)  # type: ignore[arg-type]
    async with running_service(config) as svc:
        client = client_for(svc.url)
        created = await client.create_task(requests(150), description="keep me")
        await client.append_to_task(created.task_id, requests(5, start=150))
        before = [
            (await client.task_results(created.task_id, offset=o, size=100)).results
            for o in (0, 100)
        ]
        status_before = await client.task_status(created.task_id)
    async with running_service(config) as svc:
        client = client_for(svc.url)
        assert [t.task_id for t in await client.list_tasks()] == [created.task_id]
        status_after = await client.task_status(created.task_id)
        assert status_after == status_before
        after = [
            (await client.task_results(created.task_id, offset=o, size=100)).results
            for o in (0, 100)
        ]
        assert after == before
        # Duplicates are still detected after the restart.
        again = await client.append_to_task(created.task_id, requests(1, start=3))
        assert again.failure_list[0].error_message.startswith("duplicate context.id")


async def test_restart_resumes_pending_work(
    tmp_path: Path, client_for: Callable[..., TaggerClient]
) -> None:
    state = tmp_path / "state.sqlite"
    slow = ServiceConfig(state_path=state, rate=20.0, **CONFIG)  # type: ignore[arg-type]
    async with running_service(slow) as svc:
        created = await client_for(svc.url).create_task(requests(100))
        partial = await client_for(svc.url).task_status(created.task_id)
        assert partial.task_status is TaskStatus.PROCESSING
    fast = ServiceConfig(state_path=state, rate=0.0, **CONFIG)  # type: ignore[arg-type]
    async with running_service(fast) as svc:
        client = client_for(svc.url)
        with anyio.fail_after(5):
            while not (task := await client.task_status(created.task_id)).done:
                await anyio.sleep(0.01)
        assert task.count.done == 100
        page = await client.task_results(created.task_id, offset=90)
        assert [r.id for r in page.results] == [f"sku-{i}" for i in range(90, 100)]


async def test_run_service_in_task_group(client_for: Callable[..., TaggerClient]) -> None:
    async with anyio.create_task_group() as tg:
        url = await tg.start(run_service, ServiceConfig(**CONFIG), "127.0.0.1", 0)  # type: ignore[arg-type]
        assert url.startswith("http://127.0.0.1:")
        assert await client_for(url).list_tasks() == []
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def image_server() -> AsyncIterator[str]:
    red = product_png((200, 20, 30))

    async def png(request: web.Request) -> web.Response:
        return web.Response(body=red, content_type="image/png")

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html></html>", content_type="text/html")

    async def junk(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG broken", content_type="image/png")

    app = web.Application()
    app.router.add_get("/red.png", png)
    app.router.add_get("/page.html", html)
    app.router.add_get("/junk.png", junk)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_fetch_mode_measures_and_fails_per_image(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    async with image_server() as images:
        service = await start_service(fetch=True)
        client = client_for(service.url)
        urls = [
            f"{images}/red.png",
            f"{images}/missing.png",
            f"{images}/page.html",
            f"{images}/junk.png",
            "http://127.0.0.1:1/refused.png",
        ]
        reqs = [
            TaggingRequest(
                image=Image(type=ImageType.URL, content=url),
                context=BulkContext(id=f"img-{i}", detection=list(Detection)),
            )
            for i, url in enumerate(urls)
        ]
        created = await client.create_task(reqs)
        with anyio.fail_after(10):
            while not (task := await client.task_status(created.task_id)).done:
                await anyio.sleep(0.02)
        assert (task.count.total, task.count.done, task.count.failure) == (5, 1, 4)
        page = await client.task_results(created.task_id)
        results = {r.id: r.tagging_result for r in page.results}
        ok = results["img-0"]
        assert ok.ok and ok.data is not None
        tags = [t for o in ok.data.objects for t in o.tags]
        assert tags and tags[0].colors[0].name == "red"
        codes = {k: v.error.code for k, v in results.items() if v.error is not None}
        assert codes == {"img-1": 803, "img-2": 803, "img-3": 805, "img-4": 803}
        assert all(not results[k].ok for k in codes)
        # Single mode fetches too.
        single = await client.tag(
            Image(type=ImageType.URL, content=f"{images}/red.png"),
            Context(detection=list(Detection)),
        )
        assert single.ok and single.data is not None
        assert next(t for o in single.data.objects for t in o.tags).colors[0].name == "red"
        failed = await client.tag(Image(type=ImageType.URL, content=f"{images}/page.html"))
        assert not failed.ok and failed.error is not None and failed.error.code == 803


@pytest.mark.parametrize("fetch", [True])
async def test_fetch_state_survives_restart(
    tmp_path: Path, client_for: Callable[..., TaggerClient], fetch: bool
) -> None:
    state = tmp_path / "fetch.sqlite"
    async with image_server() as images:
        config = ServiceConfig(state_path=state, fetch=fetch, **CONFIG)  # type: ignore[arg-type]
        reqs = [
            TaggingRequest(
                image=Image(type=ImageType.URL, content=f"{images}/{name}"),
                context=BulkContext(id=name, detection=list(Detection)),
            )
            for name in ("red.png", "missing.png")
        ]
        async with running_service(config) as svc:
            client = client_for(svc.url)
            created = await client.create_task(reqs)
            with anyio.fail_after(10):
                while not (await client.task_status(created.task_id)).done:
                    await anyio.sleep(0.02)
            before = (await client.task_results(created.task_id)).results
        async with running_service(config) as svc:
            after = (await client_for(svc.url).task_results(created.task_id)).results
        assert after == before
        assert after[1].tagging_result.error is not None


async def test_an_append_that_cannot_be_saved_is_not_accepted(
    tmp_path: Path, client_for: Callable[..., TaggerClient]
) -> None:
    """A PUT whose images cannot be written to --state answers 5xx and leaves the task as it
    was: the retried PUT is accepted afresh (not taken for duplicates of images nobody would
    tag) and the task finishes."""
    from fashiontag_pipeline.service.journal import Journal

    state = tmp_path / "state.sqlite"
    config = ServiceConfig(state_path=state, **CONFIG)  # type: ignore[arg-type]
    async with running_service(config) as svc:
        client = client_for(svc.url, retry=RetryPolicy(max_attempts=1))
        created = await client.create_task(requests(2), description="t")
        failing = Journal.insert_images

        def disk_full(self: Journal, *args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Journal, "insert_images", disk_full)
            with pytest.raises(AmbiguousWriteError):
                await client.append_to_task(created.task_id, requests(2, start=2))
        assert Journal.insert_images is failing
        again = await client.append_to_task(created.task_id, requests(2, start=2))
        assert again.validation.accept == 2 and again.failure_list == []
        with anyio.fail_after(10):
            while (task := await client.task_status(created.task_id)).task_status != (
                TaskStatus.DONE
            ):
                await anyio.sleep(0.02)
        assert task.count.total == 4 and task.count.done == 4


async def test_a_worker_that_stops_makes_the_service_answer_503(
    client_for: Callable[..., TaggerClient], caplog: pytest.LogCaptureFixture
) -> None:
    """The tagging worker dies on an error: the service says so (503, logged) instead of
    accepting images that would stay TASK_PROCESSING forever."""
    from fashiontag_pipeline import ServerError
    from fashiontag_pipeline.service.store import TaskStore

    config = ServiceConfig(rate=50.0, **CONFIG)  # type: ignore[arg-type]
    async with running_service(config) as svc:
        client = client_for(svc.url)

        def broken(self: TaskStore, *args: object, **kwargs: object) -> None:
            raise RuntimeError("disk on fire")

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(TaskStore, "complete_range", broken)
            await client.create_task(requests(3), description="t")
            with anyio.fail_after(10):
                while svc.state.broken is None:
                    await anyio.sleep(0.02)
        with pytest.raises(ServerError) as err:
            await client.list_tasks()
        assert err.value.status == 503 and "disk on fire" in str(err.value)
        with pytest.raises(AmbiguousWriteError):  # a write answered 5xx: outcome unknown
            await client.create_task(requests(1), description="u")
        assert not [t for t in svc.store.tasks.values() if t.description == "u"]
    assert "tagging worker stopped" in caplog.text


async def test_a_task_whose_results_expired_keeps_its_counts_across_a_restart(
    tmp_path: Path, client_for: Callable[..., TaggerClient], clock: Any
) -> None:
    config = ServiceConfig(
        state_path=tmp_path / "state.sqlite",
        clock=clock,
        result_ttl=60.0,
        **CONFIG,  # type: ignore[arg-type]
    )
    async with running_service(config) as svc:
        client = client_for(svc.url)
        created = await client.create_task(requests(3))
        clock.advance(61)
        svc.store.sweep()  # the images are freed; the task's header stays
        status_before = await client.task_status(created.task_id)
    assert status_before.count.total == 3
    async with running_service(config) as svc:
        client = client_for(svc.url)
        assert await client.task_status(created.task_id) == status_before


async def test_images_served_as_generic_binary_are_tagged(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    """An image stored in S3 without a content type is served as ``binary/octet-stream`` (S3's
    default); others send ``application/binary`` or ``application/x-octet-stream``. Each is an
    image and is tagged, single mode and bulk, where a text page is still 803."""
    red = product_png((200, 20, 30))
    generic = ("binary/octet-stream", "application/binary", "application/x-octet-stream")

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=red, headers={"Content-Type": request.match_info["ctype"]})

    app = web.Application()
    app.router.add_get("/{ctype:.+}/red.png", image)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    images = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        client = client_for((await start_service(fetch=True)).url)
        everything = Context(detection=list(Detection))
        for ctype in generic:
            single = await client.tag(
                Image(type=ImageType.URL, content=f"{images}/{ctype}/red.png"), everything
            )
            assert single.ok and single.data is not None, (ctype, single.error)
        created = await client.create_task(
            [
                TaggingRequest(
                    image=Image(type=ImageType.URL, content=f"{images}/{ctype}/red.png"),
                    context=BulkContext(id=ctype, detection=list(Detection)),
                )
                for ctype in (*generic, "text/plain")
            ]
        )
        with anyio.fail_after(10):
            while not (task := await client.task_status(created.task_id)).done:
                await anyio.sleep(0.02)
        results = {
            r.id: r.tagging_result for r in (await client.task_results(task.task_id)).results
        }
        assert [k for k, v in results.items() if v.ok] == list(generic), results
        text = results["text/plain"].error
        assert text is not None and text.code == 803
        assert (task.count.done, task.count.failure) == (3, 1)
    finally:
        await runner.cleanup()
