"""What stands between a data team's engine and a real tagging service, for the deployment tests:
an API gateway that mounts the service under a path prefix (plain or TLS, on IPv4 or IPv6), a
forward proxy (``HTTPS_PROXY``: CONNECT, and absolute-form requests for ``http://``), a gateway
whose idle connections are closed just as the next request arrives on them, and a private CA
that signs the gateways' certificates (the openssl command, as on every machine the suite runs
on). Each is a real server on loopback that records what it was asked.
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio
import anyio.abc
import anyio.streams.buffered
from aiohttp import web

__all__ = [
    "ForwardProxy",
    "IdleClosingGateway",
    "Pki",
    "PrefixGateway",
    "make_pki",
]

#: An nginx error page, as gateways answer when the service behind them is down.
NGINX_PAGE = (
    "<html>\r\n<head><title>{status} {reason}</title></head>\r\n<body>\r\n"
    "<center><h1>{status} {reason}</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n"
    "</body>\r\n</html>\r\n"
)


@dataclass
class Pki:
    """A private CA and a server certificate it signed (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def make_pki(
    folder: Path, names: tuple[str, ...] = ("localhost",), *, addresses: bool = True
) -> Pki:
    """A CA and a certificate for ``names`` (DNS names), and the loopback addresses unless
    ``addresses`` is False."""
    if shutil.which("openssl") is None:  # pragma: no cover - every supported machine has it
        import pytest

        pytest.skip("needs the openssl command")
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    ips = ["IP:127.0.0.1", "IP:::1"] if addresses else []
    alt = ",".join([*(f"DNS:{n}" for n in names), *ips])
    ext.write_text(
        f"subjectAltName={alt}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
        *("-subj", "/CN=fashiontag test CA", "-keyout", str(ca_key), "-out", str(ca)),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    openssl(
        *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}"),
        *("-keyout", str(key), "-out", str(csr)),
    )
    openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
        *("-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert)),
    )
    return Pki(ca=ca, cert=cert, key=key)


async def _serve(
    app: web.Application, host: str, context: ssl.SSLContext | None
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=context)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    return runner, int(port)


@dataclass
class PrefixGateway:
    """An API gateway that mounts ``upstream`` under ``prefix`` (raw, as sent: ``/tenant%20a``);
    every other path is a 404 HTML page. ``failing`` answers every request with that status and
    an nginx page instead (the service behind it down); ``redirect_to`` answers every request
    with ``redirect_status`` to that origin, same path (a front end that moved)."""

    upstream: str
    prefix: str
    host: str = "127.0.0.1"
    tls: Pki | None = None
    failing: int | None = None
    redirect_to: str | None = None
    redirect_status: int = 301
    #: Every request, as ``METHOD raw-path-and-query``.
    seen: list[str] = field(default_factory=list)
    #: Every Authorization header received (the basic auth of a base URL's user:password).
    authorizations: list[str] = field(default_factory=list)
    url: str = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.raw_path}")
        if "Authorization" in request.headers:
            self.authorizations.append(request.headers["Authorization"])
        body = await request.read()
        if self.redirect_to is not None:
            return web.Response(
                status=self.redirect_status,
                headers={"Location": self.redirect_to + request.raw_path},
                text="<html><body>Moved</body></html>",
                content_type="text/html",
            )
        if self.failing is not None:
            reason = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Time-out"}
            page = NGINX_PAGE.format(status=self.failing, reason=reason.get(self.failing, ""))
            return web.Response(status=self.failing, text=page, content_type="text/html")
        raw = request.raw_path
        if not raw.startswith(self.prefix + "/"):
            page = NGINX_PAGE.format(status=404, reason="Not Found")
            return web.Response(status=404, text=page, content_type="text/html")
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("x-api-key", "content-type", "accept-language")
        }
        assert self._session is not None
        target = self.upstream + raw[len(self.prefix) :]
        async with self._session.request(
            request.method, target, data=body or None, headers=headers
        ) as upstream:
            payload = await upstream.read()
            return web.Response(
                status=upstream.status,
                body=payload,
                headers={"Content-Type": upstream.headers.get("Content-Type", "text/plain")},
            )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PrefixGateway]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession()
        context = self.tls.server_context() if self.tls is not None else None
        runner, port = await _serve(app, self.host, context)
        scheme = "https" if self.tls is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{scheme}://{host}:{port}"
        try:
            yield self
        finally:
            await self._session.close()
            await runner.cleanup()

    _session: aiohttp.ClientSession | None = None


class ForwardProxy:
    """An HTTP forward proxy on loopback: ``CONNECT host:port`` tunnels (an ``https://``
    service), absolute-form requests forwarded (an ``http://`` one). ``routes`` maps the
    ``host:port`` a client asks for to the loopback address that serves it (the proxy resolves
    names the client cannot). ``require_auth`` (``user:password``) answers 407 without it."""

    def __init__(self, routes: dict[str, tuple[str, int]], require_auth: str | None = None):
        self.routes = routes
        self.require_auth = require_auth
        #: Every request line received (``CONNECT tagger.test:443``, ``GET http://...``).
        self.seen: list[str] = []
        self.port = 0
        self.url = ""

    async def _pump(self, source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            async for chunk in source:
                await sink.send(chunk)
        with contextlib.suppress(Exception):
            await sink.send_eof()

    async def _client(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            buffered = anyio.streams.buffered.BufferedByteReceiveStream(client)
            try:
                head = await buffered.receive_until(b"\r\n\r\n", 65536)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
                return
            line, *header_lines = head.decode("latin-1").split("\r\n")
            self.seen.append(line)
            if len(line.split(" ", 2)) != 3:  # (no request line: not a client of a proxy)
                return
            # (A client gone before its answer, past its deadline on a loaded machine, ends
            # here: an answer sent to it would fail the test.)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._answer(client, buffered, line, header_lines)

    async def _answer(
        self,
        client: anyio.abc.SocketStream,
        buffered: anyio.streams.buffered.BufferedByteReceiveStream,
        line: str,
        header_lines: list[str],
    ) -> None:
        method, target, _ = line.split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)
        }
        if self.require_auth is not None:
            import base64

            expected = "Basic " + base64.b64encode(self.require_auth.encode()).decode()
            if headers.get("proxy-authorization") != expected:
                await client.send(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="p"\r\nContent-Length: 0\r\n\r\n'
                )
                return
        if method == "CONNECT":
            authority = target
        else:
            authority = target.split("://", 1)[1].split("/", 1)[0]
            if ":" not in authority:
                authority += ":80"
        route = self.routes.get(authority)
        if route is None:
            await client.send(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        try:
            upstream = await anyio.connect_tcp(*route)
        except OSError:
            await client.send(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        async with upstream:
            if method == "CONNECT":
                await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # one request per connection, in origin form (the upstream closes it)
                path = "/" + target.split("://", 1)[1].partition("/")[2]
                kept = [
                    h
                    for h in header_lines
                    if not h.lower().startswith(("proxy-", "connection:", "keep-alive:"))
                ]
                lines = [f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""]
                await upstream.send("\r\n".join(lines).encode("latin-1"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump, upstream, client)
                await self._pump(buffered, upstream)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ForwardProxy]:
        async with _tcp_serving(self._client) as port:
            self.port = port
            self.url = f"http://127.0.0.1:{port}"
            yield self


class IdleClosingGateway:
    """A TCP relay in front of ``upstream`` that closes a client connection when a request
    arrives on it after ``idle`` seconds of silence, without passing the request on: the race
    of a server whose idle timeout fires just as the client reuses the connection, made
    certain. Nothing so dropped reached the service."""

    def __init__(self, upstream: tuple[str, int], idle: float) -> None:
        self.upstream = upstream
        self.idle = idle
        #: Requests dropped (their first bytes arrived on a connection idle too long).
        self.dropped = 0
        #: Connections accepted.
        self.connections = 0
        self.url = ""

    async def _client(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        last = [time.monotonic()]
        async with client, await anyio.connect_tcp(*self.upstream) as upstream:

            async def down() -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    async for chunk in upstream:
                        await client.send(chunk)
                        last[0] = time.monotonic()
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(down)
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    async for chunk in client:
                        if time.monotonic() - last[0] >= self.idle:
                            self.dropped += 1
                            break
                        await upstream.send(chunk)
                        last[0] = time.monotonic()
                tg.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[IdleClosingGateway]:
        async with _tcp_serving(self._client) as port:
            self.url = f"http://127.0.0.1:{port}"
            yield self


@contextlib.asynccontextmanager
async def _tcp_serving(
    handler: Callable[[anyio.abc.SocketStream], Awaitable[None]],
) -> AsyncIterator[int]:
    """A TCP listener on a free loopback port, each connection served by ``handler``, until
    the block ends; yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        try:
            yield listener.extra(anyio.abc.SocketAttribute.local_port)
        finally:
            tg.cancel_scope.cancel()
