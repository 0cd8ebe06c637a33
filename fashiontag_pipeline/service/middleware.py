"""Middlewares, outermost first: request log + error mapping (every failure becomes the JSON
error shape of its path), then fault injection (``--faults``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiohttp import web

from .context import STATE
from .errors import CODE_BAD_ROUTE, CODE_INTERNAL, CODE_QUOTA, Dropped, Reject, error_response
from .faults import Fault, FaultDice

__all__ = ["drop_connection", "fault_middleware", "log_and_map_errors"]

logger = logging.getLogger("fashiontag_pipeline.service")


@web.middleware
async def log_and_map_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    started = time.perf_counter()
    status = 0
    state = request.app[STATE]
    connections = state.connections
    connections.request_started(request.transport)
    try:
        if state.broken is not None:
            raise Reject(503, CODE_INTERNAL, f"the service cannot tag: {state.broken}")
        response = await handler(request)
        status = response.status
        return response
    except Reject as reject:
        status = reject.status
        return error_response(request.path, reject)
    except web.HTTPRequestEntityTooLarge:
        status = 413
        return error_response(request.path, Reject(413, 809, "request body is too large"))
    except web.HTTPException as http_exc:
        status = http_exc.status
        if http_exc.status in (404, 405):
            # A 405 names the methods the path takes (RFC 9110: Allow is required).
            allow = http_exc.headers.get("Allow") if http_exc.status == 405 else None
            return error_response(
                request.path,
                Reject(
                    http_exc.status,
                    CODE_BAD_ROUTE,
                    f"invalid URI or method: {request.method} {request.path}",
                    headers={"Allow": allow} if allow is not None else None,
                ),
            )
        raise
    except Dropped:
        # The transport is already aborted: aiohttp drops this response quietly.
        status = -1
        return web.Response(status=500)
    except asyncio.CancelledError:
        status = -1
        raise
    except Exception:
        status = 500
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(request.path, Reject(500, CODE_INTERNAL, "internal error"))
    finally:
        connections.request_finished(request.transport)
        if logger.isEnabledFor(logging.DEBUG):
            # Never headers: they hold the API key.
            logger.debug(
                "%s %s -> %s in %.1f ms",
                request.method,
                request.path,
                status if status >= 0 else "dropped",
                (time.perf_counter() - started) * 1000,
            )


def drop_connection(request: web.Request) -> web.Response:
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise Dropped


def fault_middleware(dice: FaultDice) -> Any:
    spec = dice.spec

    @web.middleware
    async def inject_faults(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not request.path.startswith("/tagger/"):
            return await handler(request)
        delay = dice.latency()
        if delay:
            await anyio.sleep(delay)
        fault, code = dice.roll(is_write=request.method in ("POST", "PUT"))
        if fault is Fault.NONE:
            return await handler(request)
        if fault is Fault.ERROR:
            raise Reject(code, CODE_INTERNAL, f"injected fault: HTTP {code}")
        if fault is Fault.RATE_LIMITED:
            raise Reject(
                429,
                CODE_QUOTA,
                "rate limited, retry later",
                headers={"Retry-After": f"{spec.retry_after:g}"},
            )
        if fault is Fault.DROP:
            drop_connection(request)
        # Ambiguous: the write is applied in full, then the answer is lost.
        await handler(request)
        return drop_connection(request)

    return inject_faults
