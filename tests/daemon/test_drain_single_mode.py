"""SIGTERM with single-mode rows (local files, ``data:`` URIs) queued and in flight: the daemon
stops starting them, lets the requests in flight end within ``--drain-timeout``, exits 0, and
the next start tags the rest, each once (DESIGN 6: "exit 0 within --drain-timeout")."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline.service import ServiceConfig, faults, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines


async def test_sigterm_with_single_mode_rows_queued_exits_within_the_drain_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the daemon's kill -9/SIGTERM fuzz: the drain waited for the bulk writer only;
    the single-mode router went on starting its queued rows (each a request of the slow
    service) long past the drain timeout, and the daemon did not exit."""
    picture = tmp_path / "red.png"
    canvas = PILImage.new("RGB", (64, 64), (250, 250, 250))
    canvas.paste((200, 20, 30), (10, 10, 50, 50))
    canvas.save(picture)
    ids = [f"s{i}" for i in range(200)]
    manifest = ("id,url\n" + "".join(f"{i},{picture}\n" for i in ids)).encode()
    slow = [1.0]  # every request of the service takes this long (0 after the drain)
    monkeypatch.setattr(faults.FaultDice, "latency", lambda self: slow[0])
    spec = faults.FaultSpec(latency=1.0, latency_seconds=1.0)
    async with running_service(ServiceConfig(faults=spec)) as svc:
        extra = ["--drain-timeout", "2", "--single-concurrency", "4"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", manifest)
            with anyio.fail_after(60):
                while len(read_lines(daemon.outbox / "m" / "results.jsonl")) < 4:
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            daemon.signal(signal.SIGTERM)
            started = time.monotonic()
            code = await daemon.wait_exit(timeout=60)
            took = time.monotonic() - started
            assert code == 0, daemon.tail()
            # The drain timeout (2 s), the requests in flight (1 s each), the wind-down.
            assert took < 6, f"exited {took:.1f} s after SIGTERM (drain timeout 2 s)"
            slow[0] = 0.0
            daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["single"] == len(ids)
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(ids)
