"""An ``https://`` service whose TLS handshake is answered with a reset: a server that speaks
only an old TLS version, one that wants a client certificate (TLS 1.2), a firewall that resets
connections to names it blocks. Found by a hunt; failed before its fix."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from fashiontag_pipeline.engine import run_pipeline

from .gateways import Pki, _tcp_serving, make_pki
from .helpers import ENV, TASKS_OF_1000, client_config, write_csv
from .test_deployments import one_line, run, run_cmd


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


@contextlib.contextmanager
def mutual_tls_server(pki: Pki) -> Iterator[str]:
    """An OpenSSL server (Python's ``ssl``, blocking, as nginx's is) that wants a client
    certificate its CA signed: it refuses every handshake without one, with the TLS 1.3
    alert, then closes the connection. Yields its ``https://`` URL."""
    context = pki.server_context()
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(pki.ca)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)  # (never reached: no client certificate)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


async def test_a_service_that_wants_a_client_certificate_stops_the_run_saying_so(
    tmp_path: Path,
) -> None:
    """A gateway that wants a client certificate (mutual TLS), over TLS 1.3: it says so after
    the client's handshake is over, in an alert, and resets the connection. Every request
    "failed: ClientOSError", each create of unknown fate and looked for, retried for the
    whole ``--give-up-after``, then "service unreachable ... the same command resumes once the
    service answers": it never will. The run stops at once, saying what the service wants."""
    pki = make_pki(tmp_path / "pki")
    manifest = write_csv(tmp_path / "m.csv", 20)
    env = {**ENV, "SSL_CERT_FILE": str(pki.ca)}
    with mutual_tls_server(pki) as url:
        out = tmp_path / "a.jsonl"
        args = run_cmd(out, str(manifest), base_url=url, extra=("--give-up-after", "30"))
        code, err, took = await run(args, env)
    assert code == 1 and took < 20, (took, err[-1500:])
    line = one_line(err)
    assert f"{url} wants a TLS client certificate" in line, line
    assert "unreachable" not in line and "ClientOSError" not in line, line
