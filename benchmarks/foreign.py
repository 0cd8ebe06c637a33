"""A reverse proxy that makes the reference service look like a server we did not write.

Every JSON response body is re-encoded the way another implementation might write it: a space
after every colon and comma (or, with ``indent``, pretty-printed over CRLF-ended lines), every
object's keys in reverse order, and an unknown field
(``xForeignField``) added to the objects near the top (the envelope, ``data``, each task or
result, each ``taggingResult``). Status codes, ``Retry-After`` and non-JSON bodies pass through
unchanged. Requests are forwarded as they came (method, path, query, body, the headers the
service reads).

The engine must produce the same outcomes through it (DESIGN section 3: tolerate unknown fields,
depend on nothing a real service may do differently), at about the same CPU cost.

    python -m benchmarks.foreign --upstream http://127.0.0.1:8080 [--port 0]

prints ``listening on http://127.0.0.1:PORT`` once it accepts connections (the same line as
``fashiontag serve``, so the harness starts both alike). Tests use :func:`foreign_proxy`, which
runs it in the test's own event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["EXTRA_FIELD", "foreign_proxy", "reformat"]

#: The unknown field the proxy adds (a real service may add fields at any time).
EXTRA_FIELD = "xForeignField"
#: Objects up to this depth get the extra field: envelope 0, data 1, results[i] 2,
#: taggingResult 3.
_EXTRA_DEPTH = 3
_FORWARDED = ("x-api-key", "accept-language", "content-type")
_PASSED_BACK = ("content-type", "retry-after")


def _reshape(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        if depth <= _EXTRA_DEPTH:
            out[EXTRA_FIELD] = {"note": "a field this client does not know", "depth": depth}
        for key in reversed(list(value)):
            out[key] = _reshape(value[key], depth + 1)
        return out
    if isinstance(value, list):
        # A list does not count as a level: results[i] sits at the depth of its list's owner + 1.
        return [_reshape(v, depth) for v in value]
    return value


def reformat(body: bytes, indent: int | None = None) -> bytes:
    """``body`` re-encoded with other spacing, reversed key order and an extra field; bodies
    that are not JSON come back unchanged. ``indent``: pretty-printed over several lines (CRLF
    line ends), as some servers answer."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body
    # json's default separators are ", " and ": ": the spacing the reference service never uses.
    text = json.dumps(_reshape(decoded, 0), ensure_ascii=False, indent=indent)
    if indent is not None:
        text = text.replace("\n", "\r\n")
    return text.encode("utf-8")


def create_proxy_app(upstream: str, indent: int | None = None) -> web.Application:
    """The proxy as an aiohttp application forwarding to ``upstream`` (``http://host:port``);
    ``indent``: JSON bodies pretty-printed (see :func:`reformat`)."""
    upstream = upstream.rstrip("/")
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        app[session_key] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        yield
        await app[session_key].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}
        data = await request.read() if request.can_read_body else None
        async with request.app[session_key].request(
            request.method, upstream + request.path_qs, data=data, headers=headers
        ) as resp:
            body = await resp.read()
            back = {k: v for k in _PASSED_BACK if (v := resp.headers.get(k)) is not None}
            if "json" in back.get("content-type", ""):
                body = reformat(body, indent)
            return web.Response(status=resp.status, body=body, headers=back)

    app = web.Application(client_max_size=64 << 20)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@asynccontextmanager
async def foreign_proxy(
    upstream: str, host: str = "127.0.0.1", *, indent: int | None = None
) -> AsyncIterator[str]:
    """Run the proxy on ``host`` (a free port) for the ``async with`` body; yields its URL."""
    runner = web.AppRunner(
        create_proxy_app(upstream, indent), access_log=None, handle_signals=False
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def _serve(upstream: str, host: str, port: int, indent: int | None) -> None:
    runner = web.AppRunner(
        create_proxy_app(upstream, indent), access_log=None, handle_signals=False
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    actual = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    print(f"listening on http://{host}:{actual}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.foreign", description=__doc__)
    p.add_argument("--upstream", required=True, help="the service to forward to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    p.add_argument("--indent", type=int, default=None, help="pretty-print JSON bodies")
    args = p.parse_args(argv)
    try:
        import uvloop  # the proxy's own speed only changes wall times, never the engine's CPU
    except ImportError:
        asyncio.run(_serve(args.upstream, args.host, args.port, args.indent))
    else:
        uvloop.run(_serve(args.upstream, args.host, args.port, args.indent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
