"""``fashiontag daemon`` under systemd (``Type=notify``, ``WatchdogSec``), restarted with a
manifest in flight while the service does not answer (a reboot before the service is back, a
network not up yet): found by a hunt.

The start waited for the service to find the manifest's tasks again before it sent
``READY=1``, for as long as the service stayed down, and sent no ``WATCHDOG=1`` meanwhile: the
shipped unit's ``TimeoutStartSec=60s`` stopped it, and ``Restart=on-failure`` started it
again, a failed start a minute (``systemctl start`` failing, the unit "failed") until the
service answered. The same daemon with nothing in flight is ready at once, service or not.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service

from ..engine.helpers import dead_port
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(
    os.name != "posix" or not hasattr(socket, "AF_UNIX"), reason="signals, AF_UNIX"
)

N = 600


async def _messages(sock: socket.socket, want: set[str], timeout: float) -> list[str]:
    """Datagrams received on ``sock`` until each of ``want`` came (or ``timeout``)."""
    got: list[str] = []
    with anyio.move_on_after(timeout):
        while not want <= set(got):
            try:
                got += sock.recv(4096).decode().split("\n")
            except BlockingIOError:
                await anyio.sleep(0.05)
    return got


async def test_a_restart_with_a_manifest_in_flight_is_ready_while_the_service_is_down(
    tmp_path: Path,
) -> None:
    ids = [f"p{i}" for i in range(N)]
    name = f"ftn-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.setblocking(False)
    try:
        async with running_service(ServiceConfig(rate=300.0)) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
                await _until_sent(daemon, svc)
                assert await daemon.stop() == 0  # a drain: the manifest stays in flight
                assert (daemon.inbox / ".work" / "m.csv").exists()
                down = DaemonProcess(
                    tmp_path,
                    f"http://127.0.0.1:{dead_port()}",
                    env={"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "1000000"},
                ).start()
                try:
                    got = await _messages(sock, {"READY=1", "WATCHDOG=1"}, timeout=20)
                    assert "READY=1" in got, (got, down.tail(10))
                    assert "WATCHDOG=1" in got, (got, down.tail(10))
                    assert await down.stop() == 0, down.tail(10)
                finally:
                    down.ensure_dead()
                # The service back: the manifest ends, no row sent twice.
                daemon = DaemonProcess(tmp_path, svc.url).start()
                summary = await daemon.wait_summary("m", timeout=60)
                assert await daemon.stop() == 0
            finally:
                daemon.ensure_dead()
            assert svc.store.image_count == N
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        lines = read_lines(daemon.outbox / "m" / "results.jsonl")
        assert sorted(line["id"] for line in lines) == sorted(ids)
    finally:
        sock.close()


async def _until_sent(daemon: DaemonProcess, svc: RunningService) -> None:
    """Until every row is with the service (its tasks open: the service tags 300 rows/s)."""
    with anyio.fail_after(30):
        while svc.store.image_count < N:
            daemon.check_alive()
            await anyio.sleep(0.02)
