"""The daemon's HTTP endpoints (``--listen``, default ``127.0.0.1:9464``).

* ``GET /metrics``: Prometheus text format, from the daemon's own registry.
* ``GET /livez``: 200 while the event loop turns (answering is the proof).
* ``GET /readyz``: 200 when the state store is writable and the service answers; 503 with
  ``{"ready": false, "reason": "..."}`` while draining, before the first answer of the
  service, or once it has been unreachable, or has answered every request of its API with 429
  or a 5xx, for ``unreachable_after`` (30 s) seconds.
* ``GET /status``: JSON of what :class:`StatusProvider` reports (active and queued manifests
  with progress, recent completions), and ``rate_limited_since`` while the service answers
  429 (see :meth:`Health.mark_service_answered`).

The facts behind ``/readyz`` live in :class:`Health`, which the daemon updates as they change
(a request answered, a state commit failed, SIGTERM received); the server only reads them.

The server faces whatever connects to it for weeks (scrapers that leak connections, a
slowloris): like the reference service it keeps at most :data:`MAX_CONNECTIONS` open (a new one
past the limit closes the oldest idle one), closes a connection whose request headers take
longer than :data:`HEADER_TIMEOUT` and an idle one after :data:`KEEPALIVE_TIMEOUT`. aiohttp's
defaults kept any number for an hour each, and the daemon's descriptors (manifests, outputs,
state, connections to the service) ran out: it exited on EMFILE.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol

import anyio
import msgspec
from aiohttp import web

from ..service.connections import ConnectionGuard, GuardedSite
from .config import parse_listen
from .metrics import CONTENT_TYPE, DaemonMetrics
from .outbox import ManifestSummary, rfc3339

__all__ = [
    "DEFAULT_UNREACHABLE_AFTER",
    "DaemonStatus",
    "Health",
    "ManifestProgress",
    "MonitoringServer",
    "StatusProvider",
]

DEFAULT_UNREACHABLE_AFTER = 30.0
#: Monitoring connections open at once (scrapers and probes need a handful).
MAX_CONNECTIONS = 64
#: Seconds from a request's first byte to its last header line.
HEADER_TIMEOUT = 5.0
#: Seconds an idle keep-alive connection is kept (scrapers reconnect).
KEEPALIVE_TIMEOUT = 15.0


class Health:
    """What ``/readyz`` decides from. Call the ``mark_*`` methods as facts change; every call
    is cheap (no I/O). ``clock`` is monotonic seconds, injectable for tests."""

    def __init__(
        self,
        *,
        unreachable_after: float = DEFAULT_UNREACHABLE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.unreachable_after = unreachable_after
        self._clock = clock
        self._draining = False
        self._store_error: str | None = None
        self._service_answered = False
        self._failing_since: float | None = None
        self._last_heard: float | None = None
        #: Since when every answer of the API has been a 429 or a 5xx, and the last such.
        self._refusing_since: float | None = None
        self._refused_with = 0
        #: Seconds without a 429 after which an answer ends a rate limit.
        self.limit_quiet = min(5.0, unreachable_after / 3)
        #: The rate limit going on: when its first 429 came (monotonic and wall clock), its
        #: last one, and how many there were.
        self.limited_since: float | None = None
        self.limited_since_wall = 0.0
        self._last_limited = 0.0
        self._answered_after_limit = False
        self.limited_answers = 0

    def mark_service_answered(self, status: int = 200, *, api: bool = True) -> None:
        """The service answered a request (any HTTP status: it is reachable). ``api``: a
        request of the tagging API (not the probe), whose status says whether the service
        serves us: a 429 starts (or goes on with) a rate limit, which ends once another
        answer has come and :attr:`limit_quiet` seconds have passed since the last 429 (see
        :meth:`settle_limit`); only 429s and 5xx for
        ``unreachable_after`` make the service not ready."""
        now = self._clock()
        self._service_answered = True
        self._failing_since = None
        self._last_heard = now
        if not api:
            return
        if status == 429 or status >= 500:
            if self._refusing_since is None:
                self._refusing_since = now
            self._refused_with = status
        else:
            self._refusing_since = None
        if status == 429:
            if self.limited_since is None:
                self.limited_since, self.limited_since_wall = now, time.time()
                self.limited_answers = 0
            self._last_limited = now
            self._answered_after_limit = False
            self.limited_answers += 1
        else:
            self._answered_after_limit = True
            self.settle_limit()

    def settle_limit(self) -> None:
        """Ends the rate limit once it is over (call it now and then: an idle daemon sends
        nothing that would end it)."""
        if (
            self.limited_since is not None
            and self._answered_after_limit
            and self._clock() - self._last_limited >= self.limit_quiet
        ):
            self.limited_since = None

    def mark_service_unreachable(self) -> None:
        """A request got no answer (connection refused, timeout). The first of a streak
        starts the clock; later ones keep it."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        self._last_heard = now

    def unreachable_for(self) -> float | None:
        """Seconds since the streak of requests that got no answer began (None: none)."""
        return None if self._failing_since is None else self._clock() - self._failing_since

    def quiet_for(self) -> float:
        """Seconds since a request to the service last ended (answered or not); ``inf``
        before the first. The daemon probes the service when this grows: an idle daemon
        sends nothing, and readiness must not rest on what it learned hours ago."""
        if self._last_heard is None:
            return float("inf")
        return self._clock() - self._last_heard

    def mark_store_writable(self) -> None:
        """A state commit succeeded."""
        self._store_error = None

    def mark_store_unwritable(self, reason: str) -> None:
        """A state commit failed (the daemon is about to exit)."""
        self._store_error = reason

    def mark_draining(self) -> None:
        """SIGTERM/SIGINT: the daemon stops taking work; never ready again."""
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def readiness(self) -> tuple[bool, str]:
        """``(ready, reason)``; the reason is empty when ready."""
        if self._draining:
            return False, "draining"
        if self._store_error is not None:
            return False, f"state store not writable: {self._store_error}"
        if self._failing_since is not None:
            down = self._clock() - self._failing_since
            if down >= self.unreachable_after:
                return False, f"service unreachable for {down:.0f} s"
        if not self._service_answered:
            return False, "service has not answered yet"
        if self._refusing_since is not None:
            down = self._clock() - self._refusing_since
            if down >= self.unreachable_after:
                if self._refused_with == 429:
                    return False, f"service rate limiting this key (HTTP 429) for {down:.0f} s"
                return False, f"service answering HTTP {self._refused_with} for {down:.0f} s"
        return True, ""


class ManifestProgress(msgspec.Struct, kw_only=True):
    """One active or queued manifest, as ``/status`` shows it (a queued file not claimed yet,
    waiting for a ``max_active`` slot, has no ``sha256`` nor ``claimed_at``: null). Its rows
    read are those with an outcome (``tagged``, ``failed``, ``rejected``, ``reused``: answered
    from the result store) and those ``pending``."""

    manifest: str
    sha256: str | None = None
    claimed_at: str | None = None
    rows_read: int = 0
    submitted: int = 0
    tagged: int = 0
    failed: int = 0
    rejected: int = 0
    reused: int = 0
    pending: int = 0


class DaemonStatus(msgspec.Struct, kw_only=True):
    """The body of ``GET /status``."""

    active: list[ManifestProgress] = msgspec.field(default_factory=list)
    queued: list[ManifestProgress] = msgspec.field(default_factory=list)
    recent: list[ManifestSummary] = msgspec.field(default_factory=list)
    draining: bool = False
    #: While the service answers 429: since when (RFC 3339, UTC), and its answers 429 since.
    rate_limited_since: str | None = None
    rate_limited_answers: int = 0


class StatusProvider(Protocol):
    """What ``/status`` asks the daemon for (called on the event loop: no blocking I/O)."""

    def status(self) -> DaemonStatus: ...


_encoder = msgspec.json.Encoder()


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(body), status=status, content_type="application/json")


class MonitoringServer:
    """The endpoints on ``listen`` (``HOST:PORT``; port 0 picks a free one; empty: nothing
    is started). An async context manager: ``async with MonitoringServer(...) as server:``,
    then :attr:`url` is where it listens (None when disabled)."""

    def __init__(
        self,
        listen: str,
        *,
        metrics: DaemonMetrics,
        health: Health,
        status: StatusProvider,
    ) -> None:
        self._address = parse_listen(listen)
        self.metrics = metrics
        self.health = health
        self.status_provider = status
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        self.connections = ConnectionGuard(
            max_connections=MAX_CONNECTIONS, header_timeout=HEADER_TIMEOUT
        )

    def make_app(self) -> web.Application:
        """The aiohttp application (also usable on its own in tests)."""
        guard = self.connections

        @web.middleware
        async def busy(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            # A connection with a request being answered is never the idle one evicted.
            guard.request_started(request.transport)
            try:
                return await handler(request)
            finally:
                guard.request_finished(request.transport)

        app = web.Application(middlewares=[busy])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def _livez(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.health.readiness()
        if ready:
            return _json({"ready": True})
        return _json({"ready": False, "reason": reason}, status=503)

    async def _status(self, request: web.Request) -> web.Response:
        status = self.status_provider.status()
        health = self.health
        status.draining = status.draining or health.draining
        limited = health.limited_since is not None
        status.rate_limited_since = rfc3339(health.limited_since_wall) if limited else None
        status.rate_limited_answers = health.limited_answers if limited else 0
        return _json(status)

    async def start(self) -> None:
        """Start listening (nothing when disabled)."""
        if self._address is None or self._runner is not None:
            return
        host, port = self._address
        runner = web.AppRunner(
            self.make_app(),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
        )
        await runner.setup()
        try:
            site = GuardedSite(runner, host, port, self.connections)
            await site.start()
        except OSError as err:  # (a second daemon on the machine, the default address)
            await runner.cleanup()
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if isinstance(err, socket.gaierror):  # (a typo, a name /etc/hosts lacks)
                why = f"{host} does not resolve ({err.strerror or err})"
            else:
                why = os.strerror(err.errno).lower() if err.errno else str(err)
            raise OSError(
                f"cannot listen on {where} (--listen, the monitoring endpoints): {why}: give"
                " another --listen HOST:PORT, or --listen '' for none"
            ) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}"

    async def aclose(self) -> None:
        """Stop listening (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    async def __aenter__(self) -> MonitoringServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
