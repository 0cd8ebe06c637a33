"""A daemon whose service does not answer while it has nothing to send says so in its log."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import anyio
from aiohttp import web

from .helpers import DaemonProcess


async def test_an_idle_daemon_whose_service_never_answers_says_so(tmp_path: Path) -> None:
    """Started with a typo'd ``--base-url`` (nothing listens there) and no manifest yet: the
    log said "daemon started" and nothing more, for as long as no manifest came (``/readyz``
    alone said 503), a daemon that looked healthy to whoever started it. Now a warning names
    the address once the service has not answered for ``unreachable_after``, again while it
    lasts, and a line says when it answers; the daemon keeps running throughout."""
    config_file = tmp_path / "daemon.toml"
    config_file.write_text("[daemon]\nunreachable_after = 0.5\n")
    sock = socket.socket()  # bound, not listening: refused, until it serves below
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    base = f"http://user:s3cret@127.0.0.1:{port}"
    daemon = DaemonProcess(tmp_path, base, extra=["--config", str(config_file)]).start()
    try:
        await daemon.wait_ready_endpoint()

        def lines(word: str) -> list[str]:
            return [line for line in daemon.tail(200).splitlines() if word in line]

        with anyio.fail_after(20):
            while len(lines("has not answered")) < 2:
                daemon.check_alive()
                await anyio.sleep(0.1)
        first = lines("has not answered")[0]
        assert '"warning"' in first and f"127.0.0.1:{port}" in first, first
        assert "--base-url" in first and "s3cret" not in daemon.tail(200), first

        async def hello(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        try:
            started = time.monotonic()
            with anyio.fail_after(20):
                while not lines("answers now"):
                    daemon.check_alive()
                    await anyio.sleep(0.1)
            assert time.monotonic() - started < 10
        finally:
            await runner.cleanup()
        assert await daemon.stop() == 0
    finally:
        daemon.ensure_dead()
        sock.close()
