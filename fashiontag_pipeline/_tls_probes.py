"""What an address answers to a TLS handshake, asked once when the service dropped a request
unanswered: whether an ``http://`` address speaks only TLS (:func:`speaks_tls`), whether an
``https://`` one wants a client certificate (:func:`wants_client_certificate`). Either is no
outage (retrying cannot help); :func:`~._connect.tls_instead` says so."""

from __future__ import annotations

import socket
import ssl

import anyio
import anyio.to_thread

__all__ = ["speaks_tls", "wants_client_certificate"]

#: The reason of the alert a TLS 1.3 server sends when it wants a client certificate.
_CERTIFICATE_REQUIRED = "TLSV13_ALERT_CERTIFICATE_REQUIRED"


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def speaks_tls(host: str, port: int) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate not looked at)."""
    try:
        with anyio.fail_after(5):
            stream = await anyio.connect_tcp(host, port, ssl_context=_unverified())
    except Exception:  # (refused, reset, a handshake error, a timeout: no TLS service)
        return False
    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
        await stream.aclose()
    return True


async def wants_client_certificate(host: str, port: int) -> bool:
    """Whether ``host:port`` refuses a TLS handshake without a client certificate. Over TLS
    1.3 the client's handshake is over before the server looks at the certificate: its
    refusal is an alert that the first read meets (aiohttp's: a "server disconnected")."""
    return await anyio.to_thread.run_sync(_asks_certificate, host, port, abandon_on_cancel=True)


def _asks_certificate(host: str, port: int) -> bool:
    try:
        with (
            socket.create_connection((host, port), timeout=3) as raw,
            _unverified().wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.recv(1)  # (a server that wants nothing more waits for a request: 3 s)
    except ssl.SSLError as err:
        return err.reason == _CERTIFICATE_REQUIRED
    except (OSError, ValueError):  # (refused, reset, a timeout)
        return False
    return False
