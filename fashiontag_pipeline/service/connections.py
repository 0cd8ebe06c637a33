"""Connection limits of the reference service, and aiohttp's parse-error logs without keys.

aiohttp's defaults hold any number of connections, idle for an hour (keep-alive 3,630 s) and
with no limit on how long request headers take to arrive. The service instead:

* keeps at most ``max_connections`` open: a new connection past the limit closes the oldest
  idle one (no request being handled), or itself when none is idle;
* closes a connection whose request headers have not all arrived ``header_timeout`` seconds
  after its first byte (header drip), and an idle one after ``keepalive_timeout`` (aiohttp's
  own keep-alive timer, which also covers a connection that never sends a byte).

:class:`GuardedSite` is the TCP site that applies this; :func:`http_logger` is the logger
given to aiohttp's request handlers, whose filter rewords a malformed request's record to its
error class (aiohttp logs the offending header line, which can be an ``x-api-key`` line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from aiohttp import web

__all__ = ["ConnectionGuard", "GuardedSite", "http_logger"]

_HTTP_LOGGER = "fashiontag_pipeline.service.http"


class _RedactParseErrors(logging.Filter):
    """Replace aiohttp's "Error handling request" records: no message text, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            record.msg = "malformed HTTP request refused: %s"
            record.args = (type(exc).__name__,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def http_logger() -> logging.Logger:
    """The logger for aiohttp's request handlers (parse errors reworded, see the module)."""
    log = logging.getLogger(_HTTP_LOGGER)
    if not any(isinstance(f, _RedactParseErrors) for f in log.filters):
        log.addFilter(_RedactParseErrors())
    return log


class _Connection:
    __slots__ = ("busy", "header_timer", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.busy = 0
        self.header_timer: asyncio.TimerHandle | None = None


class ConnectionGuard:
    """Counts connections, evicts idle ones at the limit, times out slow headers."""

    def __init__(self, *, max_connections: int, header_timeout: float) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def protocol(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        return _GuardedProtocol(self, inner)

    def admit(self, transport: asyncio.Transport) -> bool:
        """Register a new connection; False when it must be closed (limit, nothing idle)."""
        if len(self._open) >= self.max_connections:
            idle = next((c for c in self._open.values() if not c.busy), None)
            if idle is None:
                self.refused += 1
                return False
            self.evicted += 1
            self._forget(idle.transport)
            idle.transport.close()
        self._open[transport] = _Connection(transport)
        return True

    def _forget(self, transport: asyncio.BaseTransport) -> None:
        conn = self._open.pop(transport, None)
        if conn is not None and conn.header_timer is not None:
            conn.header_timer.cancel()

    def data_arrived(self, transport: asyncio.BaseTransport) -> None:
        conn = self._open.get(transport)
        if conn is None or conn.busy or conn.header_timer is not None:
            return
        loop = asyncio.get_running_loop()
        conn.header_timer = loop.call_later(self.header_timeout, self._headers_late, conn)

    def _headers_late(self, conn: _Connection) -> None:
        conn.header_timer = None
        if not conn.busy and conn.transport in self._open:
            self.timed_out += 1
            self._forget(conn.transport)
            conn.transport.close()

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self._open.get(transport) if transport is not None else None
        if conn is not None:
            conn.busy += 1
            if conn.header_timer is not None:
                conn.header_timer.cancel()
                conn.header_timer = None

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self._open.get(transport) if transport is not None else None
        if conn is not None and conn.busy:
            conn.busy -= 1

    def closed(self, transport: asyncio.BaseTransport) -> None:
        self._forget(transport)


class _GuardedProtocol(asyncio.Protocol):
    """Sits between the transport and aiohttp's request handler, telling the guard."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        stream = cast(asyncio.Transport, transport)
        if not self._guard.admit(stream):
            stream.abort()
            return
        self._transport = stream
        self._inner.connection_made(stream)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return
        self._guard.closed(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._guard.data_arrived(self._transport)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._transport is None:
            return None
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass through a :class:`ConnectionGuard`."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner, backlog=min(1024, guard.max_connections))
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        factory: Callable[[], asyncio.Protocol] = lambda: self._guard.protocol(server())  # noqa: E731
        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, self._port, reuse_address=True, backlog=self._backlog
        )
