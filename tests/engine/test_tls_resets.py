"""An ``https://`` service whose TLS handshake is answered with a reset: a server that speaks
only an old TLS version, one that wants a client certificate (TLS 1.2), a firewall that resets
connections to names it blocks. Found by a hunt; failed before its fix."""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from fashiontag_pipeline.engine import run_pipeline

from .gateways import _tcp_serving
from .helpers import TASKS_OF_1000, client_config, write_csv


def ends_at_hello(reset: bool) -> Callable[[anyio.abc.SocketStream], Awaitable[None]]:
    """A server that reads the client's first bytes (its ClientHello), then closes the
    connection (as a server refusing the TLS versions offered does, after its alert) or
    resets it (a firewall refusing the name asked for)."""

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            if reset:
                sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    return serve


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_tls_handshake_ended_by_the_server_is_named(tmp_path: Path, reset: bool) -> None:
    """The run stopped with "service unreachable for 2s: POST ...: cannot connect to
    https://...: ClientConnectorError" (a class of aiohttp's, nothing of what happened), or
    "Connection reset by peer". It says the connection ended in the TLS handshake, and what
    may cause it."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    async with _tcp_serving(ends_at_hello(reset)) as port:
        with anyio.fail_after(30), pytest.raises(Exception) as caught:
            await run_pipeline(
                [manifest],
                client=client_config(f"https://127.0.0.1:{port}"),
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=msgspec.structs.replace(TASKS_OF_1000, give_up_after=1.0),
            )
    message = str(caught.value)
    assert f"cannot connect to https://127.0.0.1:{port}" in message, message
    assert "ClientConnectorError" not in message, message
    assert "in the TLS handshake" in message, message
    assert "client certificate" in message and "TLS version" in message, message
