"""Image downloads of fetch mode: per-host connection limits, public addresses only, bounded size.

Every download of the reference analyzer (and of any subclass: a plugged-in model keeps the
guards) goes through an :class:`ImageFetcher`; the service gives it the ``serve`` options and
decodes in its :class:`~.decoding.DecodePool`.

* At most ``per_host`` downloads from one host at once, so requests to a slow host queue
  behind each other instead of filling the pool for every host; a download's timeout starts
  when it leaves that queue (aiohttp's ``limit_per_host`` also bounds redirect targets).
* Loopback, private, link-local and other non-global addresses are refused, whether the URL
  names them or its host name resolves to them (checked at connection time, on every redirect),
  unless ``allow_private`` (tests serve images from 127.0.0.1). A refused URL fails with 803
  and says nothing of what is behind it.
* A page answered 200 (text, HTML, JSON, XML) fails with 803; any other body, whatever its
  ``Content-Type`` (``binary/octet-stream`` from S3), is decoded and fails only if it is no image.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator

import aiohttp
import anyio
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from .pixels import CODE_FETCH_FAILED, CODE_FILE_TOO_LARGE, MAX_IMAGE_BYTES, ImageRejected

__all__ = [
    "DEFAULT_FETCH_PER_HOST",
    "FETCH_TIMEOUT",
    "ImageFetcher",
    "PublicOnlyResolver",
    "is_public_address",
]

#: Seconds a download may take, redirects included.
FETCH_TIMEOUT = 15.0
#: Connections to one image host at once (``serve --fetch-per-host``).
DEFAULT_FETCH_PER_HOST = 8
MAX_REDIRECTS = 5
#: Connections to all image hosts at once (single mode and the bulk worker together).
MAX_FETCH_CONNECTIONS = 100
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_PAGE_SUBTYPES = ("html", "json", "xml", "javascript", "ecmascript")
_REFUSED = "image URL host is not a public address (loopback and private hosts are refused)"


def is_public_address(address: str) -> bool:
    """Whether ``address`` (an IP literal) is a global unicast address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _is_page(content_type: str) -> bool:
    """Whether a body of ``content_type`` is a page (an error or login page answered 200): text,
    HTML, JSON, XML, script. Any other type is left to the decoder, which reads the bytes: S3
    serves an object stored without a type as ``binary/octet-stream``, others send
    ``application/binary``."""
    major, _, minor = content_type.split(";", 1)[0].strip().lower().partition("/")
    if major == "image":
        return False
    return major == "text" or minor.endswith(_PAGE_SUBTYPES)


class _NonPublicHost(OSError):
    """Every address of the host is refused."""


class PublicOnlyResolver(AbstractResolver):
    """aiohttp's default resolver, keeping only public addresses."""

    def __init__(self) -> None:
        self._inner = aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        public = [r for r in found if is_public_address(r["host"])]
        if not public:
            raise _NonPublicHost(_REFUSED)
        return public

    async def close(self) -> None:
        await self._inner.close()


class _HostSlots:
    """At most ``per_host`` downloads per host (``host:port`` of the image URL) at once,
    waited for before a download's timeout starts: a download queued behind a slow host's
    others is not timed out before it is even asked for. Hosts nobody waits for are dropped
    (a long-lived service meets any number of hosts)."""

    def __init__(self, per_host: int) -> None:
        self._per_host = per_host
        self._slots: dict[str, tuple[anyio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, url: URL) -> AsyncIterator[None]:
        host = f"{(url.host or '').lower()}:{url.port}"
        semaphore, users = self._slots.get(host) or (anyio.Semaphore(self._per_host), 0)
        self._slots[host] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._slots[host]
            if users == 1:
                del self._slots[host]
            else:
                self._slots[host] = (semaphore, users - 1)


class ImageFetcher:
    """Downloads image bytes (see the module docstring); :class:`ImageRejected` on failure."""

    def __init__(
        self,
        *,
        per_host: int,
        allow_private: bool = False,
        timeout: float = FETCH_TIMEOUT,
        max_bytes: int = MAX_IMAGE_BYTES,
    ) -> None:
        self._per_host = per_host
        self._allow_private = allow_private
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None
        self._hosts = _HostSlots(per_host)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=MAX_FETCH_CONNECTIONS,
                limit_per_host=self._per_host,
                resolver=None if self._allow_private else PublicOnlyResolver(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                headers={"User-Agent": "fashiontag-reference-service/0.1"},
            )
        return self._session

    def _check(self, url: URL) -> None:
        if url.scheme not in ("http", "https") or not url.host:
            raise ImageRejected(CODE_FETCH_FAILED, "image URL must be http(s) with a host")
        if self._allow_private:
            return
        host = url.host.strip("[]")
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: the resolver checks its addresses
        if not is_public_address(host):
            raise ImageRejected(CODE_FETCH_FAILED, _REFUSED)

    async def download(self, url: str) -> bytes:
        session = self._open()
        try:
            # (yarl refuses a port out of range, a broken IPv6 bracket: a URL that cannot be
            # fetched, not a failure of the service.)
            target = URL(url)
        except ValueError as err:
            raise ImageRejected(CODE_FETCH_FAILED, f"image URL is not a valid URL: {err}") from None
        self._check(target)
        try:
            async with self._hosts.hold(target):
                with anyio.fail_after(self._timeout):
                    for _ in range(MAX_REDIRECTS + 1):
                        self._check(target)
                        async with session.get(target, allow_redirects=False) as resp:
                            location = resp.headers.get("Location")
                            if resp.status in _REDIRECTS and location:
                                target = resp.url.join(URL(location))
                                continue
                            return await self._body(resp)
        except ImageRejected:
            raise
        except TimeoutError:
            raise ImageRejected(CODE_FETCH_FAILED, "image URL timed out") from None
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, _NonPublicHost):
                raise ImageRejected(CODE_FETCH_FAILED, _REFUSED) from None
            raise ImageRejected(
                CODE_FETCH_FAILED, f"image URL could not be fetched: {type(err).__name__}"
            ) from None
        except (aiohttp.ClientError, ValueError, OSError) as err:
            raise ImageRejected(
                CODE_FETCH_FAILED, f"image URL could not be fetched: {type(err).__name__}"
            ) from None
        raise ImageRejected(CODE_FETCH_FAILED, f"image URL redirected more than {MAX_REDIRECTS}")

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        if resp.status != 200:
            raise ImageRejected(CODE_FETCH_FAILED, f"image URL answered HTTP {resp.status}")
        ctype = resp.headers.get("Content-Type", "")
        if _is_page(ctype):
            raise ImageRejected(
                CODE_FETCH_FAILED, f"image URL returned {ctype.split(';')[0][:64]}, not an image"
            )
        if (resp.content_length or 0) > self._max_bytes:
            raise ImageRejected(CODE_FILE_TOO_LARGE, "image file is too large")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(65536):
            size += len(chunk)
            if size > self._max_bytes:
                raise ImageRejected(CODE_FILE_TOO_LARGE, "image file is too large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True):
                await session.close()
