"""systemd notify against a real AF_UNIX datagram socket bound by the test: messages, abstract
names, the watchdog interval and loop, and sends that never block when the socket is full."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.notify import SystemdNotifier

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs AF_UNIX")


@pytest.fixture
def receiver() -> Iterator[tuple[socket.socket, str]]:
    # A short folder: AF_UNIX paths are limited to ~108 bytes, pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="ftn-") as folder:
        path = str(Path(folder) / "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(5)
        try:
            yield sock, path
        finally:
            sock.close()


def test_messages_reach_a_path_socket(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    with SystemdNotifier({"NOTIFY_SOCKET": path}) as notifier:
        assert notifier.enabled
        assert notifier.ready()
        assert sock.recv(4096) == b"READY=1"
        assert notifier.ready("scanning /srv/inbox")
        assert sock.recv(4096) == b"READY=1\nSTATUS=scanning /srv/inbox"
        assert notifier.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert notifier.stopping()
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")
def test_abstract_socket_name() -> None:
    name = f"fashiontag-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        with SystemdNotifier({"NOTIFY_SOCKET": f"@{name}"}) as notifier:
            assert notifier.ready()
            assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog_interval is None
    notifier.close()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}
    assert SystemdNotifier(env).watchdog_interval == 15.0
    assert SystemdNotifier({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 15.0
    assert SystemdNotifier({**env, "WATCHDOG_PID": "1"}).watchdog_interval is None  # not ours
    assert SystemdNotifier({**env, "WATCHDOG_USEC": "junk"}).watchdog_interval is None


async def test_watchdog_loop_pings(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    sock.setblocking(False)
    with SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"}) as notifier:
        assert notifier.watchdog_interval == 0.01
        pings: list[bytes] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(notifier.run_watchdog)
                while len(pings) < 3:
                    await anyio.wait_readable(sock)
                    pings.append(sock.recv(4096))
                tg.cancel_scope.cancel()
        assert pings == [b"WATCHDOG=1"] * 3


async def test_watchdog_loop_returns_without_a_watchdog() -> None:
    with anyio.fail_after(5):
        await SystemdNotifier({"NOTIFY_SOCKET": "/nonexistent"}).run_watchdog()


def test_a_full_socket_drops_instead_of_blocking(receiver: tuple[socket.socket, str]) -> None:
    _sock, path = receiver  # never read: its queue fills up
    with SystemdNotifier({"NOTIFY_SOCKET": path}) as notifier:
        sent = [notifier.watchdog() for _ in range(5000)]  # bounded; a blocking send would hang
        assert sent[0] is True
        assert sent.count(False) > 0
        assert notifier.dropped == sent.count(False)


def test_a_vanished_socket_is_not_an_error(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    sock.close()
    os.unlink(path)
    with SystemdNotifier({"NOTIFY_SOCKET": path}) as notifier:
        assert notifier.stopping() is False
        assert notifier.dropped == 1
