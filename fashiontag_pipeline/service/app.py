"""The reference tagging service on aiohttp.web: every endpoint of spec section 4.

Routes::

    POST /tagger/v2/tags                      single-mode tagging            200
    POST /tagger/v2.12/bulk                   create a task                  202
    GET  /tagger/v2.12/bulk                   list the key's tasks           200
    PUT  /tagger/v2.12/bulk/{task}            append to a task               202
    GET  /tagger/v2.12/bulk/{task}/status     one task's status              200
    GET  /tagger/v2.12/bulk/{task}            one page of results            200
    GET  /openapi.json                        this interface, described

Status codes and error bodies follow DESIGN section 3. Where things are: routes in
:mod:`.routes_single` and :mod:`.routes_bulk` (bulk body checks in :mod:`.bulk_validation`),
error codes and bodies in :mod:`.errors`, middlewares in :mod:`.middleware`, request parsing in
:mod:`.parsing`, the shared state in :mod:`.context`, options in :mod:`.config`. This module
assembles them.

Start it with :func:`running_service` (async context manager), :func:`run_service` (for
``tg.start``), or ``fashiontag serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from aiohttp import web

from .config import DEFAULT_MAX_BODY_BYTES, ServiceConfig
from .connections import GuardedSite, http_logger
from .context import STATE, ServiceState
from .errors import BULK_PATH, SINGLE_PATH
from .middleware import fault_middleware, log_and_map_errors
from .routes_bulk import handle_append, handle_create, handle_list, handle_results, handle_status
from .routes_single import handle_openapi, handle_tag
from .store import TaskStore

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "RunningService",
    "ServiceConfig",
    "create_app",
    "run_service",
    "running_service",
]

logger = logging.getLogger("fashiontag_pipeline.service")

# --------------------------------------------------------------------------- app and runners


async def _background(app: web.Application) -> AsyncIterator[None]:
    """Runs the tagging worker for the app's lifetime (aiohttp's cleanup_ctx idiom: the app
    may be run by aiohttp's own runners, where no anyio task group of ours exists). A worker
    that stops on an error is logged at once and the service answers 503 from then on: it
    must not go on accepting images that nothing will tag."""
    state = app[STATE]
    worker = asyncio.get_running_loop().create_task(state.worker.run())

    def stopped(task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        err = task.exception()
        leaf = err
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        state.broken = f"its tagging worker stopped: {type(leaf).__name__}: {leaf}"
        logger.error("tagging worker stopped; answering 503 from now on", exc_info=err)

    worker.add_done_callback(stopped)
    try:
        yield
    finally:
        worker.cancel()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        except Exception:  # already logged by stopped()
            pass
        try:
            await state.analyzer.aclose()
        finally:
            state.store.close()


def create_app(config: ServiceConfig) -> web.Application:
    """The aiohttp application of the reference service."""
    state = ServiceState(config)
    middlewares: list[Any] = [log_and_map_errors]
    if state.dice is not None:
        middlewares.append(fault_middleware(state.dice))
    app = web.Application(middlewares=middlewares, client_max_size=config.max_body_bytes)
    app[STATE] = state
    app.router.add_post(SINGLE_PATH, handle_tag)
    app.router.add_post(BULK_PATH, handle_create)
    app.router.add_get(BULK_PATH, handle_list)
    app.router.add_put(BULK_PATH + "/{task_id}", handle_append)
    app.router.add_get(BULK_PATH + "/{task_id}/status", handle_status)
    app.router.add_get(BULK_PATH + "/{task_id}", handle_results)
    app.router.add_get("/openapi.json", handle_openapi)
    app.cleanup_ctx.append(_background)
    return app


@dataclass(frozen=True)
class RunningService:
    """A started service: its base URL, the app, and the store (for tests)."""

    url: str
    app: web.Application
    host: str
    port: int

    @property
    def store(self) -> TaskStore:
        return self.app[STATE].store

    @property
    def state(self) -> ServiceState:
        return self.app[STATE]


@contextlib.asynccontextmanager
async def running_service(
    config: ServiceConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningService]:
    """Run the service on ``host:port`` (0 = a free port) for the ``async with`` body."""
    app = create_app(config)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        keepalive_timeout=config.keepalive_timeout,
        logger=http_logger(),
    )
    await runner.setup()
    try:
        site = GuardedSite(runner, host, port, app[STATE].connections)
        await site.start()
        actual = port
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                actual = int(address[1])
                break
        url_host = f"[{host}]" if ":" in host else host
        yield RunningService(url=f"http://{url_host}:{actual}", app=app, host=host, port=actual)
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def run_service(
    config: ServiceConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; reports the base URL through ``task_status`` (``tg.start``)."""
    async with running_service(config, host, port) as service:
        task_status.started(service.url)
        await anyio.sleep_forever()
