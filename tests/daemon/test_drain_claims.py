"""A manifest dropped while the daemon drains (SIGTERM with writes in flight) is not claimed:
"stop claiming and reading" (docs/daemon.md). It stays in the inbox, untouched, and the next
start claims and tags it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, faults, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_a_manifest_dropped_while_draining_stays_in_the_inbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the claim loop went on scanning during the drain: a file ready then was claimed
    (moved to .work/, a job of the engine, "manifest claimed" logged after "draining: no more
    claims"), tens of milliseconds after the signal."""
    slow = [1.0]  # every request of the service takes this long (0 after the drain)
    monkeypatch.setattr(faults.FaultDice, "latency", lambda self: slow[0])
    spec = faults.FaultSpec(latency=1.0, latency_seconds=1.0)  # writes in flight: a drain
    async with running_service(ServiceConfig(faults=spec)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ["p0", "p1"]))
            with anyio.fail_after(20):
                while not any(e["event"] == "manifest claimed" for e in daemon.logs()):
                    daemon.check_alive()
                    await anyio.sleep(0.02)
            daemon.signal(signal.SIGTERM)
            with anyio.fail_after(20):
                while not any(e["event"].startswith("draining") for e in daemon.logs()):
                    daemon.check_alive()
                    await anyio.sleep(0.01)
            drop_atomic(daemon.inbox, "b.csv", write_manifest(Path(), ["q0"], url_tag="b"))
            (daemon.inbox / "b.csv.ready").write_bytes(b"")
            assert await daemon.wait_exit(timeout=30) == 0, daemon.tail()
            claimed = [e["manifest"] for e in daemon.logs() if e["event"] == "manifest claimed"]
            assert claimed == ["a.csv"], daemon.tail()
            assert (daemon.inbox / "b.csv").exists() and not (
                daemon.inbox / ".work" / "b.csv"
            ).exists()
            slow[0] = 0.0
            daemon = DaemonProcess(tmp_path, svc.url).start()
            summary = await daemon.wait_summary("b", timeout=30)
            assert summary["status"] == "done" and summary["tagged"] == 1, summary
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
