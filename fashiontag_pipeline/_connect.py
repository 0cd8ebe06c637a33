"""Connecting to the service: the connection pools, and what a connection not made means.

:func:`new_session` makes one pool (:class:`~._http.HttpExchange` has one for reads and one for
writes, whose connections are reused only while idle for at most :data:`WRITE_IDLE_MAX`
seconds). Its answers hold at most :attr:`Limits.max_answer_bytes` of body, decoded: a longer
one (a page of megabytes per result, a body that never ends, a gzip bomb from a gateway) is
refused as it comes, an :class:`AnswerTooLargeError` mapped like a dropped connection (a read
asked again, a write of unknown fate), so that no answer can exhaust the memory.

:func:`connect_failure` maps a connection that could not be made to the exception tree: a
certificate the trust store refuses, or an ``https://`` address that does not speak TLS,
is a :class:`~._exceptions.TLSError` (retrying cannot help: the run stops at once and says what
to set); a proxy that wants credentials is a configuration error; anything else is a
:class:`~._exceptions.ConnectError`, retried like an outage (nothing reached the service).
:func:`unanswered` maps a request sent and never answered (a timeout, a dropped connection);
:func:`tls_instead` makes one an ``http://`` address dropped a :class:`~._exceptions.TLSError`
when that address speaks only TLS, and an ``https://`` one dropped when it wants a client
certificate (:mod:`._tls_probes`).
"""

from __future__ import annotations

import functools
import zlib

from . import _exceptions as exc
from ._config import Limits, Timeout
from ._proxies import ProxyRoute, proxy_wants_credentials
from ._tls import certificate_problem, deferred_trust_store
from ._tls_probes import speaks_tls, wants_client_certificate
from ._tunnels import connection_marks

# aiohttp's default SSL contexts load the CA bundle when they are first used, not at import.
with deferred_trust_store():
    import aiohttp

__all__ = [
    "NOT_MADE",
    "STALL_SLACK",
    "WRITE_IDLE_MAX",
    "AnswerTooLargeError",
    "connect_failure",
    "deadline",
    "drop_sessions",
    "new_session",
    "session_pair",
    "tls_instead",
    "unanswered",
    "unreadable_answer",
]

#: A write (POST, PUT) goes only on a connection idle for at most this many seconds: below the
#: idle timeout of every common server and gateway (uvicorn 5 s, gunicorn 2 s), which may close
#: a connection just as a request is sent on it; a write so lost is of unknown fate.
WRITE_IDLE_MAX = 1.0
#: A request whose deadline fired this many seconds later than it was due was stalled: this
#: process was not running meanwhile. aiohttp rounds a deadline of 5 s or more up to its loop
#: clock's next whole second (up to 1 s late by design); a busy event loop adds less than the
#: second more.
STALL_SLACK = 2.0
#: The longest header line (a field with its value) an answer may hold: aiohttp's default
#: (8,190 bytes) refuses a gateway's long Content-Security-Policy or cookie, every answer then
#: unreadable; curl takes 100 KiB.
MAX_HEADER_BYTES = 64 << 10
#: aiohttp's errors of a connection to the service (or its proxy) not made: nothing was sent.
NOT_MADE = (
    aiohttp.ClientConnectorError,
    aiohttp.ClientHttpProxyError,
    aiohttp.ConnectionTimeoutError,  # (none made within timeout.connect)
)
#: What a connection ended by the server in its TLS handshake may mean.
_HANDSHAKE_ENDED = (
    "ended by the server in the TLS handshake (does it want another TLS version, or a client"
    " certificate, which this client does not send? a firewall refusing the name?)"
)
#: The reasons of an SSL error that says the address does not speak TLS (retrying cannot help).
_NOT_TLS = ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE")


def new_session(
    limits: Limits,
    total: float | None,
    connect: float | None,
    keepalive: float,
    user_agent: str,
    marked: bool = False,
) -> aiohttp.ClientSession:
    """A pool of connections to the service: one deadline per request (``total``), redirects
    and error statuses left to the caller; ``marked``: with :func:`~._tunnels.connection_marks`."""
    connector = aiohttp.TCPConnector(
        limit=limits.max_connections,
        limit_per_host=limits.max_connections,
        keepalive_timeout=keepalive,
        ttl_dns_cache=300,
    )
    # No skip_auto_headers: every request with a body names its Content-Type (HttpExchange.send),
    # a GET has none, so aiohttp adds none; given, it built a multidict of them and a copy of
    # the request's headers for every request (~11k instructions a page read).
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=total, sock_connect=connect),
        headers={"User-Agent": user_agent},
        raise_for_status=False,
        max_line_size=MAX_HEADER_BYTES,
        max_field_size=MAX_HEADER_BYTES,
        response_class=_bounded_response(limits.max_answer_bytes),
        trace_configs=[connection_marks()] if marked else None,
    )


def session_pair(
    limits: Limits, timeout: Timeout, user_agent: str, tunnelled: bool = False
) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
    """The pool of reads and the pool of writes (see :data:`WRITE_IDLE_MAX`); ``tunnelled``
    (an ``https://`` service through a proxy): their connections marked
    (:func:`~._tunnels.connection_marks`)."""
    total, connect, marked = deadline(timeout), timeout.connect, tunnelled
    reads = new_session(limits, total, connect, limits.keepalive_expiry, user_agent, marked)
    keepalive = min(limits.keepalive_expiry, WRITE_IDLE_MAX)
    writes = new_session(limits, total, connect, keepalive, user_agent, marked)
    # aiohttp sends a PUT again, silently, when a reused connection drops before the answer
    # (HTTP calls PUT idempotent). An append is not: its rows may be in the task already, and
    # only the exchange can say "the write may have been applied" (AmbiguousWriteError), so
    # that the engine reads the retry's refusals as such. Reads keep aiohttp's rule (a GET
    # sent again once). No public switch exists (aiohttp 3.14).
    if hasattr(writes, "_retry_connection"):
        writes._retry_connection = False
    return reads, writes


def drop_sessions(*sessions: aiohttp.ClientSession | None) -> None:
    """Close pools whose event loop is closed (a client used in each night's ``asyncio.run``:
    aiohttp binds a session to its loop). Closing one needs no loop then (its connector has
    nothing to wait for): it ends at its first step. Left to the garbage collector, each
    logged "Unclosed connector" at ERROR on asyncio's logger, every night; the connections'
    sockets, of the closed loop, are the collector's still (a ResourceWarning)."""
    for session in sessions:
        if session is None:
            continue
        closing = session.close()
        try:
            closing.send(None)
        except StopIteration:
            continue
        except Exception:  # (its close failed: the pool is let go as it is)
            pass
        else:
            closing.close()  # (it would wait: not with a closed loop)
        session.detach()


def deadline(timeout: Timeout) -> float | None:
    """The one deadline of a request: ``total``, else ``connect + read`` (None: no limit)."""
    if timeout.total is not None:
        return timeout.total
    if timeout.read is None:
        return None
    return timeout.read + (timeout.connect or 0.0)


class AnswerTooLargeError(aiohttp.ClientPayloadError):
    """An answer whose body (decoded) is longer than ``limits.max_answer_bytes``."""

    def __init__(self, limit: int) -> None:
        size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"
        super().__init__(
            f"answered more than {size}, the client's [client.limits] max_answer_bytes: refused"
        )


class _BoundedResponse(aiohttp.ClientResponse):
    """An answer whose :meth:`read` holds at most :attr:`max_bytes` of body, counted as it is
    decoded (a few KiB of gzip may inflate to gigabytes)."""

    max_bytes: int

    async def read(self) -> bytes:
        if self._body is None:
            length = self.content_length
            encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
            plain = encoding == "identity"
            if length is None or length > self.max_bytes or not plain:
                try:
                    self._body = await self._read_bounded(length if plain else None)
                    if encoding == "x-gzip":  # (gzip's old name: aiohttp leaves it encoded)
                        self._body = _gunzip(self._body, self.max_bytes)
                except BaseException:
                    self.close()
                    raise
        return await super().read()

    async def _read_bounded(self, length: int | None) -> bytes:
        limit = self.max_bytes
        if length is not None and length > limit:
            raise AnswerTooLargeError(limit)  # refused before a byte of it is read
        chunks: list[bytes] = []
        size = 0
        while chunk := await self.content.readany():
            size += len(chunk)
            if size > limit:
                raise AnswerTooLargeError(limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _gunzip(body: bytes, limit: int) -> bytes:
    """A body sent as ``Content-Encoding: x-gzip`` (RFC 9110: the same as gzip; some servers
    still name it so), decoded, at most ``limit`` bytes of it. Read as it came, every answer
    of such a server was "JSON is malformed" and the run stopped after its give-up budget."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        plain = inflate.decompress(body, limit + 1)
    except zlib.error as err:
        raise aiohttp.ClientPayloadError(f"an x-gzip body that is not gzip: {err}") from None
    if len(plain) > limit:
        raise AnswerTooLargeError(limit)
    if not inflate.eof:
        raise aiohttp.ClientPayloadError("an x-gzip body cut short")
    return plain


@functools.cache
def _bounded_response(max_bytes: int) -> type[aiohttp.ClientResponse]:
    """The response class of sessions whose answers hold at most ``max_bytes``."""
    return type("BoundedResponse", (_BoundedResponse,), {"max_bytes": max_bytes})


def connect_failure(
    err: aiohttp.ClientConnectorError
    | aiohttp.ClientHttpProxyError
    | aiohttp.ConnectionTimeoutError,
    method: str,
    path: str,
    shown_url: str,
    proxy: ProxyRoute | None,
    connect_timeout: float | None = None,
) -> exc.FashiontagError:
    """The error to raise for a connection to the service (or its proxy) not made."""
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        # Not made within timeout.connect (a firewall dropping the packets, an accept queue
        # full, a TLS handshake never answered): nothing was sent, a write neither. It was
        # "timed out; the write may or may not have been applied", of unknown fate.
        where = shown_url if proxy is None else f"{shown_url} through the proxy {proxy.shown}"
        within = f" within {connect_timeout:g} s" if connect_timeout is not None else ""
        return exc.ConnectError(
            f"{method} {path}: cannot connect to {where}: no connection made{within}"
            " (timeout.connect, [client.timeout]); nothing was sent",
            method=method,
            path=path,
        )
    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        return exc.TLSError(
            f"{method} {path or '/'}: {certificate_problem(err.certificate_error, shown_url)};"
            " nothing was sent",
            method=method,
            path=path,
        )
    if isinstance(err, aiohttp.ClientConnectorSSLError):
        reason = getattr(err.os_error, "reason", None) or ""
        if reason in _NOT_TLS:
            return exc.TLSError(
                f"{method} {path or '/'}: {shown_url} does not speak TLS (SSL: {reason}):"
                " is the service at http://, not https://? Nothing was sent",
                method=method,
                path=path,
            )
    if isinstance(err, aiohttp.ClientHttpProxyError):
        # The proxy refused the CONNECT of an https:// service: nothing reached the service.
        assert proxy is not None
        if err.status == 407:
            return proxy_wants_credentials(method, path, proxy)
        return exc.ConnectError(
            f"{method} {path}: the proxy {proxy.shown} refused to connect to"
            f" {shown_url}: HTTP {err.status} {err.message}",
            method=method,
            path=path,
        )
    reason = err.os_error.strerror or str(err.os_error) or type(err).__name__
    # (A proxy's name that does not resolve is no ClientProxyConnectionError: its host is.)
    if proxy is not None and (
        isinstance(err, aiohttp.ClientProxyConnectionError) or err.host == _host(proxy.url)
    ):
        where = f"the proxy {proxy.shown} for {shown_url}"
    else:
        where = shown_url
        if isinstance(err.os_error, ConnectionResetError) and shown_url.startswith("https:"):
            # (Its connection made: ended in the handshake, it said "ClientConnectorError".)
            reason = f"the connection was {_HANDSHAKE_ENDED}"
    return exc.ConnectError(
        f"{method} {path}: cannot connect to {where}: {reason}", method=method, path=path
    )


async def tls_instead(
    err: BaseException,
    method: str,
    path: str,
    base_url: str,
    shown_url: str,
    probes: dict[tuple[str, int], bool],
) -> exc.TLSError | None:
    """For a request to an ``http://`` service dropped unanswered (or answered with bytes that
    start no HTTP head): the error to raise instead when the address speaks TLS (a TLS server
    drops a plain HTTP request; retrying cannot help), else None; for an ``https://`` one
    dropped, when it wants a client certificate. The address is asked once (``probes``, by
    host and port)."""
    dropped = aiohttp.ServerDisconnectedError | aiohttp.ClientOSError  # (a reset: an OSError)
    if not isinstance(err, dropped | aiohttp.ClientResponseError):
        return None
    from yarl import URL

    url = URL(base_url)
    if url.scheme == "https" and url.host and isinstance(err, dropped):
        # (A TLS 1.3 server that wants a client certificate: its alert, a reset, every
        # request "failed: ClientOSError", retried for --give-up-after, then "unreachable".)
        where = (url.raw_host or url.host, url.port or 443)  # (a name as DNS has it)
        if where not in probes:
            probes[where] = await wants_client_certificate(*where)
        if not probes[where]:
            return None
        return exc.TLSError(
            f"{method} {path or '/'}: {shown_url} wants a TLS client certificate (mutual TLS),"
            " which this client does not send; nothing reached the service",
            method=method,
            path=path,
        )
    if url.scheme != "http" or not url.host or isinstance(err, aiohttp.ClientOSError):
        return None
    where = (url.host, url.port or 80)
    if where not in probes:
        probes[where] = await speaks_tls(*where)
    if not probes[where]:
        return None
    https = "https://" + shown_url.partition("://")[2]
    return exc.TLSError(
        f"{method} {path or '/'}: {shown_url} speaks TLS (it dropped a plain HTTP request"
        " unanswered):"
        f" give the base URL as {https}; nothing was sent",
        method=method,
        path=path,
    )


def _host(url: str) -> str | None:
    from yarl import URL  # (aiohttp's own)

    return URL(url).host


def unanswered(
    err: BaseException,
    method: str,
    path: str,
    *,
    write: bool,
    waited: float,
    limit: float | None,
    status: int | None = None,
    via: ProxyRoute | None = None,
) -> exc.TransportError:
    """The error of a request sent and not answered (``err``: aiohttp's error or a timeout)
    after ``waited`` seconds, with a deadline of ``limit``, ``via`` the proxy of an ``http://``
    service it was sent to (named: a hung proxy in ``HTTP_PROXY`` was "service not answering",
    never named); a write's is an
    :class:`~._exceptions.AmbiguousWriteError` (it may have been applied; it was, when its
    answer's head said ``status`` 2xx and its body could not be read: refused as too long, cut
    by a dropped connection, timed out). A timeout that
    fired more than :data:`STALL_SLACK` after the deadline is marked ``stalled``."""
    timed_out = isinstance(err, TimeoutError)
    what = "timed out" if timed_out else f"failed: {type(err).__name__}"
    # Past its deadline with its connection made: the service was reached, and did not answer
    # in time (a connection not made in time says nothing of the service's speed).
    late = timed_out and limit is not None and not isinstance(err, aiohttp.ConnectionTimeoutError)
    if late:
        what = f"timed out at its deadline of {limit:g} s"
    if isinstance(err, AnswerTooLargeError):
        what = str(err)
    elif isinstance(err, aiohttp.ClientResponseError):  # (the parser's: no raise_for_status)
        what = (
            f"answered a header line longer than {MAX_HEADER_BYTES >> 10} KiB: refused"
            if err.message.startswith("Got more than")
            else f"answered an unreadable HTTP head ({err.message[:100]})"
        )
    if via is not None:
        what += f" (sent through the proxy {via.shown})"
    error: exc.TransportError
    if write and status is not None and 200 <= status < 300:
        # Applied (its head said 2xx), its body unread (too long, cut by a dropped connection,
        # a timeout): its task is found by token, never created again.
        message = f"{method} {path}: HTTP {status} {what}; the write was applied"
        error = exc.AmbiguousWriteError(
            message, method=method, path=path, status=status, applied=True
        )
    elif write:
        message = f"{method} {path} {what}; the write may or may not have been applied"
        error = exc.AmbiguousWriteError(message, method=method, path=path)
        # However its wait ended (a timeout, a gateway dropping it at its own): the service
        # may still be at work on it. (Past the deadline, this process frozen: the deadline.)
        error.unanswered_for = waited if limit is None else min(waited, limit)
    else:
        cls = exc.TimeoutError_ if timed_out else exc.TransportError
        error = cls(f"{method} {path} {what}", method=method, path=path)
    error.stalled = timed_out and limit is not None and waited > limit + STALL_SLACK
    if late and not error.stalled:
        error.deadline = limit
    return error


def unreadable_answer(err: BaseException) -> str | None:
    """What the service was doing, for an error of an answer refused unread (longer than
    ``max_answer_bytes``, a header line too long, an HTTP head that is none): ``answering
    ...``; None for any other error."""
    cause = err.__cause__
    if isinstance(cause, AnswerTooLargeError):
        return "answering more than max_answer_bytes"
    if isinstance(cause, aiohttp.ClientResponseError):
        return "answering HTTP heads it cannot read"
    return None
