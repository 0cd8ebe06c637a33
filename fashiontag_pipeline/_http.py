"""The HTTP exchange under :class:`~fashiontag_pipeline.TaggerClient`: one aiohttp session,
the retry rules, and the one place where answers and aiohttp errors become the exception tree
of :mod:`fashiontag_pipeline._exceptions` (:meth:`HttpExchange.call`, :meth:`HttpExchange.send`,
:func:`error_for`).

Retry rules: reads are retried under the :class:`~fashiontag_pipeline.RetryPolicy` on 429 and
5xx (honouring a Retry-After), timeouts and transport errors; writes only when they were
certainly not applied (429, a connection that could not be made), and a write whose outcome is
unknown (sent, then a timeout, a dropped connection, a 5xx or a 408) raises
:class:`AmbiguousWriteError` (with the answer's Retry-After, which the engine waits). Other 4xx
answers are never retried.

Connections: reads and writes have a pool each (:mod:`._connect`): a write goes only on a
connection idle for at most ``WRITE_IDLE_MAX`` seconds, so a gateway that closes idle
connections cannot make it of unknown fate. The proxy of ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
``NO_PROXY`` is decided once (:mod:`._proxies`); its credentials go in the CONNECT of an
``https://`` service, and with each request of an ``http://`` one (to the proxy, which
answers a 407 itself: :meth:`HttpExchange.raise_for_status`).

Cost: a request is the hot path of a run (one per 100 results read), so it does no work that
does not depend on the request: URLs are built from a base URL split once (no parse a request:
:mod:`._request_urls`) and handed to aiohttp pre-encoded, and a request has one deadline
(:attr:`Timeout.total`, else ``connect + read``) rather than a per-read socket timer re-armed
for every chunk received.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TypeVar

import anyio
import msgspec
from yarl import URL

from . import _exceptions as exc
from . import _retrying, _tunnels
from ._callctx import GIVE_UP, WRITE_AGAIN, WRITE_GUARD, WRITES_STOPPED
from ._clock import ServerClock
from ._config import Limits, RetryPolicy, Secret, Timeout, shown_url
from ._connect import NOT_MADE, connect_failure, deadline, drop_sessions, session_pair, unanswered
from ._connect import tls_instead as tls_speaker
from ._models import says_success
from ._proxies import ProxyRoute, proxy_for, proxy_wants_credentials
from ._request_urls import RequestUrls
from ._responses import Response, error_for, failure_in_success, not_the_shape, refused_in_success
from ._retrying import FIRST_FAILURE, ClientStats, FailureNotes, failed_what, pause, retry_wait
from ._retrying import wait_past_give_up as wait_out
from ._scrub import credential_forms, mask_location, mask_secrets, scrub_request_info
from ._surrogates import decode_mended
from ._times import answer_age, retry_after
from ._tls import deferred_trust_store

# aiohttp's default SSL contexts load the CA bundle when they are first used, not at import.
with deferred_trust_store():
    import aiohttp

__all__ = ["BULK_PATH", "FIRST_FAILURE", "SINGLE_PATH", "ClientStats", "HttpExchange", "Response"]


logger = logging.getLogger("fashiontag_pipeline.client")

#: A UTF-8 byte order mark: some servers put one before their JSON.
_BOM = b"\xef\xbb\xbf"

SINGLE_PATH = "/tagger/v2/tags"
BULK_PATH = "/tagger/v2.12/bulk"
USER_AGENT = "fashiontag_pipeline/0.1"
T = TypeVar("T")


class HttpExchange:
    """One aiohttp session to the service, with retries and error mapping.

    ``key_hint(path)`` says, for a 401/403 on ``path``, which key was sent and where it came
    from (never the key)."""

    def __init__(
        self,
        base_url: str,
        *,
        language: str,
        timeout: Timeout,
        retry: RetryPolicy,
        limits: Limits,
        key_hint: Callable[[str], str],
        sleep: Callable[[float], Awaitable[None]] | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self.base_url = base_url
        #: As messages show it (a password in it masked).
        self.shown_url = shown_url(base_url)
        self.language = language
        self.timeout = timeout
        self.retry = retry
        self.limits = limits
        self.stats = ClientStats()
        #: The service's clock offset, from responses' ``Date`` (write deadlines use it).
        self.server_clock = ServerClock()
        self._key_hint = key_hint
        self._secrets = tuple(secrets)  # (the keys sent: masked in answers, with basic auth's)
        self._secret_forms = credential_forms(self._secrets, base_url)
        self._sleep = sleep or anyio.sleep
        self._random = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._write_session: aiohttp.ClientSession | None = None  # (writes: WRITE_IDLE_MAX)
        self._loop: asyncio.AbstractEventLoop | None = None  # (the pools' own)
        #: The proxy the environment names for the service (decided with the first session).
        self.proxy: ProxyRoute | None = None
        self._proxy_url: str | None = None
        self._proxy_headers: dict[str, str] | None = None
        self._closed = False
        self._tls_probes: dict[tuple[str, int], bool] = {}  # (http:// addresses speaking TLS)
        self._tunnel: ProxyRoute | None = None  # (the proxy of an https:// service: CONNECTs)
        self._longest = deadline(timeout) or math.inf  # (an answer seen later: a freeze)
        self._notes = FailureNotes(self.shown_url, retry.max_attempts - 1)
        # The base URL in its encoded form: request URLs are this text plus an encoded path.
        self._base_encoded = str(URL(self.base_url))
        self._urls = RequestUrls(self._base_encoded)  # (built from parts, not parsed)
        #: Called after every exchange with (method, path, HTTP status or 0 when no answer
        #: came, seconds): the daemon's request metrics. None: nobody listens.
        self.observer: Callable[[str, str, int, float], None] | None = None

    async def aclose(self) -> None:
        """Close the connection pools. Idempotent."""
        self._closed = True
        sessions = (self._session, self._write_session)
        self._session = self._write_session = None
        with anyio.CancelScope(shield=True):
            for session in sessions:
                if session is not None:
                    await session.close()

    def ensure_session(self) -> aiohttp.ClientSession:
        """The pool of reads (the pool of writes is made with it)."""
        if self._closed:
            raise RuntimeError("TaggerClient is closed")
        if self._session is not None and self._loop is not asyncio.get_running_loop():
            self._leave_loop()
        if self._session is None:
            self._loop = asyncio.get_running_loop()
            base = URL(self._base_encoded, encoded=True)
            self.proxy = proxy_for(base.scheme, base.host or "", base.explicit_port)
            if self.proxy is not None:
                self._proxy_url = self.proxy.url
                self._proxy_headers = self.proxy.headers or None
                self._secret_forms = credential_forms(self._secrets, self.base_url, self.proxy)
            self._tunnel = self.proxy if self._base_encoded.startswith("https:") else None
            pair = session_pair(self.limits, self.timeout, USER_AGENT, self._tunnel is not None)
            self._session, self._write_session = pair
        return self._session

    def _leave_loop(self) -> None:
        """Pools of a loop that is gone (``asyncio.run`` each night on one client failed the
        second with "Event loop is closed": aiohttp binds a session to its loop) are closed."""
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("TaggerClient is in use in another event loop: one per loop")
        drop_sessions(self._session, self._write_session)
        self._session = self._write_session = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        key: Secret | None,
        body: bytes | None = None,
        query: str = "",
        language: str | None = None,
        retry_all: bool,
        task_id: str | None = None,
    ) -> Response:
        """Send with retries; returns the final response (error statuses included only when
        they are not retryable), or raises the mapped error, which carries when the call
        began (``started_at``: a caller's give-up budget counts from there, see
        :data:`GIVE_UP`)."""
        # failing[0]: when this call's failing began (see _call); the call's start until then.
        failing = [time.monotonic()]
        try:
            return await self._call(
                method, path, key, body, query, language, retry_all, task_id, failing
            )
        except exc.FashiontagError as err:
            err.started_at = failing[0]
            raise

    async def _call(
        self,
        method: str,
        path: str,
        key: Secret | None,
        body: bytes | None,
        query: str,
        language: str | None,
        retry_all: bool,
        task_id: str | None,
        failing: list[float],
    ) -> Response:
        """``failing[0]``: when the call's failing began, for the give-up budget (GIVE_UP).
        A failed attempt that got no answer (a timeout, a dropped connection) was failing
        from its start: that is kept (the call's start for its first attempt). An attempt
        answered with an error was failing from its answer: a service slow to answer is no
        failure until it answers one, so a slow request answered 503 once must not count
        its whole wait as seconds of failure (the run stopped at its first error). A write
        is not sent again once the caller stops writing (WRITES_STOPPED)."""
        given_up = GIVE_UP.get()
        stopped = WRITES_STOPPED.get() if method != "GET" else None
        attempt = 0
        failed = False
        while True:
            attempt += 1
            last_attempt = attempt >= self.retry.max_attempts or (
                attempt > 1 and given_up is not None and given_up(failing[0]) < 0
            )
            if attempt > 1 and method != "GET" and (again := WRITE_AGAIN.get()) is not None:
                await again()  # (a write sent again: its caller records when)
            sent_at = time.monotonic()
            try:
                response = await self.send(method, path, key, body, query, language, retry_all)
            except exc.TransportError as err:
                failed = True  # no answer: failing since the attempt began (failing[0] kept)
                if err.stalled:  # ... unless this process was frozen meanwhile: since now
                    failing[0] = time.monotonic()
                if isinstance(err, exc.AmbiguousWriteError):
                    raise
                retryable = retry_all or isinstance(err, exc.ConnectError)
                # (An attempt that hung to its deadline past the give-up point: no retry starts.)
                spent = given_up is not None and given_up(failing[0]) < 0
                if not retryable or last_attempt or spent:
                    self._notes.failure(str(err), None, attempt)
                    raise
                delay = self.retry.backoff(attempt, self._random.random())
                self._notes.failure(str(err), delay, attempt)
                if await pause(self._sleep, delay, stopped):
                    raise
                self.stats.retries += 1
                continue

            status = response.status
            if not failed and (status == 429 or status >= 500 or status == 408):
                failed = True  # an answer: failing since it came
                failing[0] = time.monotonic()
            if status == 429:
                self.stats.rate_limited += 1
            elif status >= 500 or status == 408:  # 408: a front end gave up waiting (transient)
                self.stats.server_errors += 1
                if not retry_all:
                    self.stats.ambiguous_writes += 1
                    raise exc.AmbiguousWriteError(
                        f"{method} {path}: service answered HTTP {status}; the write may or may "
                        "not have been applied",
                        method=method,
                        path=path,
                        status=status,
                        retry_after=retry_after(response.headers),
                        unanswered_for=min(time.monotonic() - sent_at, self._longest),
                    )
            else:
                self._notes.answered()
                return response
            # A 429, or a read answered 5xx/408: retried after the service's Retry-After (RFC
            # 9110 gives one to a 503 too), else a backoff; never past the give-up point.
            wait = retry_after(response.headers)
            what = failed_what(method, path, status, wait)
            left = given_up(failing[0]) if given_up is not None else math.inf
            if last_attempt or left < 0:
                if status != 429:
                    self._notes.failure(what, None, attempt)
                self.raise_for_status(response, method, path, task_id)
            if wait is not None and wait > left and given_up is not None:
                # Asked to wait past the give-up point: given up there, unless it moved on.
                self._notes.failure(what, None, attempt, give_up_in=left)
                cap, left_now = min(wait, self.retry.max_retry_after), partial(given_up, failing[0])
                if not await wait_out(self._sleep, stopped, cap, left_now):
                    self.raise_for_status(response, method, path, task_id)
                self.stats.retries += 1
                continue
            backoff = self.retry.backoff(attempt, self._random.random())
            delay = retry_wait(wait, backoff, self.retry.max_retry_after)
            self._notes.failure(what, delay, attempt)
            if await pause(self._sleep, delay, stopped):  # (a stop: no retry, none counted)
                self.raise_for_status(response, method, path, task_id)
            self.stats.retries += 1
            continue

    async def send(
        self,
        method: str,
        path: str,
        key: Secret | None,
        body: bytes | None,
        query: str,
        language: str | None,
        is_read: bool,
    ) -> Response:
        """One HTTP exchange. The only place aiohttp errors are seen and converted.

        ``path`` is already percent-encoded (``TaggerClient._task_path``) and ``query`` is ``""`` or
        an encoded ``?k=v&...``: the URL goes to aiohttp as encoded text."""
        if method != "GET" and (guard := WRITE_GUARD.get()) is not None:
            guard()
        session = self.ensure_session()
        if method != "GET":
            assert self._write_session is not None
            session = self._write_session
        headers = {"accept-language": language or self.language}
        if key is not None:
            headers["x-api-key"] = key.reveal()
        if self._proxy_headers is not None and not self._base_encoded.startswith("https:"):
            headers.update(self._proxy_headers)  # (aiohttp sends proxy_headers in CONNECTs only)
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.stats.requests += 1
        started = time.perf_counter()
        sent_at = time.time()
        sent = False
        connected = [False]  # (a connection had: its tunnel made; see connection_marks)
        try:
            url = self._urls.url(path, query)
            # Redirects are not followed: aiohttp carries every header but Authorization and
            # cookies to another origin, so the x-api-key would go to whatever host an answer
            # names (in clear text if it says http://), and a 301/302 to a POST becomes a GET.
            # A 3xx is mapped like any other refusal (its message names the new address).
            async with session.request(
                method,
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                proxy=self._proxy_url,
                proxy_headers=self._proxy_headers,
                trace_request_ctx=connected,
            ) as resp:
                sent = True
                payload = await resp.read()
                if payload.startswith(_BOM):  # a byte order mark, which JSON readers may skip
                    payload = payload[3:]
                # An error answer or a front end's page may echo the key sent; a 2xx JSON
                # answer (spaces before it too) is data: a page, a write's ids (_write_answer).
                heads = resp.headers
                if resp.status >= 300 or (payload[:1] != b"{" and payload.lstrip()[:1] != b"{"):
                    payload = mask_secrets(payload, self._secret_forms)
                    heads = mask_location(heads, self._secret_forms)  # (a 3xx's, named)
                result = Response(resp.status, payload, heads)
                date = resp.headers.get("Date")
                self.server_clock.observe(date, sent_at, time.time(), answer_age(resp.headers))
        except NOT_MADE as err:  # (a connection not made: nothing was sent)
            scrub_request_info(err, self._secret_forms)  # (a proxy's refusal: the CONNECT's)
            self.stats.transport_errors += 1
            where = (self.shown_url, self.proxy, self.timeout.connect)
            raise connect_failure(err, method, path, *where) from err
        except (TimeoutError, aiohttp.ClientError) as err:
            scrub_request_info(err, self._secret_forms)
            self.stats.transport_errors += 1
            if self._tunnel is not None and not connected[0]:  # (no tunnel: nothing sent)
                where = (self.shown_url, self._tunnel, deadline(self.timeout))
                raise _tunnels.tunnel_not_made(err, method, path, *where) from err
            if not sent and self._proxy_url is None:
                args = (method, path, self.base_url, self.shown_url, self._tls_probes)
                if (tls := await tls_speaker(err, *args)) is not None:
                    raise tls from err
            if not is_read:
                self.stats.ambiguous_writes += 1
            raise unanswered(
                err,
                method,
                path,
                write=not is_read,
                waited=time.perf_counter() - started,
                limit=deadline(self.timeout),
                status=resp.status if sent else None,
                via=self.proxy if self._tunnel is None else None,
            ) from err
        finally:
            if (observer := self.observer) is not None:
                observer(method, path, resp.status if sent else 0, time.perf_counter() - started)
            _retrying.log_exchange(method, path, query, sent, started)
        return result

    def decode(
        self, decoder: msgspec.json.Decoder[T], response: Response, method: str, path: str
    ) -> T:
        if response.status >= 300:
            # Error statuses are mapped before their body is taken as a success shape.
            self.raise_for_status(response, method, path, None)
        try:
            return decode_mended(decoder, response.body)
        # (nested past msgspec's depth; bytes that are not UTF-8: msgspec says so with a
        # UnicodeDecodeError, no DecodeError)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
            raise not_the_shape(response, method, path, err) from err

    def check_bulk_status(
        self,
        status: str,
        error: str | None,
        response: Response,
        method: str,
        path: str,
        task_id: str | None,
        code: int | None = None,
    ) -> None:
        if not says_success(status):
            error = self.masked(error) if error else error  # (both may echo the key sent)
            status = self.masked(status)
            if code is not None:  # (see _responses.REFUSING_CODES)
                raise refused_in_success(response, code, error or "", path, self._key_hint(path))
            raise failure_in_success(response, status, error, method, path, task_id)

    def masked_body(self, body: bytes) -> bytes:
        """``body`` (an answer) with the keys sent masked (:func:`mask_secrets`)."""
        return mask_secrets(body, self._secret_forms)

    def masked(self, text: str) -> str:
        """``text`` (words of an answer) with the keys sent masked (:func:`mask_secrets`)."""
        raw = mask_secrets(text.encode("utf-8", "surrogatepass"), self._secret_forms)
        return raw.decode("utf-8", "surrogatepass")

    def raise_for_status(
        self, response: Response, method: str, path: str, task_id: str | None
    ) -> None:
        """Map an error response to the exception tree. Never returns. The keys sent are masked
        in its words as read too: a JSON encoder may have escaped them (``\\u002B``)."""
        if response.status == 407 and self.proxy is not None:
            raise proxy_wants_credentials(method, path, self.proxy)
        endpoint = self.shown_url + path if path in (BULK_PATH, SINGLE_PATH) else None
        err = error_for(response, method, path, task_id, self._key_hint(path), endpoint=endpoint)
        scrub_request_info(err, self._secret_forms)
        raise err
