"""An ``https://`` service through a proxy (``HTTPS_PROXY``): a request reaches the service
only once its connection is made through the proxy (its ``CONNECT`` answered, the TLS handshake
through the tunnel done), which aiohttp's connect timeout does not bound. A request that fails
before (:func:`connection_marks` says) sent nothing: :func:`tunnel_not_made` is its error, a
connection not made, named with the proxy (it was the request deadline's "service not
answering", a write of unknown fate)."""

from __future__ import annotations

from types import SimpleNamespace

from . import _exceptions as exc
from ._proxies import ProxyRoute
from ._tls import deferred_trust_store

# aiohttp's default SSL contexts load the CA bundle when they are first used, not at import.
with deferred_trust_store():
    import aiohttp

__all__ = ["connection_marks", "tunnel_not_made"]


def connection_marks() -> aiohttp.TraceConfig:
    """Marks a request's connection had (made, its proxy's CONNECT tunnel and TLS handshake
    included, or reused) in its ``trace_request_ctx`` (a ``[False]``): a request of an
    ``https://`` service through a proxy that ran out of time unmarked sent nothing. (Only
    then: aiohttp's connect timeout does not bound a CONNECT.)"""

    async def had(_: object, context: SimpleNamespace, __: object) -> None:
        context.trace_request_ctx[0] = True

    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(had)
    config.on_connection_reuseconn.append(had)
    return config


def tunnel_not_made(
    err: BaseException,
    method: str,
    path: str,
    shown_url: str,
    proxy: ProxyRoute,
    limit: float | None,
) -> exc.ConnectError:
    """The error of a request of an ``https://`` service through ``proxy`` that failed before
    its connection was made through it (a CONNECT never answered, dropped; a TLS handshake
    through the tunnel never answered): nothing reached the service."""
    if isinstance(err, TimeoutError) and limit is not None:
        what = f"no connection made through it within the request deadline of {limit:g} s"
    else:
        what = f"no connection made through it: {type(err).__name__}"
    return exc.ConnectError(
        f"{method} {path}: cannot connect to {shown_url} through the proxy {proxy.shown}:"
        f" {what}; nothing was sent",
        method=method,
        path=path,
    )
