"""The daemon's monitoring endpoints facing careless or hostile clients, and /readyz telling
the truth while the daemon has nothing to do.

Real processes on 127.0.0.1: the reference service in this process, the daemon as a subprocess
(``DaemonProcess``). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc, prlimit")


async def _connect_many(port: int, n: int, stack: contextlib.AsyncExitStack) -> int:
    """Open up to ``n`` connections to ``port`` that never send a byte (bounded in time)."""
    opened = 0
    with anyio.move_on_after(10):
        for _ in range(n):
            try:
                with anyio.fail_after(1):
                    stream = await anyio.connect_tcp("127.0.0.1", port)
            except (OSError, TimeoutError):
                continue
            await stack.enter_async_context(stream)
            opened += 1
    return opened


async def test_idle_connections_to_the_monitoring_port_do_not_starve_the_daemon(
    tmp_path: Path,
) -> None:
    """A client opens connections to ``--listen`` and never sends on them (a slowloris, or a
    scraper that leaks its connections). The monitoring server must bound what they cost: the
    daemon's descriptors are for its manifests, outputs, state and service connections.
    Before, every such connection was kept (aiohttp's keep-alive: an hour, no limit on their
    number): at the process's descriptor limit the inbox scan failed with EMFILE and the
    daemon exited 1 ("Too many open files"), its manifests untagged until restarted, and the
    client could do it again at once."""
    ids = [f"a{i}" for i in range(50)]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            assert daemon.proc is not None
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            # The daemon's own needs are ~30 descriptors; 256 leaves it room for 200 more.
            resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE, (256, hard))
            async with contextlib.AsyncExitStack() as stack:
                opened = await _connect_many(daemon.listen_port, 600, stack)
                await anyio.sleep(0.5)
                daemon.check_alive()
                held = len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))
                drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ids))
                summary = await daemon.wait_summary("a", timeout=15)
                with anyio.fail_after(5):
                    live, _ = await daemon.get("/livez")
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert opened >= 300, opened
    assert held < 200, f"the daemon holds {held} descriptors for {opened} idle connections"
    assert summary["status"] == "done"
    assert live == 200
    assert sorted(r["id"] for r in read_lines(daemon.outbox / "a" / "results.jsonl")) == sorted(ids)


async def _readyz(daemon: DaemonProcess) -> tuple[int, str]:
    code, body = await daemon.get("/readyz")
    return code, json.loads(body).get("reason", "")


async def test_readyz_is_200_for_an_idle_daemon_whose_service_answers(tmp_path: Path) -> None:
    """A daemon started on an empty inbox, its service up: it is ready for work (DESIGN 6:
    200 when the state store is writable and the service answers). Before, /readyz said 503
    "service has not answered yet" for as long as no manifest came (the daemon only learned
    of the service from its own traffic): a readiness gate never opened on a quiet night, and
    an alert on "not ready" fired for a healthy daemon."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            seen: list[tuple[int, str]] = []
            with anyio.move_on_after(12):
                while True:
                    daemon.check_alive()
                    seen.append(await _readyz(daemon))
                    if seen[-1][0] == 200:
                        break
                    await anyio.sleep(0.2)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert seen and seen[-1][0] == 200, seen[-3:]


async def test_readyz_turns_503_when_the_service_goes_down_while_the_daemon_is_idle(
    tmp_path: Path,
) -> None:
    """The service stops while the daemon has nothing in flight. /readyz must say so once the
    service has been unreachable for ``unreachable_after`` (1 s here). Before, it said 200
    for ever: nothing was sent, so nothing failed, and the daemon looked ready while every
    manifest dropped would wait on a dead service."""
    config_file = tmp_path / "daemon.toml"
    config_file.write_text("[daemon]\nunreachable_after = 1.0\n")
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--config", str(config_file)]).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ["a1", "a2"]))
            await daemon.wait_summary("a", timeout=20)
            before = await _readyz(daemon)
        except BaseException:
            daemon.ensure_dead()
            raise
    try:
        seen: list[tuple[int, str]] = []
        with anyio.move_on_after(12):
            while True:
                daemon.check_alive()
                seen.append(await _readyz(daemon))
                if seen[-1][0] == 503:
                    break
                await anyio.sleep(0.2)
        assert await daemon.stop() == 0
    finally:
        daemon.ensure_dead()
    assert before[0] == 200, before
    assert seen and seen[-1][0] == 503 and "unreachable" in seen[-1][1], seen[-3:]
